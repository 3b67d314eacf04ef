//! An agent attacking its gateway socket: other APIs' routes with its
//! placeholder, provider-side tools, answers whose usage it tries to hide,
//! many requests at once against a budget, slow and large bodies. Each
//! test checks the exact answer and that the model saw only what it should.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::tests::*;
use super::*;

fn budget_of(tokens_per_turn: u64) -> Budget {
    Budget {
        tokens_per_turn: Some(tokens_per_turn),
        concurrent_requests: Some(64),
        ..Budget::default()
    }
}

fn status(answer: &str) -> &str {
    answer.get(9..12).unwrap_or(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_opens_only_its_own_apis_routes_with_post() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let other_api = ask(&socket, &key, "/v1/responses").await;
    assert_eq!(status(&other_api), "403", "{other_api}");
    assert!(other_api.contains("for the anthropic API, not the openai API"));
    let get = ask_with(&socket, &key, "GET /v1/messages", "", "").await;
    assert_eq!(status(&get), "405", "{get}");
    let query = ask(&socket, &key, "/v1/messages?alt=proto").await;
    assert_eq!(status(&query), "400", "{query}");
    let encoded = ask_with(
        &socket,
        &key,
        "POST /v1/messages",
        "content-encoding: gzip\r\n",
        BODY,
    )
    .await;
    assert_eq!(status(&encoded), "415", "{encoded}");
    assert!(seen.try_recv().is_err(), "none reached the model");
    let fine = ask(&socket, &key, "/v1/messages?beta=true").await;
    assert_eq!(status(&fine), "200", "{fine}");
    let head = seen.recv().await.unwrap();
    assert!(head.starts_with("POST /v1/messages?beta=true "), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_side_tools_are_refused_unless_the_role_allows_them() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    for body in [
        r#"{"max_tokens":10,"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
        r#"{"max_tokens":10,"tools":[{"name":"x","ty\u0070e":"code_execution_20250825"}]}"#,
        r#"{"max_tokens":10,"mcp_servers":[{"type":"url","url":"https://evil.example/mcp"}]}"#,
        r#"{"max_tokens":10,"tools":[{"type":"something_new_20990101"}]}"#,
        r#"{"max_tokens":10,"tools":[{"type":"web_fetch_20250910"}],"tools":[]}"#,
    ] {
        let answer = ask_with(&socket, &key, "POST /v1/messages", "", body).await;
        assert_eq!(status(&answer), "403", "{body}: {answer}");
        assert!(answer.contains("permission_error"), "{answer}");
    }
    assert!(seen.try_recv().is_err(), "none reached the model");
    // A role that allows web search: that one goes, code execution not.
    let allowed = ModelAccess {
        hosted_tools: [HostedTool::WebSearch].into(),
        ..anthropic(Budget::default())
    };
    let key = s.gateway.register("a2", allowed);
    let socket = s.serve("a2");
    let search = r#"{"max_tokens":10,"tools":[{"type":"web_search_20250305","name":"s"}]}"#;
    let answer = ask_with(&socket, &key, "POST /v1/messages", "", search).await;
    assert_eq!(status(&answer), "200", "{answer}");
    let both = r#"{"max_tokens":10,"tools":[{"type":"web_search_20250305"},{"type":"code_execution_20250825"}]}"#;
    let answer = ask_with(&socket, &key, "POST /v1/messages", "", both).await;
    assert_eq!(status(&answer), "403", "{answer}");
    assert!(answer.contains("code_execution"), "{answer}");
}

/// An answer whose usage cannot be read (compressed, no usage, not JSON)
/// is counted at the request's maximum: its input's bytes plus the output
/// it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_usage_is_hidden_counts_at_its_maximum() {
    let answers: [(&'static str, &'static str); 3] = [
        (
            "content-type: text/event-stream\r\ncontent-encoding: gzip\r\n",
            SSE,
        ),
        (
            "content-type: application/json\r\n",
            r#"{"type":"message"}"#,
        ),
        (
            "content-type: text/event-stream\r\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n",
        ),
    ];
    for (headers, answer) in answers {
        let (port, mut seen) = model_server_with(headers, answer, Duration::ZERO).await;
        let s = setup(port, Budget::default());
        let key = s.gateway.register("a1", anthropic(budget_of(1_000_000)));
        let socket = s.serve("a1");
        let reply = ask_with(
            &socket,
            &key,
            "POST /v1/messages",
            "accept-encoding: gzip, br\r\n",
            BODY,
        )
        .await;
        assert_eq!(status(&reply), "200", "{reply}");
        let head = seen.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.contains("accept-encoding: identity"), "{head}");
        assert!(!head.contains("gzip"), "{head}");
        let line = &s.audit_lines()[0];
        let counted =
            line["input_tokens"].as_u64().unwrap() + line["output_tokens"].as_u64().unwrap();
        assert_eq!(counted, BODY.len() as u64 + 100, "{headers}: {line}");
        assert!(
            line["reason"]
                .as_str()
                .unwrap()
                .contains("counted at the request's maximum"),
            "{line}"
        );
        let (_, usage) = &s.sink.0.lock().unwrap()[0];
        assert_eq!(usage.total(), counted);
    }
}

