use super::*;

/// The exposition's sample lines (no comments), sorted.
fn samples(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

fn with(lines: &[String], prefix: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.starts_with(prefix))
        .cloned()
        .collect()
}

#[test]
fn calls_turns_and_launches_are_counted_with_their_labels() {
    let m = Metrics::new();
    let ms = Duration::from_millis(1);
    m.tool_call("send_message", Decision::Allowed, None, ms);
    let rate = Refusal::RateLimited;
    m.tool_call("send_message", Decision::Limited, Some(&rate), ms);
    let steps = Refusal::StepLimit;
    m.tool_call("check_inbox", Decision::Limited, Some(&steps), ms);
    let scope = Refusal::OutOfScope;
    m.tool_call("secret_tool", Decision::Denied, Some(&scope), ms);
    m.turn("claude", TurnEnd::Done, Duration::from_secs(3));
    let timeout = TurnEnd::Failed(crate::turns::FailReason::Timeout);
    m.turn("claude", timeout, Duration::from_secs(1));
    m.launch("native", false, true, Some(Duration::from_millis(30)));
    m.launch("native", true, true, None);
    let team = TeamState {
        agents: vec![("idle".into(), 2), ("running".into(), 1)],
        queued_turns: 4,
        running_turns: 1,
        upstreams: vec![("fs".into(), true, 0), ("time".into(), false, 3)],
        model_requests_today: 12,
        model_tokens_today: 3400,
    };
    let lines = samples(&m.encode(&team));
    assert_eq!(
        with(&lines, "substrat_tool_calls_total"),
        [
            r#"substrat_tool_calls_total{tool="check_inbox",decision="limited"} 1"#,
            r#"substrat_tool_calls_total{tool="send_message",decision="allowed"} 1"#,
            r#"substrat_tool_calls_total{tool="send_message",decision="limited"} 1"#,
            r#"substrat_tool_calls_total{tool="unknown",decision="denied"} 1"#,
        ]
    );
    assert_eq!(
        with(&lines, "substrat_denials_total"),
        [
            r#"substrat_denials_total{rule="rate"} 1"#,
            r#"substrat_denials_total{rule="scope"} 1"#,
            r#"substrat_denials_total{rule="steps"} 1"#,
        ]
    );
    assert_eq!(
        with(&lines, "substrat_turns_total"),
        [
            r#"substrat_turns_total{provider="claude",outcome="done",reason="none"} 1"#,
            r#"substrat_turns_total{provider="claude",outcome="failed",reason="timeout"} 1"#,
        ]
    );
    assert!(lines.contains(&r#"substrat_turn_seconds_count{provider="claude"} 2"#.to_string()));
    assert!(lines.contains(&r#"substrat_turn_seconds_sum{provider="claude"} 4.0"#.to_string()));
    assert!(
        lines.contains(
            &r#"substrat_launch_seconds_count{backend="native",kind="cold"} 1"#.to_string()
        )
    );
    assert_eq!(
        with(&lines, "substrat_launches_total"),
        [
            r#"substrat_launches_total{backend="native",kind="cold",outcome="started"} 1"#,
            r#"substrat_launches_total{backend="native",kind="warm",outcome="started"} 1"#,
        ]
    );
    for line in [
        r#"substrat_agents{state="idle"} 2"#,
        r#"substrat_agents{state="running"} 1"#,
        "substrat_queued_turns 4",
        "substrat_running_turns 1",
        r#"substrat_upstream_up{server="fs"} 1"#,
        r#"substrat_upstream_up{server="time"} 0"#,
        r#"substrat_upstream_restarts{server="time"} 3"#,
        "substrat_model_requests_today 12",
        "substrat_model_tokens_today 3400",
    ] {
        assert!(lines.contains(&line.to_string()), "{line} in {lines:#?}");
    }
}

#[test]
fn an_agent_cannot_grow_the_series_without_bound() {
    let m = Metrics::new();
    for n in 0..MAX_TOOL_LABELS + 100 {
        m.tool_call(&format!("t{n}"), Decision::Allowed, None, Duration::ZERO);
    }
    // Out of scope: never a series of its own, whatever the name.
    for n in 0..1000 {
        m.tool_call(
            &format!("x{n}"),
            Decision::Denied,
            Some(&Refusal::OutOfScope),
            Duration::ZERO,
        );
    }
    let lines = samples(&m.encode(&TeamState::default()));
    let calls = with(&lines, "substrat_tool_calls_total");
    assert_eq!(calls.len(), MAX_TOOL_LABELS + 2);
    assert!(calls.contains(
        &r#"substrat_tool_calls_total{tool="other",decision="allowed"} 100"#.to_string()
    ));
    assert!(calls.contains(
        &r#"substrat_tool_calls_total{tool="unknown",decision="denied"} 1000"#.to_string()
    ));
}

#[test]
fn a_tool_name_cannot_forge_a_sample() {
    let m = Metrics::new();
    m.tool_call(
        "x\"} 1\nsubstrat_forged 1\n#",
        Decision::Allowed,
        None,
        Duration::ZERO,
    );
    let text = m.encode(&TeamState::default());
    assert!(
        !text.lines().any(|l| l.starts_with("substrat_forged")),
        "{text}"
    );
    let calls: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("substrat_tool_calls_total"))
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
}

#[test]
fn budget_refusals_database_calls_and_sandboxes_are_exposed() {
    let m = Metrics::new();
    m.budget_refusal("team", "tokens_per_day");
    m.budget_refusal("team", "tokens_per_day");
    m.budget_refusal("agent", "concurrent");
    m.sandboxes(2, 1, 0);
    // A store call made here shows in the next scrape.
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::Store::open(&dir.path().join("s.db")).unwrap();
    let _ = store.agents();
    let lines = samples(&m.encode(&TeamState::default()));
    assert_eq!(
        with(&lines, "substrat_model_budget_refusals_total"),
        [
            r#"substrat_model_budget_refusals_total{scope="agent",limit="concurrent"} 1"#,
            r#"substrat_model_budget_refusals_total{scope="team",limit="tokens_per_day"} 2"#,
        ]
    );
    assert_eq!(
        with(&lines, "substrat_sandboxes"),
        [
            r#"substrat_sandboxes{kind="pool_building"} 0"#,
            r#"substrat_sandboxes{kind="pool_ready"} 1"#,
            r#"substrat_sandboxes{kind="warm"} 2"#,
        ]
    );
    let reads = with(&lines, r#"substrat_db_calls_total{op="read",outcome="ok"}"#);
    let count: u64 = reads[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count > 0, "{lines:?}");
}
