use super::*;
use serde_json::json;
use substrat_broker::audit::Decision;

const NOW: i64 = 1_000_000;

fn agent(name: &str, parent: Option<&str>, turn: Value) -> Value {
    json!({"name": name, "role": "worker", "parent": parent, "state": "active",
           "turn": turn, "model_usage": {"tokens_today": 1500}, "tokens_per_day": null,
           "layer_bytes": null, "daemon": {"here": true, "daemon": "h:/s", "daemon_id": "d"}})
}

fn shown(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            format!(
                "{}|{}|{}|{}|{}|{}|{}",
                r.shown, r.role, r.state, r.turn, r.tokens, r.layer, r.daemon
            )
        })
        .collect()
}

#[test]
fn agents_are_a_tree_with_their_turns() {
    let agents = [
        agent(
            "w2",
            Some("lead"),
            json!({"status": "queued", "queued_at_ms": NOW - 3_000}),
        ),
        agent(
            "lead",
            None,
            json!({"status": "running", "started_at_ms": NOW - 125_000}),
        ),
        agent(
            "w1",
            Some("lead"),
            json!({"status": "done", "finished_at_ms": NOW - 7_200_000}),
        ),
        agent("w1a", Some("w1"), Value::Null),
        agent(
            "orphan",
            Some("gone"),
            json!({"status": "failed", "finished_at_ms": NOW, "failure": "timeout"}),
        ),
    ];
    assert_eq!(
        shown(&rows(&agents, NOW)),
        [
            "lead|worker|active|running 2m05s|1.5k||here",
            "└ w1|worker|active|done 2h00m ago|1.5k||here",
            "  └ w1a|worker|active|-|1.5k||here",
            "└ w2|worker|active|queued 3s|1.5k||here",
            "orphan|worker|active|failed (timeout) 0s ago|1.5k||here",
        ]
    );
}

#[test]
fn budgets_layers_and_other_daemons_are_shown() {
    let mut a = agent("x", None, Value::Null);
    a["tokens_per_day"] = json!(2_000_000);
    a["model_usage"]["tokens_today"] = json!(1_250_000);
    a["layer_bytes"] = json!(3 * 1_048_576);
    a["daemon"] = json!({"here": false, "daemon": "host-b:/var/lib/substrat"});
    assert_eq!(
        shown(&rows(&[a], NOW)),
        ["x|worker|active|-|1.2M/2.0M|3.0 MiB|host-b:/var/lib/substrat"]
    );
}

#[test]
fn what_agents_chose_is_escaped_everywhere() {
    let bad = "x\u{1b}]0;pwned\u{7}\u{202e}y";
    let mut a = agent(
        bad,
        None,
        json!({"status": bad, "finished_at_ms": NOW, "failure": bad}),
    );
    a["role"] = json!(bad);
    a["state"] = json!(bad);
    a["daemon"] = json!({"here": false, "daemon": bad});
    let inspect = json!({"activity": {
        "name": bad, "role": bad, "state": bad, "reason": bad,
        "recent_turns": [{"kind": bad, "status": bad, "error": bad, "finished_at_ms": NOW,
                          "stream_notes": {"failure": {"reason": bad}}}],
        "recent_messages": [{"direction": "in", "counterpart": bad, "text": bad}],
    }});
    let calls = [Recorded {
        ts_ms: NOW,
        agent_id: "a".into(),
        tool: bad.into(),
        decision: Decision::Denied,
        reason: bad.into(),
    }];
    let server = json!({"server": bad, "status": {"status": "down", "reason": bad}});
    let mut all = shown(&rows(&[a], NOW));
    all.extend(detail(&inspect, &calls, NOW));
    all.push(servers(&[server]));
    for line in all {
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{line:?}"
        );
        if line.contains("pwned") {
            assert!(line.contains("\\x1b]0;pwned"), "{line:?}");
        }
    }
}