/// Eight requests at once (all the connections an agent may open)
/// against 500 tokens a turn, each reserving
/// 100 output tokens plus its body's bytes: only those that fit before the
/// budget is reserved go to the model, and what they spend overruns the
/// budget by less than one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_once_cannot_overrun_the_budget() {
    let (port, mut seen) = model_server(SSE, Duration::from_millis(500)).await;
    let s = setup(port, Budget::default());
    let key = s.gateway.register("a1", anthropic(budget_of(500)));
    let socket = s.serve("a1");
    let asks: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let (socket, key) = (socket.clone(), key.clone());
            tokio::spawn(async move { ask(&socket, &key, "/v1/messages").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for ask in asks {
        statuses.push(status(&ask.await.unwrap()).to_string());
    }
    let forwarded = statuses.iter().filter(|s| *s == "200").count();
    let per_request = BODY.len() as u64 + 100;
    assert_eq!(
        forwarded as u64,
        500u64.div_ceil(per_request),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| s == "200" || s == "429"),
        "{statuses:?}"
    );
    let mut reached = 0;
    while seen.try_recv().is_ok() {
        reached += 1;
    }
    assert_eq!(reached, forwarded);
    let spent: u64 = s
        .sink
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, u)| u.total())
        .sum();
    assert_eq!(spent, forwarded as u64 * 19, "each used 19");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_large_bodies_are_cut() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let spool = body::SpoolConfig {
        max_bytes: 4096,
        idle: Duration::from_millis(300),
        deadline: Duration::from_secs(2),
        ..body::SpoolConfig::default()
    };
    let s = setup_with(port, Budget::default(), spool);
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let large = format!(r#"{{"max_tokens":1,"x":"{}"}}"#, "y".repeat(5000));
    let answer = ask_with(&socket, &key, "POST /v1/messages", "", &large).await;
    assert_eq!(status(&answer), "413", "{answer}");
    // A body that stops coming, then one that trickles past the deadline.
    for pause in [Duration::from_secs(5), Duration::from_millis(200)] {
        let stream = UnixStream::connect(&socket).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let head = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\ncontent-length: 3000\r\n\r\n{{"
        );
        writer.write_all(head.as_bytes()).await.unwrap();
        let start = Instant::now();
        let trickle = tokio::spawn(async move {
            for _ in 0..30 {
                tokio::time::sleep(pause).await;
                if writer.write_all(b" ").await.is_err() {
                    break;
                }
            }
        });
        let mut answer = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut reader, &mut answer).await;
        trickle.abort();
        assert_eq!(status(&answer), "408", "{pause:?}: {answer}");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(4), "{pause:?}: {took:?}");
    }
    assert!(seen.try_recv().is_err(), "none reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_output_than_the_roles_cap_is_refused() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let capped = Budget {
        tokens_per_request: Some(50),
        ..Budget::default()
    };
    let key = s.gateway.register("a1", anthropic(capped));
    let socket = s.serve("a1");
    let answer = ask(&socket, &key, "/v1/messages").await;
    assert_eq!(status(&answer), "400", "{answer}");
    assert!(answer.contains("up to 100 output tokens"), "{answer}");
    assert!(seen.try_recv().is_err());
}

