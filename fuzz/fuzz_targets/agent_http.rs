//! Arbitrary bytes as what the agent `lead` sends on one connection to its
//! socket in HTTP mode (MCP streamable HTTP: `AgentHttp::serve_connection`,
//! its door, rmcp's sessions, the broker, SQLite), over an in-process
//! stream. The first byte chooses: bit 0, the harness first makes a session
//! (a valid initialize, then notifications/initialized) and puts its id for
//! every `SESSION` in the rest; bit 1, it ends its side of the connection
//! after the rest (else the server's idle wait ends the input). Time is
//! virtual: an input gets 2 s of it, which pass only while all waits.
//! Invariants, not only "no panic":
//! - the output is well-formed HTTP/1.1 responses, one after another
//!   (status line, headers, a body by its length, chunked, or up to the
//!   close); only the last may be cut short, by the close;
//! - every answer comes from a session: an event stream that carries a
//!   message has event ids (rmcp's stateless path, a handler of its own
//!   outside the door's sessions and their limits, gives none);
//! - the agent never has more than `MAX_SESSIONS` live sessions;
//! - every message `w` receives comes from `lead`, the fuzzed agent (its
//!   async messages are read and checked after each input, the recent ones
//!   in its activity too);
//! - when the agent's endpoint ends, every task it started (sessions,
//!   streams) ends within a second: nothing an input makes outlives it.
#![no_main]

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use substrat_broker::agent_http::{AgentHttp, MAX_SESSIONS};
use substrat_broker::{Session, ToolOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

/// Virtual time an input gets, and then its endpoint's tasks to end.
const TIMEOUT: Duration = Duration::from_secs(2);
const END_TIMEOUT: Duration = Duration::from_secs(1);
const PLACEHOLDER: &[u8] = b"SESSION";

const HEADERS: &str = "Host: 127.0.0.1\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\n";
const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

struct State {
    fixture: Mutex<Shared>,
    /// AGENT_HTTP_DEBUG set: each input's output on stderr (to replay one).
    debug: bool,
}

/// The broker, which outlives inputs, and how many messages `w` had
/// queued after its inbox was last read.
struct Shared {
    fixture: common::Fixture,
    queued: u64,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| State {
        fixture: Mutex::new(Shared {
            fixture: common::fixture(),
            queued: 0,
        }),
        debug: std::env::var_os("AGENT_HTTP_DEBUG").is_some(),
    })
}

/// One response: its head, and its body (de-chunked; cut short when the
/// close cut it).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The responses in `out`, and whether the bytes end inside one (cut by
/// the close). Err: malformed. `head_requests`: the input may hold a HEAD
/// request, whose answer has a length but no body.
fn responses(out: &[u8], head_requests: bool) -> Result<(Vec<Answer>, bool), String> {
    let mut answers = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let rest = &out[at..];
        let Some(end) = find(rest, b"\r\n\r\n") else {
            // Cut inside a head: what there is must still be well-formed.
            check_partial_head(rest)?;
            return Ok((answers, true));
        };
        let mut answer = parse_head(&rest[..end + 2])?;
        let body = &rest[end + 4..];
        let chunked = match answer.header("transfer-encoding") {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("chunked") => true,
            Some(v) => return Err(format!("transfer-encoding {v:?}")),
        };
        let lengths = answer
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .count();
        let length = answer
            .header("content-length")
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| format!("content-length {v:?}"))
            })
            .transpose()?;
        if chunked && length.is_some() {
            return Err("both content-length and chunked".into());
        }
        if lengths > 1 {
            return Err("two content-lengths".into());
        }
        let status = answer.status;
        let used = if (100..200).contains(&status) || status == 204 || status == 304 {
            Some(0)
        } else if chunked {
            dechunk(body, &mut answer.body)?
        } else if let Some(n) = length {
            // A HEAD request's answer: the length, no body.
            if head_requests && (body.is_empty() || body.starts_with(b"HTTP/1.")) {
                Some(0)
            } else {
                answer.body.extend_from_slice(&body[..n.min(body.len())]);
                (body.len() >= n).then_some(n)
            }
        } else {
            // Delimited by the close: the rest is its body.
            answer.body.extend_from_slice(body);
            answers.push(answer);
            return Ok((answers, false));
        };
        answers.push(answer);
        let Some(used) = used else {
            return Ok((answers, true));
        };
        at += end + 4 + used;
    }
    Ok((answers, false))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(head: &[u8]) -> Result<Answer, String> {
    let text = std::str::from_utf8(head)
        .map_err(|_| format!("head not UTF-8: {:?}", String::from_utf8_lossy(head)))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = parse_status_line(status_line)?;
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("header line {line:?}"))?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!("header name {name:?}"));
        }
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(format!("header value {value:?}"));
        }
        headers.push((name.to_string(), value.trim().to_string()));
    }
    Ok(Answer {
        status,
        headers,
        body: Vec::new(),
    })
}