#[test]
fn the_detail_says_why_and_what_waits() {
    let inspect = json!({"activity": {
        "name": "w1", "role": "worker", "state": "failed", "reason": "turn failed twice",
        "queued_messages": 2, "queued_turns": 1, "awaiting_replies": 0,
        "recent_turns": [{"kind": "message", "status": "failed", "finished_at_ms": NOW - 4_000,
                          "error": "the CLI ended with 1\nstack...",
                          "stream_notes": {"failure": {"reason": "no_result"}}}],
        "recent_messages": [{"direction": "out", "counterpart": "lead", "text": "done\nmore"}],
    }});
    let calls = [Recorded {
        ts_ms: NOW - 1_000,
        agent_id: "a".into(),
        tool: "send_message".into(),
        decision: Decision::Limited,
        reason: "rate".into(),
    }];
    assert_eq!(
        detail(&inspect, &calls, NOW),
        [
            "w1 (worker): failed, turn failed twice",
            "queued: 2 message(s), 1 turn(s); awaiting 0 repl(ies)",
            "turns:",
            "  message failed (no_result) 4s ago: the CLI ended with 1 ...",
            "last tool calls:",
            "  1s send_message Limited (rate)",
            "messages:",
            "  to lead: done ...",
        ]
    );
}

#[test]
fn upstream_health_in_one_line() {
    let up = json!({"server": "fs", "status": {"status": "up", "pid": 1}});
    let down = json!({"server": "time", "status": {"status": "down", "reason": "exited 1"}});
    assert_eq!(servers(&[]), "upstreams: none");
    assert_eq!(
        servers(&[up, down]),
        "upstreams: fs up, time down (exited 1)"
    );
}

/// Every agent has its row, however deep its tree: an agent's chain of
/// descendants (a role without `spawn_depth` has no bound) neither hides
/// the ones past some depth nor pushes their names out of the column.
#[test]
fn a_deep_chain_of_agents_is_shown_whole_and_readable() {
    let agents: Vec<Value> = (0..80)
        .map(|n| {
            let parent = (n > 0).then(|| format!("a{:02}", n - 1));
            agent(&format!("a{n:02}"), parent.as_deref(), Value::Null)
        })
        .collect();
    let rows = rows(&agents, NOW);
    assert_eq!(rows.len(), 80, "agents missing from the view");
    let deepest = &rows[79];
    assert_eq!(deepest.name, "a79");
    assert!(deepest.shown.ends_with("a79"), "{}", deepest.shown);
    assert!(
        deepest.shown.chars().count() <= 24,
        "the name is pushed {} columns in",
        deepest.shown.chars().count()
    );
}

/// Agents whose parents name each other (no root) are still shown.
#[test]
fn agents_in_a_parent_loop_are_shown() {
    let agents = [
        agent("r", None, Value::Null),
        agent("x", Some("y"), Value::Null),
        agent("y", Some("x"), Value::Null),
    ];
    let names: Vec<String> = rows(&agents, NOW).into_iter().map(|r| r.name).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for name in ["r", "x", "y"] {
        assert!(names.iter().any(|n| n == name), "{name} hidden: {names:?}");
    }
}

/// The table is made at every frame (10 a second) and every key: a large
/// team (a role without `children_per_agent` has no bound) must not make
/// it quadratic. 5,000 agents took seconds a frame before.
#[test]
fn a_large_team_is_laid_out_fast() {
    let agents: Vec<Value> = (0..5_000)
        .map(|n| {
            agent(
                &format!("w{n:05}"),
                (n > 0).then_some("w00000"),
                Value::Null,
            )
        })
        .collect();
    let start = std::time::Instant::now();
    let rows = rows(&agents, NOW);
    let took = start.elapsed();
    assert_eq!(rows.len(), 5_000);
    assert!(
        took < std::time::Duration::from_millis(500),
        "took {took:?}"
    );
}