/// Each API's own forms of provider-side tools, with its own key header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_apis_provider_side_tools_are_refused() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let cases = [
        (
            Api::OpenAi,
            "POST /v1/responses",
            r#"{"model":"m","tools":[{"type":"function","name":"f"},{"type":"web_search"}]}"#,
        ),
        (
            Api::OpenAi,
            "POST /v1/responses",
            r#"{"tools":[{"type":"namespace","name":"n","tools":[{"type":"mcp","server_url":"https://x"}]}]}"#,
        ),
        (
            Api::Gemini,
            "POST /v1beta/models/g:streamGenerateContent?alt=sse",
            r#"{"contents":[],"tools":[{"functionDeclarations":[]},{"googleSearch":{}}]}"#,
        ),
        (
            Api::Gemini,
            "POST /v1beta/models/g:generateContent",
            r#"{"tools":[{"url_context":{}}]}"#,
        ),
    ];
    for (n, (api, line, body)) in cases.into_iter().enumerate() {
        let agent = format!("a{n}");
        let access = ModelAccess {
            api,
            ..anthropic(Budget::default())
        };
        let key = s.gateway.register(&agent, access);
        let socket = s.serve(&agent);
        let answer = ask_with(&socket, &key, line, "", body).await;
        assert_eq!(status(&answer), "403", "{body}: {answer}");
        assert!(answer.contains("provider-side tools are off"), "{answer}");
    }
    assert!(seen.try_recv().is_err(), "none reached the model");
}

/// With a role's `model.models`, every model a request names must be
/// allowed: a second one smuggled in by a duplicate key, another case, an
/// escape, a tool's model or Gemini's path is refused in the API's own
/// error shape, counted and audited; none reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_outside_the_roles_allowance_is_refused_however_named() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let allowed = Some(vec![
        "claude-sonnet-*".to_string(),
        "gpt-5-mini".into(),
        "gemini-*-flash".into(),
    ]);
    let cases = [
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"model":"claude-opus-5","max_tokens":10}"#,
        ),
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"model":"claude-sonnet-5","max_tokens":10,"model":"claude-opus-5"}"#,
        ),
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"model":"claude-sonnet-5","mod\u0065l":"claude-opus-5"}"#,
        ),
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"Model":"claude-opus-5","model":"claude-sonnet-5"}"#,
        ),
        (Api::Anthropic, "POST /v1/messages", r#"{"max_tokens":10}"#),
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"model":["claude-sonnet-5"]}"#,
        ),
        (Api::OpenAi, "POST /v1/responses", r#"{"model":"gpt-5"}"#),
        (
            Api::OpenAi,
            "POST /v1/responses",
            r#"{"model":"gpt-5-mini","tools":[{"type":"function","name":"f","model":"gpt-5"}]}"#,
        ),
        (
            Api::Gemini,
            "POST /v1beta/models/gemini-3-pro:generateContent",
            r#"{"contents":[]}"#,
        ),
        (
            Api::Gemini,
            "POST /v1beta/models/gemini-3-flash:generateContent",
            r#"{"contents":[],"model":"models/gemini-3-pro"}"#,
        ),
    ];
    for (n, (api, line, body)) in cases.into_iter().enumerate() {
        let agent = format!("m{n}");
        let access = ModelAccess {
            api,
            models: allowed.clone(),
            ..anthropic(Budget::default())
        };
        let key = s.gateway.register(&agent, access);
        let socket = s.serve(&agent);
        let answer = ask_with(&socket, &key, line, "", body).await;
        assert_eq!(status(&answer), "403", "{body}: {answer}");
        let shape = match api {
            Api::Anthropic => "\"permission_error\"",
            Api::OpenAi => "\"gateway_error\"",
            Api::Gemini => "\"PERMISSION_DENIED\"",
        };
        assert!(answer.contains(shape), "{answer}");
        assert!(
            answer.contains("claude-sonnet-*"),
            "the allowance is named: {answer}"
        );
    }
    assert!(seen.try_recv().is_err(), "none reached the model");
    assert_eq!(s.gateway.model_refusals(), cases.len() as u64);
    assert_eq!(s.sink.2.lock().unwrap().len(), cases.len(), "told the sink");
    let audited = s.audit_lines();
    let refused: Vec<_> = audited
        .iter()
        .filter(|l| l["decision"] == "refused" && l["status"] == 403)
        .collect();
    assert_eq!(refused.len(), cases.len(), "{audited:?}");
    assert!(
        refused[1]["reason"]
            .as_str()
            .unwrap()
            .contains("claude-opus-5")
    );
    // Within the allowance, each API's request goes on.
    for (n, (api, line, body)) in [
        (
            Api::Anthropic,
            "POST /v1/messages",
            r#"{"model":"claude-sonnet-5","max_tokens":10}"#,
        ),
        (
            Api::OpenAi,
            "POST /v1/responses",
            r#"{"model":"gpt-5-mini"}"#,
        ),
        (
            Api::Gemini,
            "POST /v1beta/models/gemini-3-flash:generateContent",
            r#"{"contents":[]}"#,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let agent = format!("ok{n}");
        let access = ModelAccess {
            api,
            models: allowed.clone(),
            ..anthropic(Budget::default())
        };
        let key = s.gateway.register(&agent, access);
        let socket = s.serve(&agent);
        let answer = ask_with(&socket, &key, line, "", body).await;
        assert_eq!(status(&answer), "200", "{body}: {answer}");
        assert!(seen.recv().await.is_some());
    }
}