fn parse_status_line(line: &str) -> Result<u16, String> {
    let bad = || format!("status line {line:?}");
    let rest = line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 "))
        .ok_or_else(bad)?;
    let (code, reason) = rest.split_at_checked(3).ok_or_else(bad)?;
    if !code.bytes().all(|b| b.is_ascii_digit()) || !(reason.is_empty() || reason.starts_with(' '))
    {
        return Err(bad());
    }
    if reason
        .bytes()
        .any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(bad());
    }
    let code: u16 = code.parse().map_err(|_| bad())?;
    if !(100..=599).contains(&code) {
        return Err(bad());
    }
    Ok(code)
}

/// A head that the close cut: a prefix of a status line, then whole
/// header lines.
fn check_partial_head(rest: &[u8]) -> Result<(), String> {
    let prefix = b"HTTP/1.";
    let n = rest.len().min(prefix.len());
    if rest[..n] != prefix[..n] {
        return Err(format!(
            "not a response: {:?}",
            String::from_utf8_lossy(&rest[..rest.len().min(80)])
        ));
    }
    Ok(())
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The length of a chunked body at the start of `body`, or None when it
/// is cut short; its data into `data`.
fn dechunk(body: &[u8], data: &mut Vec<u8>) -> Result<Option<usize>, String> {
    let mut at = 0;
    loop {
        let Some(line_end) = find(&body[at..], b"\r\n") else {
            let rest = &body[at..];
            let partial = rest.iter().all(u8::is_ascii_hexdigit)
                || rest
                    .strip_suffix(b"\r")
                    .is_some_and(|r| r.iter().all(u8::is_ascii_hexdigit));
            return if partial {
                Ok(None)
            } else {
                Err(format!("chunk size {:?}", String::from_utf8_lossy(rest)))
            };
        };
        let size_text = std::str::from_utf8(&body[at..at + line_end]).map_err(|_| "chunk size")?;
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("chunk size {size_text:?}"))?;
        at += line_end + 2;
        if size == 0 {
            // No trailers: the empty line ends the body.
            return match body.get(at..at + 2) {
                Some(b"\r\n") => Ok(Some(at + 2)),
                Some(other) => Err(format!("after the last chunk: {other:?}")),
                None if body[at..].is_empty() || body[at..] == *b"\r" => Ok(None),
                None => Err("after the last chunk".into()),
            };
        }
        if body.len() < at + size + 2 {
            data.extend_from_slice(&body[at..(at + size).min(body.len())]);
            return Ok(None);
        }
        if &body[at + size..at + size + 2] != b"\r\n" {
            return Err("chunk without its CRLF".into());
        }
        data.extend_from_slice(&body[at..at + size]);
        at += size + 2;
    }
}

/// A JSON-RPC message in an event stream without event ids: not a
/// session's (rmcp primes a session's streams with an event id, and
/// numbers their events, to resume them; its stateless path, a handler
/// outside any session, does neither).
fn message_without_event_id(answer: &Answer) -> Option<String> {
    if answer.header("content-type") != Some("text/event-stream") {
        return None;
    }
    // The answer that made a session (initialize) names it; a session of
    // a revision before 2025-11-25 gets no priming event, and rmcp gives
    // the initialize answer no event id then.
    if answer.header("mcp-session-id").is_some() {
        return None;
    }
    let text = String::from_utf8_lossy(&answer.body);
    if text.lines().any(|l| l.starts_with("id:")) {
        return None;
    }
    text.lines()
        .find(|l| {
            l.strip_prefix("data:")
                .is_some_and(|d| !d.trim().is_empty())
        })
        .map(str::to_string)
}

fn post(session: Option<&str>, body: &str) -> Vec<u8> {
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /mcp HTTP/1.1\r\n{HEADERS}{session}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads until `out` holds `count` whole responses; their heads.
async fn read_responses(
    read: &mut ReadHalf<tokio::io::DuplexStream>,
    out: &mut Vec<u8>,
    count: usize,
) -> Vec<Answer> {
    let mut buf = [0u8; 4096];
    loop {
        let (heads, cut) =
            responses(out, false).expect("the answers to a valid session's start are well-formed");
        if heads.len() >= count && !(heads.len() == count && cut) {
            return heads;
        }
        let n = read.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "the server closed before answering a valid session's start: {}",
            String::from_utf8_lossy(out)
        );
        out.extend_from_slice(&buf[..n]);
    }
}

/// A valid initialize and notifications/initialized; the session's id.
async fn start_session(
    read: &mut ReadHalf<tokio::io::DuplexStream>,
    write: &mut WriteHalf<tokio::io::DuplexStream>,
    out: &mut Vec<u8>,
) -> String {
    write.write_all(&post(None, INIT)).await.expect("write");
    let heads = read_responses(read, out, 1).await;
    assert_eq!(heads[0].status, 200, "{}", String::from_utf8_lossy(out));
    let session = heads[0]
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    write
        .write_all(&post(Some(&session), INITIALIZED))
        .await
        .expect("write");
    let heads = read_responses(read, out, 2).await;
    assert_eq!(heads[1].status, 202, "{}", String::from_utf8_lossy(out));
    session
}

