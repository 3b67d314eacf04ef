//! broker_bench's async MCP clients on the agents' sockets, for the HTTP
//! lines (issue 41) and the line protocol beside them under the same
//! loads. Over HTTP each agent has an initialized session of its own on a
//! keep-alive HTTP/1.1 connection of its own (what the sandbox's bridge
//! carries from 127.0.0.1:3130), hyper's client over a tokio UnixStream;
//! each answer is read from its SSE body. Every answer is checked to be
//! check_inbox's result, not an error.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const ACCEPT: &str = "application/json, text/event-stream";
const PROTOCOL: &str = "2025-06-18";

/// What the agents speak.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    Http,
    Lines,
}

/// One agent's MCP client.
pub enum Agent {
    Http {
        sender: SendRequest<Full<Bytes>>,
        session: String,
        id: u64,
    },
    Lines {
        stream: BufReader<UnixStream>,
        line: String,
        id: u64,
    },
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
}

const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

fn check_inbox_call(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"check_inbox","arguments":{{}}}}}}"#
    )
}

/// `answer` is check_inbox's result for call `id`.
fn check_answer(answer: &Value, id: u64) {
    assert_eq!(answer["id"], id, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(answer["result"]["content"].is_array(), "{answer}");
}

impl Agent {
    /// Connects to `socket`, initializes a session and says so.
    pub async fn connect(socket: &str, speaks: Speaks) -> Self {
        let stream = UnixStream::connect(socket).await.unwrap();
        if speaks == Speaks::Lines {
            let mut stream = BufReader::new(stream);
            let hello = format!("{}\n{INITIALIZED}\n", initialize());
            stream.get_mut().write_all(hello.as_bytes()).await.unwrap();
            let mut line = String::new();
            stream.read_line(&mut line).await.unwrap();
            let answer: Value = serde_json::from_str(&line).unwrap();
            assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
            return Agent::Lines {
                stream,
                line,
                id: 0,
            };
        }
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut sender = sender;
        let (status, session, body) = post(&mut sender, None, &initialize().to_string()).await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        let session = session.expect("initialize answered without a session id");
        let answer = sse_message(&body);
        assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
        let (status, _, _) = post(&mut sender, Some(&session), INITIALIZED).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        Agent::Http {
            sender,
            session,
            id: 0,
        }
    }

    /// One check_inbox, answered with its result (not an error).
    pub async fn check_inbox(&mut self) {
        match self {
            Agent::Http {
                sender,
                session,
                id,
            } => {
                *id += 1;
                let (status, _, body) = post(sender, Some(session), &check_inbox_call(*id)).await;
                assert_eq!(status, StatusCode::OK, "{body:?}");
                check_answer(&sse_message(&body), *id);
            }
            Agent::Lines { stream, line, id } => {
                *id += 1;
                let mut call = check_inbox_call(*id);
                call.push('\n');
                stream.get_mut().write_all(call.as_bytes()).await.unwrap();
                line.clear();
                stream.read_line(line).await.unwrap();
                check_answer(&serde_json::from_str(line).unwrap(), *id);
            }
        }
    }
}

/// One POST to /mcp; its status, session header and whole body.
async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    session: Option<&str>,
    body: &str,
) -> (StatusCode, Option<String>, Bytes) {
    let mut request = Request::post("/mcp")
        .header(hyper::header::HOST, "127.0.0.1:3130")
        .header(hyper::header::ACCEPT, ACCEPT)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header("mcp-protocol-version", PROTOCOL);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, session, body)
}

/// The one JSON-RPC message of an SSE body (events without data, such as
/// the priming event, skipped).
fn sse_message(body: &[u8]) -> Value {
    let text = std::str::from_utf8(body).unwrap();
    let mut messages = text.split("\n\n").filter_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        let data = data.join("\n");
        (!data.trim().is_empty()).then(|| serde_json::from_str::<Value>(&data).unwrap())
    });
    let message = messages
        .next()
        .unwrap_or_else(|| panic!("no message in {text:?}"));
    assert!(
        messages.next().is_none(),
        "more than one message in {text:?}"
    );
    message
}

/// The sockets' agents, connected and initialized, each called once.
pub async fn connect_all(sockets: &[String], speaks: Speaks) -> Vec<Agent> {
    let mut agents = Vec::with_capacity(sockets.len());
    for socket in sockets {
        let mut agent = Agent::connect(socket, speaks).await;
        agent.check_inbox().await; // warm: the session's first call
        agents.push(agent);
    }
    agents
}

/// Closed loop: every agent calls again as soon as answered, `calls_each`
/// times. The round trips, sorted, and the time the whole took.
pub async fn closed_loop(agents: Vec<Agent>, calls_each: usize) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let tasks: Vec<_> = agents
        .into_iter()
        .map(|mut agent| {
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(calls_each);
                for _ in 0..calls_each {
                    let t = Instant::now();
                    agent.check_inbox().await;
                    times.push(t.elapsed());
                }
                times
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let elapsed = start.elapsed();
    all.sort();
    (all, elapsed)
}

/// What an open-loop run measured.
pub struct OpenLoop {
    /// Each call from when it was due (or sent, if sent on time), sorted.
    pub times: Vec<Duration>,
    pub elapsed: Duration,
    /// Calls due while the agent's previous call was still out.
    pub late: usize,
}

/// Open loop: each agent calls every `agents / rate` seconds for
/// `length`, whatever the answers take (the agents' phases spread evenly
/// over the interval). A call that falls due while the agent's previous
/// one is out waits for it, and is timed from when it was due (no
/// coordinated omission); one sent on time is timed from its sending (not
/// from the client's timer, late by up to its 1 ms tick).
pub async fn open_loop(agents: Vec<Agent>, rate: f64, length: Duration) -> OpenLoop {
    let n = agents.len();
    let period = Duration::from_secs_f64(n as f64 / rate);
    let calls_each = (length.as_secs_f64() / period.as_secs_f64()).round() as usize;
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let tasks: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(i, mut agent)| {
            let phase = period.mul_f64(i as f64 / n as f64);
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval_at(start + phase, period);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut times = Vec::with_capacity(calls_each);
                let mut late = 0;
                let mut done = Instant::now();
                for _ in 0..calls_each {
                    let due = ticks.tick().await.into_std();
                    let t = if done > due {
                        late += 1;
                        due
                    } else {
                        Instant::now()
                    };
                    agent.check_inbox().await;
                    done = Instant::now();
                    times.push(done - t);
                }
                (times, late)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut late = 0;
    for task in tasks {
        let (times, l) = task.await.unwrap();
        all.extend(times);
        late += l;
    }
    let elapsed = start.elapsed();
    all.sort();
    OpenLoop {
        times: all,
        elapsed,
        late,
    }
}