/// Records what the gateway asks of the team's shared count.
#[derive(Debug)]
struct RecordingMeter {
    sink: Arc<Sink>,
    events: std::sync::Mutex<Vec<String>>,
}

impl TeamMeter for RecordingMeter {
    fn admit(&self, _team: &Budget) -> Result<(), Refusal> {
        Ok(())
    }

    fn reserve(&self, _team: &Budget, _id: &str, tokens: u64) -> Result<(), Refusal> {
        self.events
            .lock()
            .unwrap()
            .push(format!("reserve {tokens}"));
        Ok(())
    }

    fn release(&self, _id: &str) {
        let recorded = self.sink.0.lock().unwrap().len();
        let line = format!("release after {recorded} recorded");
        self.events.lock().unwrap().push(line);
    }
}

/// Where daemons share a team's day, a request's worst case is reserved
/// there too, and given back only once its usage is recorded (so the
/// other daemons never see the request counted neither way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_teams_day_is_reserved_where_every_daemon_sees_it() {
    let (port, _seen) = model_server(SSE, Duration::ZERO).await;
    let team = Budget {
        tokens_per_day: Some(1_000_000),
        ..Budget::default()
    };
    let s = setup(port, team);
    let meter = Arc::new(RecordingMeter {
        sink: s.sink.clone(),
        events: Default::default(),
    });
    s.gateway.set_team_meter(meter.clone());
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let answer = ask(&socket, &key, "/v1/messages").await;
    assert_eq!(status(&answer), "200", "{answer}");
    let events = meter.events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            format!("reserve {}", BODY.len() + 100),
            "release after 1 recorded".to_string()
        ]
    );
}

/// An agent that goes away while its request waits for the model: the
/// request reached the model, so its reservation is recorded as used
/// (for the store and the other daemons), with an audit line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_left_before_its_answer_counts_at_its_maximum() {
    let (port, mut seen) = model_server(SSE, Duration::from_secs(2)).await;
    let s = setup(port, Budget::default());
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let mut stream = UnixStream::connect(&socket).await.unwrap();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    seen.recv().await.expect("the request reached the model");
    drop(stream);
    let want = BODY.len() as u64 + 100;
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.sink.0.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recorded: Vec<u64> = s
        .sink
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, u)| u.total())
        .collect();
    assert_eq!(recorded, [want]);
    let line = &s.audit_lines()[0];
    assert_eq!(
        line["reason"], "no answer came: counted at the request's maximum",
        "{line}"
    );
    assert_eq!(line["output_tokens"], want, "{line}");
}

/// A second Content-Encoding (or Content-Length, Transfer-Encoding,
/// Content-Type) behind the one the gateway would judge: refused, never
/// forwarded; a single `identity` one passes but is not sent upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_judged_header_is_refused_and_encoding_is_not_forwarded() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let key = s.gateway.register("a1", anthropic(Budget::default()));
    let socket = s.serve("a1");
    let twice = "content-encoding: identity\r\ncontent-encoding: br\r\n";
    let answer = ask_with(&socket, &key, "POST /v1/messages", twice, BODY).await;
    assert_eq!(status(&answer), "400", "{answer}");
    assert!(answer.contains("repeated content-encoding"), "{answer}");
    let typed = "content-type: application/json\r\ncontent-type: text/plain\r\n";
    let answer = ask_with(&socket, &key, "POST /v1/messages", typed, BODY).await;
    assert_eq!(status(&answer), "400", "{answer}");
    assert!(seen.try_recv().is_err(), "nothing reached the model");
    let once = "content-encoding: identity\r\n";
    let answer = ask_with(&socket, &key, "POST /v1/messages", once, BODY).await;
    assert_eq!(status(&answer), "200", "{answer}");
    let head = seen.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.contains("x-api-key"), "the request seen: {head}");
    assert!(!head.contains("content-encoding"), "{head}");
}