fn substitute(input: &[u8], session: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut at = 0;
    while at < input.len() {
        if input[at..].starts_with(PLACEHOLDER) {
            out.extend_from_slice(session.as_bytes());
            at += PLACEHOLDER.len();
        } else {
            out.push(input[at]);
            at += 1;
        }
    }
    out
}

/// Reads `w`'s async messages (and so empties its inbox); each comes from
/// `lead`. How many it read, or None when `w`'s own rate limit (the
/// fixture's 1,000 calls a minute, this target reaching more) says later.
fn check_inbox_of_w(fixture: &common::Fixture) -> Option<u64> {
    let mut session = Session::new(fixture.w_id.clone());
    let mut read = 0;
    loop {
        let outcome = fixture
            .broker
            .call_tool(&mut session, "check_inbox", json!({}));
        let ToolOutcome::Result { body, is_error } = outcome else {
            panic!("check_inbox answers with a result");
        };
        if body["status"] == "rate_limited" {
            return None;
        }
        assert!(!is_error, "{body}");
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        for m in &messages {
            assert_eq!(m["from"], "lead", "only the fuzzed agent speaks: {m}");
        }
        read += messages.len() as u64;
        if body.get("more_queued").is_none() || messages.is_empty() {
            return Some(read);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let (with_session, half_close) = (mode & 1 != 0, mode & 2 != 0);
    let head_requests = find(input, b"HEAD").is_some();
    let state = state();
    let mut shared = state.fixture.lock().unwrap_or_else(|e| e.into_inner());
    let (broker, lead_id) = (
        shared.fixture.broker.clone(),
        shared.fixture.lead_id.clone(),
    );
    // A runtime of its own per input, its clock virtual from now: rmcp's
    // SSE keep-alive sets its timer from the real clock, so a virtual
    // clock run ahead of it across inputs (15 s: a handful of idle ones)
    // would make that timer always due, a stream of pings that never lets
    // the runtime idle (nor time, nor the input, end).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (out, peak) = runtime.block_on(async {
        let http = Arc::new(AgentHttp::new(broker, lead_id));
        let (client, server) = tokio::io::duplex(1 << 16);
        let serving = tokio::spawn({
            let http = http.clone();
            async move { http.serve_connection(server).await }
        });
        let (mut read, mut write) = tokio::io::split(client);
        let mut out = Vec::new();
        let mut peak = 0;
        let run = async {
            let input = if with_session {
                let session = start_session(&mut read, &mut write, &mut out).await;
                substitute(input, &session)
            } else {
                input.to_vec()
            };
            let writer = async {
                let _ = write.write_all(&input).await;
                if half_close {
                    let _ = write.shutdown().await;
                }
                // Keeps the connection open until the reader is done.
                std::future::pending::<()>().await
            };
            let reader = async {
                let mut buf = [0u8; 8192];
                loop {
                    peak = peak.max(http.live_sessions().await);
                    match read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => out.extend_from_slice(&buf[..n]),
                    }
                }
            };
            tokio::select! {
                _ = writer => {}
                _ = reader => {}
            }
        };
        let _ = tokio::time::timeout(TIMEOUT, run).await;
        peak = peak.max(http.live_sessions().await);
        drop((read, write));
        // The agent's endpoint ends (its socket no longer served).
        http.end();
        let _ = serving.await;
        drop(http);
        let ended = tokio::time::timeout(END_TIMEOUT, async {
            while tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
                > 0
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert!(
            ended.is_ok(),
            "{alive} tasks outlive the agent's endpoint by a second"
        );
        (out, peak)
    });
    if state.debug {
        eprintln!(
            "{}\n-- {peak} live sessions at most",
            String::from_utf8_lossy(&out)
        );
    }
    let answers = match responses(&out, head_requests) {
        Ok((answers, _)) => answers,
        Err(why) => panic!(
            "malformed response ({why}) in: {:?}",
            String::from_utf8_lossy(&out)
        ),
    };
    for answer in &answers {
        if let Some(event) = message_without_event_id(answer) {
            panic!("an answer from outside any session: {event:?}");
        }
    }
    assert!(peak <= MAX_SESSIONS, "{peak} live sessions");
    let fixture = &shared.fixture;
    let w = fixture
        .broker
        .agent(&fixture.w_id)
        .expect("store")
        .expect("w exists");
    let activity = fixture.broker.activity(&w).expect("activity");
    for m in activity["recent_messages"].as_array().into_iter().flatten() {
        if m["direction"] == "in" {
            assert_eq!(
                m["counterpart"], "lead",
                "only the fuzzed agent speaks: {m}"
            );
        }
    }
    // Only when messages came: a call of w's own each input would be over
    // its rate limit within a minute.
    let mut queued = activity["queued_messages"].as_u64().unwrap_or(0);
    if queued > shared.queued
        && let Some(read) = check_inbox_of_w(fixture)
    {
        queued = queued.saturating_sub(read);
        shared.queued = queued;
    }
    // Sync messages are turns of w's that never run here: a full inbox
    // would refuse every later message, so the broker starts again.
    if queued >= u64::from(common::INBOX_DEPTH) {
        shared.fixture = common::fixture();
        shared.queued = 0;
    }
});
