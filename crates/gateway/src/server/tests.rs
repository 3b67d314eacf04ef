//! The gateway between a client on an agent's socket and a model server on
//! loopback (both in this test), over real sockets.

use std::collections::{BTreeSet, HashMap};
use std::io::Read as _;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};

use super::*;
use crate::Usage;

pub(super) const REAL: &str = "sk-real-0123456789";

/// A model server answering every request with `answer` (an SSE stream)
/// after `delay`; each request's head is sent on the channel.
pub(super) async fn model_server(
    answer: &'static str,
    delay: Duration,
) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    model_server_with("content-type: text/event-stream\r\n", answer, delay).await
}

/// The same with the answer's own headers (each line ending in CRLF).
pub(super) async fn model_server_with(
    headers: &'static str,
    answer: &'static str,
    delay: Duration,
) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                let mut head = String::new();
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    head.push_str(&line);
                }
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).await.unwrap();
                head.push_str(&String::from_utf8_lossy(&body));
                tx.send(head).unwrap();
                tokio::time::sleep(delay).await;
                let out = format!("HTTP/1.1 200 OK\r\n{headers}connection: close\r\n\r\n{answer}");
                reader.get_mut().write_all(out.as_bytes()).await.unwrap();
            });
        }
    });
    (port, rx)
}

#[derive(Debug, Default)]
pub(super) struct Sink(
    pub Mutex<Vec<(String, Usage)>>,
    pub Mutex<Vec<(String, &'static str, &'static str)>>,
    pub Mutex<Vec<String>>,
);

impl UsageSink for Sink {
    fn model_refused(&self, agent_id: &str) {
        self.2.lock().unwrap().push(agent_id.to_string());
    }

    fn budget_refused(&self, agent_id: &str, refusal: &Refusal) {
        let (scope, limit) = crate::problems::refusal_labels(refusal);
        self.1
            .lock()
            .unwrap()
            .push((agent_id.to_string(), scope, limit));
    }

    fn record(&self, agent_id: &str, _api: Api, usage: &Usage) {
        self.0
            .lock()
            .unwrap()
            .push((agent_id.to_string(), usage.clone()));
    }
}

pub(super) struct Setup {
    pub gateway: Arc<Gateway>,
    pub dir: tempfile::TempDir,
    pub audit: std::path::PathBuf,
    pub sink: Arc<Sink>,
}

pub(super) fn setup(port: u16, team: Budget) -> Setup {
    setup_with(port, team, body::SpoolConfig::default())
}

pub(super) fn setup_with(port: u16, team: Budget, spool: body::SpoolConfig) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("gateway.log");
    let file = std::fs::File::create(&audit).unwrap();
    let upstream = Upstream::new(
        Api::Anthropic,
        &format!("http://127.0.0.1:{port}"),
        Secret::new(REAL.into()),
        &[],
    )
    .unwrap();
    let openai = Upstream::new(
        Api::OpenAi,
        &format!("http://127.0.0.1:{port}"),
        Secret::new(REAL.into()),
        &[],
    )
    .unwrap();
    let gemini = Upstream::new(
        Api::Gemini,
        &format!("http://127.0.0.1:{port}"),
        Secret::new(REAL.into()),
        &[],
    )
    .unwrap();
    let config = GatewayConfig {
        upstreams: HashMap::from([
            (Api::Anthropic, upstream),
            (Api::OpenAi, openai),
            (Api::Gemini, gemini),
        ]),
        team,
        spool,
    };
    let sink = Arc::new(Sink::default());
    let gateway = Gateway::new(config, Box::new(file), Some(sink.clone())).unwrap();
    Setup {
        gateway: Arc::new(gateway),
        dir,
        audit,
        sink,
    }
}

/// Model access to the Anthropic API with `budget`, no hosted tools.
pub(super) fn anthropic(budget: Budget) -> ModelAccess {
    ModelAccess {
        api: Api::Anthropic,
        budget,
        hosted_tools: BTreeSet::new(),
        models: None,
    }
}

impl Setup {
    /// The agent's socket, served.
    pub fn serve(&self, agent: &str) -> std::path::PathBuf {
        let socket = self.dir.path().join(format!("{agent}.sock"));
        let listener = UnixListener::bind(&socket).unwrap();
        tokio::spawn(
            self.gateway
                .clone()
                .serve_agent(listener, agent.to_string()),
        );
        socket
    }

