//! An agent's rate and step limits across daemons: two brokers on one
//! database stand for the daemon that ran an agent and the one that
//! adopted it. And the cost of counting in the store, measured.

use super::tests::{create_tight, tight_broker};
use super::*;
use crate::store::testdb::TestDb;

const TIGHT: &str = "calls_per_minute = 10\nburst = 3\ntool_steps_per_turn = 5";

/// A turn of `agent` queued in the store and marked running on `broker`,
/// as its scheduler does when it claims it.
fn run_turn(broker: &Broker, agent: &Agent, turn_id: Option<String>) -> String {
    let turn_id = turn_id.unwrap_or_else(|| broker.store().queue_prompt(&agent.id, "go").unwrap());
    broker.running().insert(
        agent.id.clone(),
        RunningTurn {
            turn_id: turn_id.clone(),
            ..RunningTurn::default()
        },
    );
    turn_id
}

fn status(broker: &Broker, agent: &Agent) -> String {
    let mut session = Session::new(agent.id.clone());
    match broker.call_tool(&mut session, "check_inbox", json!({})) {
        ToolOutcome::Result {
            is_error: false, ..
        } => "ok".into(),
        ToolOutcome::Result { body, .. } => body["status"].as_str().unwrap_or("?").into(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_adopted_agent_continues_its_rate_and_step_counts() {
    // SQLite: one daemon alone, its counts in memory.
    if let Some(db) = TestDb::postgres("an_adopted_agent_continues_its_rate_and_step_counts") {
        an_adopted_agent_continues_its_rate_and_step_counts_on(&db);
    }
}

fn an_adopted_agent_continues_its_rate_and_step_counts_on(db: &TestDb) {
    // Rates: a burst of 3 spent on the first daemon is spent on the next.
    let first = tight_broker(db, TIGHT, r#"["check_inbox"]"#);
    let a = create_tight(&first, "a", None);
    let calls: Vec<String> = (0..4).map(|_| status(&first, &a)).collect();
    assert_eq!(calls, ["ok", "ok", "ok", "rate_limited"]);
    let next = tight_broker(db, TIGHT, r#"["check_inbox"]"#);
    assert_eq!(
        status(&next, &a),
        "rate_limited",
        "the bucket is the team's"
    );

    // Steps: a turn that made 4 of its 5 on the first daemon (each call
    // a session of its own: the count is the turn's) has one left on the
    // next, which runs it again.
    let steps = "tool_steps_per_turn = 5";
    let (first, next) = (
        tight_broker(db, steps, r#"["check_inbox"]"#),
        tight_broker(db, steps, r#"["check_inbox"]"#),
    );
    let b = create_tight(&first, "b", None);
    let turn = run_turn(&first, &b, None);
    let calls: Vec<String> = (0..4).map(|_| status(&first, &b)).collect();
    assert_eq!(calls, ["ok"; 4]);
    run_turn(&next, &b, Some(turn.clone()));
    assert_eq!(
        [status(&next, &b), status(&next, &b)],
        ["ok".to_string(), "step_limit".into()]
    );
    assert_eq!(next.store().turn_steps(&turn).unwrap(), 5);
}

#[test]
fn a_rate_limited_call_spends_no_step() {
    // SQLite: one daemon alone, its counts in memory.
    if let Some(db) = TestDb::postgres("a_rate_limited_call_spends_no_step") {
        a_rate_limited_call_spends_no_step_on(&db);
    }
}

fn a_rate_limited_call_spends_no_step_on(db: &TestDb) {
    let broker = tight_broker(db, TIGHT, r#"["check_inbox"]"#);
    let a = create_tight(&broker, "a", None);
    let turn = run_turn(&broker, &a, None);
    let calls: Vec<String> = (0..5).map(|_| status(&broker, &a)).collect();
    assert_eq!(calls, ["ok", "ok", "ok", "rate_limited", "rate_limited"]);
    assert_eq!(broker.store().turn_steps(&turn).unwrap(), 3);
}

#[test]
fn daemons_counting_at_once_take_each_token_and_step_once() {
    TestDb::each(
        "daemons_counting_at_once_take_each_token_and_step_once",
        daemons_counting_at_once_take_each_token_and_step_once_on,
    );
}

/// Four daemons (stores of their own), 30 rounds: each round a fresh
/// agent's bucket of 10 (refilled at 1 a minute) and a fresh turn's 7
/// steps, each daemon taking 5 tokens and 4 steps at once: exactly 10 and
/// 7 are taken.
fn daemons_counting_at_once_take_each_token_and_step_once_on(db: &TestDb) {
    const DAEMONS: usize = 4;
    const ROUNDS: usize = 30;
    let setup = db.open();
    let turns: Vec<String> = (0..ROUNDS)
        .map(|round| setup.queue_prompt(&format!("id-{round}"), "go").unwrap())
        .collect();
    let barrier = std::sync::Barrier::new(DAEMONS);
    let (barrier, turns) = (&barrier, &turns);
    let per_daemon: Vec<Vec<(usize, usize)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..DAEMONS)
            .map(|_| {
                let store = db.open();
                scope.spawn(move || {
                    (0..ROUNDS)
                        .map(|round| {
                            barrier.wait();
                            let agent = format!("id-{round}");
                            let tokens = CallLimits {
                                calls: Some((1, 10)),
                                ..CallLimits::default()
                            };
                            let steps = CallLimits {
                                steps: Some((&turns[round], 7)),
                                ..CallLimits::default()
                            };
                            let admitted = |limits: &CallLimits<'_>, times: usize| {
                                (0..times)
                                    .filter(|_| {
                                        store.count_call(&agent, limits).unwrap()
                                            == CallCount::Admitted
                                    })
                                    .count()
                            };
                            (admitted(&tokens, 5), admitted(&steps, 4))
                        })
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for round in 0..ROUNDS {
        let taken = per_daemon.iter().map(|d| d[round]);
        let (tokens, steps) = taken.fold((0, 0), |(t, s), (dt, ds)| (t + dt, s + ds));
        assert_eq!((tokens, steps), (10, 7), "round {round}");
        assert_eq!(setup.turn_steps(&turns[round]).unwrap(), 7);
    }
    // The next token, at 1 a minute, is up to 60 s away.
    let limits = CallLimits {
        calls: Some((1, 10)),
        tool: Some(("t", 1, 1)),
        steps: None,
    };
    let wait = setup.count_call("id-0", &limits).unwrap();
    assert!(
        matches!(wait, CallCount::RateLimited { retry_after_ms } if (1..=60_000).contains(&retry_after_ms)),
        "{wait:?}"
    );
    // A tool's bucket is its own: its refusal counts no step.
    let (agent, turn) = ("id-fresh", setup.queue_prompt("id-fresh", "go").unwrap());
    let fresh = CallLimits {
        steps: Some((&turn, 8)),
        ..limits
    };
    assert_eq!(
        setup.count_call(agent, &fresh).unwrap(),
        CallCount::Admitted
    );
    assert!(matches!(
        setup.count_call(agent, &fresh).unwrap(),
        CallCount::RateLimited { .. }
    ));
    assert_eq!(setup.turn_steps(&turn).unwrap(), 1);
    let steps_only = CallLimits {
        steps: Some((&turn, 1)),
        ..CallLimits::default()
    };
    assert_eq!(
        setup.count_call(agent, &steps_only).unwrap(),
        CallCount::StepLimit
    );
}

/// The cost of a tool call (check_inbox, every limit set, in a running
/// turn), counted in memory and in the store. Run by hand:
/// `cargo test -p substrat-broker --lib tool_call_latency -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, run by hand"]
fn tool_call_latency() {
    TestDb::each("tool_call_latency", tool_call_latency_on);
}

fn tool_call_latency_on(db: &TestDb) {
    const CALLS: usize = 3000;
    let limits = "calls_per_minute = 60000\nburst = 10000\nper_tool_calls_per_minute = 60000\n\
                  per_tool_burst = 10000\ntool_steps_per_turn = 10000";
    let mut broker = tight_broker(db, limits, r#"["check_inbox"]"#);
    for (name, in_store) in [("memory", false), ("store", true), ("memory", false)] {
        broker.counts_in_store = in_store;
        let agent = create_tight(&broker, &format!("{name}-{in_store}-{}", now_ms()), None);
        run_turn(&broker, &agent, None);
        let mut session = Session::new(agent.id.clone());
        let mut took: Vec<u128> = (0..CALLS)
            .map(|_| {
                let start = Instant::now();
                let outcome = broker.call_tool(&mut session, "check_inbox", json!({}));
                assert!(matches!(
                    outcome,
                    ToolOutcome::Result {
                        is_error: false,
                        ..
                    }
                ));
                start.elapsed().as_micros()
            })
            .collect();
        took.sort_unstable();
        let mean = took.iter().sum::<u128>() / CALLS as u128;
        println!(
            "{:?} counts in {name}: mean {mean} us, p50 {} us, p99 {} us ({CALLS} calls)",
            db.engine(),
            took[CALLS / 2],
            took[CALLS * 99 / 100]
        );
    }
}