/// Requests refused for their model spend none of the agent's rate: two
/// refused, then an allowed one within two a minute still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_for_its_model_spends_no_rate() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let mut access = anthropic(Budget::default());
    access.models = Some(vec!["claude-sonnet-*".to_string()]);
    access.budget.requests_per_minute = Some(2);
    let key = s.gateway.register("a1", access);
    let socket = s.serve("a1");
    let outside = r#"{"model":"claude-opus-5","max_tokens":10}"#;
    for _ in 0..3 {
        let a = ask_with(&socket, &key, "POST /v1/messages", "", outside).await;
        assert_eq!(status(&a), "403", "{a}");
    }
    assert!(seen.try_recv().is_err(), "nothing reached the model");
    let allowed = r#"{"model":"claude-sonnet-5","max_tokens":10}"#;
    for _ in 0..2 {
        let a = ask_with(&socket, &key, "POST /v1/messages", "", allowed).await;
        assert_eq!(status(&a), "200", "{a}");
    }
    let third = ask_with(&socket, &key, "POST /v1/messages", "", allowed).await;
    assert_eq!(status(&third), "429", "the rate still holds: {third}");
    assert_eq!(*s.sink.2.lock().unwrap(), vec!["a1".to_string(); 3]);
    // Kept for the turn's failure as the allowance's, not the gateway's.
    let kinds: Vec<_> = s
        .gateway
        .take_errors("a1")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    use crate::problems::ErrorKind;
    assert_eq!(
        kinds,
        [
            ErrorKind::Model,
            ErrorKind::Model,
            ErrorKind::Model,
            ErrorKind::Budget
        ]
    );
}

/// A model that is no model name (a NUL, a newline, a path climbing, too
/// long), in the body or Gemini's path, is refused with or without an
/// allowance, and never reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_is_not_a_model_name_is_refused() {
    let (port, mut seen) = model_server(SSE, Duration::ZERO).await;
    let s = setup(port, Budget::default());
    let long = format!(r#"{{"model":"{}","max_tokens":10}}"#, "m".repeat(300));
    let bodies = [
        r#"{"model":"claude-sonnet-5\u0000claude-opus-5","max_tokens":10}"#.to_string(),
        r#"{"model":"claude-sonnet-5\n","max_tokens":10}"#.into(),
        r#"{"model":"-claude","max_tokens":10}"#.into(),
        r#"{"model\u0000":"claude sonnet","model":"claude-sonnet-5"}"#.into(),
        long,
    ];
    for (agent, models) in [
        ("open", None),
        ("pinned", Some(vec!["claude-*".to_string()])),
    ] {
        let mut access = anthropic(Budget::default());
        access.models = models;
        let key = s.gateway.register(agent, access);
        let socket = s.serve(agent);
        for body in &bodies {
            let a = ask_with(&socket, &key, "POST /v1/messages", "", body).await;
            assert_eq!(status(&a), "403", "{agent} {body}: {a}");
            let why = ["is refused: a model name", "not a name the gateway reads"];
            assert!(why.iter().any(|w| a.contains(w)), "{a}");
        }
    }
    let mut gemini = anthropic(Budget::default());
    gemini.api = Api::Gemini;
    let key = s.gateway.register("g", gemini);
    let socket = s.serve("g");
    let path = "POST /v1beta/models/gemini%0a-flash:generateContent";
    let a = ask_with(&socket, &key, path, "", "{}").await;
    assert!(status(&a).starts_with('4'), "{a}");
    assert!(seen.try_recv().is_err(), "nothing reached the model");
    assert_eq!(s.gateway.model_refusals(), 2 * bodies.len() as u64);
}