    pub fn audit_lines(&self) -> Vec<serde_json::Value> {
        let mut text = String::new();
        std::fs::File::open(&self.audit)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

pub(super) const BODY: &str =
    r#"{"model":"claude-test","max_tokens":100,"stream":true,"messages":[]}"#;

/// One HTTP/1.1 request on the socket; the whole answer.
pub(super) async fn ask(socket: &std::path::Path, key: &str, path: &str) -> String {
    ask_with(socket, key, &format!("POST {path}"), "", BODY).await
}

/// One request with its method and path (`line`), extra header lines
/// (each ending in CRLF) and body.
pub(super) async fn ask_with(
    socket: &std::path::Path,
    key: &str,
    line: &str,
    headers: &str,
    body: &str,
) -> String {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let request = format!(
        "{line} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {key}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

pub(super) const SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_key_goes_upstream_and_the_placeholder_never_does() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let placeholder = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let answer = ask(&socket, &placeholder, "/v1/messages").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("\"output_tokens\":7"),
        "streamed through: {answer}"
    );
    let head = seen.recv().await.unwrap();
    assert!(head.contains(&format!("x-api-key: {REAL}")), "{head}");
    assert!(!head.contains(&placeholder), "{head}");
    assert!(head.contains("anthropic-version: 2023-06-01"), "{head}");
    let lines = s.audit_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(
        (
            &line["agent"],
            &line["decision"],
            &line["status"],
            &line["model"]
        ),
        (
            &"a1".into(),
            &"forwarded".into(),
            &200.into(),
            &"claude-test".into()
        )
    );
    assert_eq!(
        (
            line["input_tokens"].as_u64(),
            line["output_tokens"].as_u64()
        ),
        (Some(12), Some(7))
    );
    assert!(!std::fs::read_to_string(&s.audit).unwrap().contains(REAL));
    assert_eq!(s.sink.0.lock().unwrap()[0].1.total(), 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_other_paths_and_spent_budgets_never_reach_the_model() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let team = Budget {
        requests_per_minute: Some(1),
        ..Budget::default()
    };
    let s = setup(port, team);
    let mine = s.gateway.register("a1", anthropic(Budget::default()));
    let theirs = s.gateway.register("a2", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let answer = ask(&socket, &theirs, "/v1/messages").await;
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "another agent's key: {answer}"
    );
    assert!(answer.contains("authentication_error"), "{answer}");
    let answer = ask(&socket, REAL, "/v1/messages").await;
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "the real key itself: {answer}"
    );
    let answer = ask(&socket, &mine, "/v1/files").await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        ask(&socket, &mine, "/v1/messages")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let answer = ask(&socket, &mine, "/v1/messages").await;
    assert!(
        answer.starts_with("HTTP/1.1 429"),
        "the team's one request a minute: {answer}"
    );
    assert!(
        answer.contains("rate_limit_error") && answer.contains("team"),
        "{answer}"
    );
    assert!(seen.recv().await.is_some());
    assert!(
        seen.try_recv().is_err(),
        "only the admitted request reached the model"
    );
    let decisions: Vec<String> = s
        .audit_lines()
        .iter()
        .map(|l| format!("{} {}", l["decision"].as_str().unwrap(), l["status"]))
        .collect();
    assert_eq!(
        decisions,
        [
            "refused 401",
            "refused 401",
            "refused 404",
            "forwarded 200",
            "refused 429"
        ]
    );
    // The turn runner is given them, by who refused; the budget's
    // refusal counted for the metrics.
    let kept: Vec<String> = s
        .gateway
        .take_errors("a1")
        .iter()
        .map(|e| format!("{:?} {}", e.kind, e.status))
        .collect();
    assert_eq!(
        kept,
        ["Refused 401", "Refused 401", "Refused 404", "Budget 429"]
    );
    assert!(s.gateway.take_errors("a1").is_empty(), "taken once");
    assert_eq!(
        *s.sink.1.lock().unwrap(),
        [("a1".to_string(), "team", "requests_per_minute")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_model_holds_no_other_agent() {
    let (slow_port, _seen) = model_server(SSE, Duration::from_secs(3)).await;
    let s = setup(slow_port, Budget::default());
    let one = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let slow = tokio::spawn({
        let socket = socket.clone();
        async move { ask(&socket, &one, "/v1/messages").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let two = s.gateway.register("a2", anthropic(Budget::default()));
    let other = s.serve("a2");
    let start = Instant::now();
    let answer = ask(&other, &two, "/v1/files").await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "answered while the model is slow"
    );
    assert!(!slow.is_finished());
    assert!(slow.await.unwrap().starts_with("HTTP/1.1 200"));
}

/// The team's count shared by several gateways (the daemons' database in
/// the product): `limit` requests in all, then refused.
#[derive(Debug)]
struct SharedMeter {
    limit: u32,
    counted: Mutex<u32>,
}

impl TeamMeter for SharedMeter {
    fn reserve(&self, _team: &Budget, _id: &str, _tokens: u64) -> Result<(), Refusal> {
        Ok(())
    }

    fn release(&self, _id: &str) {}

    fn admit(&self, team: &Budget) -> Result<(), Refusal> {
        let mut counted = self.counted.lock().unwrap();
        if *counted >= self.limit {
            return Err(Refusal::RequestsPerMinute {
                scope: crate::ledger::Scope::Team,
                limit: team.requests_per_minute.unwrap_or(0),
                retry_after_s: 60,
            });
        }
        *counted += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_of_one_team_share_its_budget_through_the_meter() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let team = Budget {
        requests_per_minute: Some(2),
        ..Budget::default()
    };
    let meter = Arc::new(SharedMeter {
        limit: 2,
        counted: Mutex::new(0),
    });
    let (one, two) = (setup(port, team), setup(port, team));
    one.gateway.set_team_meter(meter.clone());
    two.gateway.set_team_meter(meter.clone());
    let (key_a, key_b) = (
        one.gateway.register("a", anthropic(Budget::default())),
        two.gateway.register("b", anthropic(Budget::default())),
    );
    let (socket_a, socket_b) = (one.serve("a"), two.serve("b"));
    // Each gateway alone would admit two; the team has two in all.
    assert!(
        ask(&socket_a, &key_a, "/v1/messages")
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        ask(&socket_b, &key_b, "/v1/messages")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let answer = ask(&socket_b, &key_b, "/v1/messages").await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.contains("the team's budget: 2 model requests per minute"),
        "{answer}"
    );
    assert!(seen.recv().await.is_some() && seen.recv().await.is_some());
    assert!(
        seen.try_recv().is_err(),
        "the third never reached the model"
    );
    assert_eq!(*meter.counted.lock().unwrap(), 2);
}
