//! A failed turn says why (issue 43): each kind of failure of the stand-in
//! CLI, and what `agent inspect` (JSON) and `agent list` show of it.

use super::*;

/// The agent's last turn as `agent inspect` shows it.
fn last_turn(team: &Team, name: &str) -> Value {
    let inspect = team.agent(&["inspect", name]);
    inspect["activity"]["recent_turns"][0].clone()
}

#[test]
fn each_failed_turn_says_why_in_inspect() {
    let test = "each_failed_turn_says_why_in_inspect";
    if !sandbox_works(test, "native") {
        return;
    }
    let policies = repo().join("policies");
    let team = Team::start_with_args("native", 4, policies, vec!["--turn-timeout", "4"]);
    let ws = team.ws().display().to_string();
    let plans = [
        (
            "erring",
            json!({"turns": [{"steps": [{"fail": "the model said no"}]}]}),
        ),
        (
            "sleepy",
            json!({"turns": [{"steps": [
                {"emit_raw": "{\"type\":\"thinking\",\"text\":\"hm\"}"},
                {"sleep_ms": 60000},
            ]}]}),
        ),
        (
            "garbled",
            json!({"turns": [{"steps": [
                {"emit_raw": "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"cut"},
                {"exit": 0},
            ]}]}),
        ),
        ("crashing", json!({"turns": [{"steps": [{"exit": 3}]}]})),
        (
            "fine",
            json!({"turns": [{"steps": [{"reply": "all good"}]}]}),
        ),
    ];
    for (name, plan) in &plans {
        team.agent(&["spawn", name, "--workspace", &ws, &with_plan("Go.", plan)]);
    }
    wait_until("every turn ends", 60, || team.settled());
    let why = |name: &str| {
        let turn = last_turn(&team, name);
        let failure = turn["stream_notes"]["failure"].clone();
        (turn["status"].clone(), turn["error"].clone(), failure)
    };

    let (status, error, failure) = why("erring");
    assert_eq!(status, "failed");
    assert_eq!(error, "the agent reported an error: the model said no");
    assert_eq!(failure["reason"], "cli_error");

    let (status, error, failure) = why("sleepy");
    assert_eq!(status, "failed");
    assert_eq!(error, "timed out after 4 s");
    assert_eq!(failure["reason"], "timeout");
    // What it was doing when it was stopped.
    let last: Vec<&str> = failure["last_events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(last.last(), Some(&"event `thinking`"), "{failure}");

    // An answer it could not read, from a CLI that exited 0: failed, not
    // done with an empty result.
    let (status, error, failure) = why("garbled");
    assert_eq!(status, "failed");
    assert_eq!(failure["reason"], "unreadable_answer");
    let error = error.as_str().unwrap();
    assert!(
        error.starts_with("its answer could not be read: a line (EOF while parsing a string"),
        "{error}"
    );

    let (status, error, failure) = why("crashing");
    assert_eq!(status, "failed");
    assert_eq!(failure["reason"], "no_result");
    assert!(
        error
            .as_str()
            .unwrap()
            .starts_with("the turn ended without a result (exit status 3)"),
        "{error}"
    );

    let (status, _, failure) = why("fine");
    assert_eq!(status, "done");
    assert!(failure.is_null(), "{failure}");

    // Each agent's provider (the daemon's default) and model (none asked
    // for, none reported by the stand-in) in `list` and `inspect`.
    let list = team.agent(&["list"]);
    for agent in list["agents"].as_array().unwrap() {
        assert_eq!(agent["provider"], "stand-in", "{agent}");
        assert!(agent.get("model").is_some(), "{agent}");
    }
    let sleepy = team.agent(&["list"])["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "sleepy")
        .cloned()
        .unwrap();
    assert_eq!(sleepy["turn"]["failure"], "timeout");
    let inspect = team.agent(&["inspect", "erring"]);
    assert_eq!(inspect["agent"]["provider"], "stand-in");
}

#[test]
fn a_claude_turn_refused_upstream_says_so_with_the_gateways_errors() {
    refused_upstream(
        "a_claude_turn_refused_upstream_says_so_with_the_gateways_errors",
        "claude",
    );
}

#[test]
fn a_codex_turn_refused_upstream_says_so_with_the_gateways_errors() {
    refused_upstream(
        "a_codex_turn_refused_upstream_says_so_with_the_gateways_errors",
        "codex",
    );
}

/// The scripted model answers 400 (an error the CLIs do not retry): the
/// turn fails as upstream_error, with the CLI's own message and the
/// gateway's record of the upstream's status.
fn refused_upstream(test: &str, cli: &str) {
    if !super::clis::clis_available(test, cli) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let rules = json!([
        {"when": "AGAIN", "status": 404, "error": "scripted refusal: no such model"},
        {"when": "PLEASE FAIL", "status": 400, "error": "scripted refusal: prompt too long"},
    ]);
    let model = super::clis::Model::start(root.path(), &rules);
    let policies = repo().join("policies");
    let child =
        super::clis::daemon_with_policies(root.path(), cli, "sk-real-why", model.port, &policies);
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "asker", "--workspace", &ws, "PLEASE FAIL"]);
    wait_until("the turn ends", 120, || team.settled());
    let turn = last_turn(&team, "asker");
    assert_eq!(turn["status"], "failed", "{turn}");
    let failure = &turn["stream_notes"]["failure"];
    assert_eq!(failure["reason"], "upstream_error", "{turn}");
    let errors = failure["model_errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{failure}");
    for e in errors {
        assert_eq!(
            (&e["kind"], &e["status"]),
            (&json!("upstream"), &json!(400))
        );
        assert_eq!(e["reason"], "the model upstream answered 400 Bad Request");
    }
    // The CLI's own words carry the upstream's message.
    let said = format!("{} {}", turn["error"], failure["cli_errors"]);
    assert!(said.contains("scripted refusal"), "{turn}");
    assert!(!model.requests().is_empty());
    // The next turn fails its own way: its record holds its own gateway
    // errors (404), none of the turn before's (400). The failed turn
    // failed its agent: the operator's message is queued, then the agent
    // resumed (its resume note, queued after the message, would match
    // no rule and so the history's PLEASE FAIL: the scripted model
    // searches the newest message first).
    let first = turn["turn_id"].clone();
    team.agent(&["send", "asker", "AGAIN"]);
    team.agent(&["resume", "asker"]);
    let again = || {
        let turn = last_turn(&team, "asker");
        (turn["turn_id"] != first && turn["status"] == "failed").then_some(turn)
    };
    wait_until("the second turn fails", 120, || again().is_some());
    let turn = again().unwrap();
    let errors = turn["stream_notes"]["failure"]["model_errors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!errors.is_empty(), "{turn}");
    assert!(errors.iter().all(|e| e["status"] == 404), "{turn}");
}

/// `GET /metrics` on the daemon's HTTP endpoint: each sample's value by
/// its name and labels.
fn scrape(port: u16, token: &str) -> std::collections::BTreeMap<String, f64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
        .lines()
        .filter(|l| l.starts_with("substrat_"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A team budget of one model request a minute: Claude Code's further
/// requests are refused (429), it retries them until the turn's timeout;
/// the refusals are in the metrics, the gateway's errors and the CLI's
/// retries in the turn's record, the database calls counted.
#[test]
fn budget_refusals_show_in_the_metrics_and_the_turn() {
    let test = "budget_refusals_show_in_the_metrics_and_the_turn";
    if !super::clis::clis_available(test, "claude") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let model = super::clis::Model::start(
        root.path(),
        &json!([{"when": "HELLO", "calls": [{"tool": "check_inbox", "args": {}}], "final": "hi"}]),
    );
    let policies = repo().join("policies");
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let token = "why-metrics-token";
    let extra = [
        "--team-requests-per-minute",
        "1",
        "--turn-timeout",
        "12",
        "--roles-http",
        &http,
        "--roles-http-token-env",
        "WHY_METRICS_TOKEN",
    ];
    let child = super::clis::daemon_with_args(
        root.path(),
        "claude",
        "sk-real-why",
        model.port,
        &policies,
        &extra,
        &[("WHY_METRICS_TOKEN", token)],
    );
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    let before = scrape(port, token);
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "asker", "--workspace", &ws, "HELLO"]);
    wait_until("the turn ends", 60, || team.settled());
    let after = scrape(port, token);
    let moved = |name: &str| after.get(name).unwrap_or(&0.0) - before.get(name).unwrap_or(&0.0);
    let refused =
        r#"substrat_model_budget_refusals_total{scope="team",limit="requests_per_minute"}"#;
    assert!(moved(refused) >= 1.0, "{after:#?}");
    assert!(
        moved(r#"substrat_db_calls_total{op="write",outcome="ok"}"#) >= 1.0,
        "{after:#?}"
    );
    let turn = last_turn(&team, "asker");
    let failure = &turn["stream_notes"]["failure"];
    let budget = failure["model_errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "budget" && e["status"] == 429)
        .count();
    assert!(budget >= 1, "{turn}");
    // Claude Code's own retries of the refused request, kept with their
    // status.
    let retries: Vec<&str> = failure["cli_errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["retry"] == true)
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        retries
            .iter()
            .any(|m| m.starts_with("model request failed (429")),
        "{turn}"
    );
}
