//! Several daemons on one database, each through a store (a connection)
//! of its own: claims under contention, adoption, leases. On both engines.

use std::collections::{HashMap, HashSet};

use super::db::args;
use super::race_tests::worker_runs;
use super::testdb::TestDb;
use super::*;

fn seat(id: &str, lease_ms: i64) -> Seat {
    Seat {
        daemon_id: id.into(),
        lease_ms,
    }
}

fn agent(name: &str, parent: Option<&str>) -> Agent {
    Agent {
        id: format!("id-{name}"),
        name: name.into(),
        role: "worker".into(),
        parent_id: parent.map(|p| format!("id-{p}")),
        workspace: None,
        depth: u32::from(parent.is_some()),
        created_at: now_ms(),
        model: None,
        provider: None,
    }
}

fn done(turn: &ClaimedTurn) -> TurnFinish<'_> {
    TurnFinish {
        turn_id: &turn.id,
        session_id: Some("s"),
        outcome: TurnOutcome::Done {
            result: "ok".into(),
        },
        tool_calls: "[]".into(),
        notes: "{}".into(),
    }
}

#[test]
fn two_daemons_adopt_each_agent_once_and_run_each_turn_once() {
    TestDb::each(
        "two_daemons_adopt_each_agent_once_and_run_each_turn_once",
        two_daemons_adopt_each_agent_once_and_run_each_turn_once_on,
    );
}

fn two_daemons_adopt_each_agent_once_and_run_each_turn_once_on(db: &TestDb) {
    const AGENTS: usize = 60;
    const TURNS_EACH: usize = 4;
    let setup = db.open();
    let mut queued = HashSet::new();
    for i in 0..AGENTS {
        setup
            .insert_agent(&agent(&format!("a{i}"), None), None)
            .unwrap();
        for t in 0..TURNS_EACH {
            queued.insert(
                setup
                    .queue_prompt(&format!("id-a{i}"), &format!("t{t}"))
                    .unwrap(),
            );
        }
    }
    // Nobody's yet, as in a database from before daemons were recorded.
    setup
        .db
        .execute("UPDATE agents SET daemon_id = NULL", &[])
        .unwrap();
    let start = std::sync::Barrier::new(2);
    let run = |id: &'static str| {
        let mut store = db.open();
        store.take_seat(seat(id, 30_000));
        store.register_daemon(id).unwrap();
        // Agents no daemon ran go to one that runs their role.
        store.declare_runs(&worker_runs(), &[]).unwrap();
        let start = &start;
        move || {
            start.wait();
            let (mut adopted, mut ran) = (Vec::new(), Vec::new());
            let mut idle = 0;
            while idle < 20 {
                adopted.extend(
                    store
                        .adopt_agents(2, true)
                        .unwrap()
                        .into_iter()
                        .map(|a| a.id),
                );
                let turns = store.claim_turns(8).unwrap();
                idle = if turns.is_empty() { idle + 1 } else { 0 };
                for turn in &turns {
                    assert!(store.finish_turn(&done(turn)).unwrap());
                    ran.push((turn.id.clone(), turn.agent.id.clone()));
                }
                // The other daemon's turn to take some (a daemon adopts
                // a few per beat, and beats are far apart).
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            (adopted, ran)
        }
    };
    let (a, b) = (run("daemon-a"), run("daemon-b"));
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = scope.spawn(b);
        (a.join().unwrap(), b.join().unwrap())
    });
    // Every agent adopted by exactly one daemon.
    let mut owner = HashMap::new();
    for (daemon, adopted) in [("daemon-a", &a.0), ("daemon-b", &b.0)] {
        for agent in adopted {
            assert!(
                owner.insert(agent.clone(), daemon).is_none(),
                "{agent} adopted twice"
            );
        }
    }
    assert_eq!(owner.len(), AGENTS);
    // Every turn run exactly once, by its agent's daemon.
    let mut seen = HashSet::new();
    for (daemon, ran) in [("daemon-a", &a.1), ("daemon-b", &b.1)] {
        for (turn, agent) in ran {
            assert!(seen.insert(turn.clone()), "turn {turn} ran twice");
            assert_eq!(owner[agent], daemon, "{turn} ran off its agent's daemon");
        }
    }
    assert_eq!(seen, queued);
    assert!(!a.1.is_empty() && !b.1.is_empty(), "both daemons took part");
}

#[test]
fn a_silent_daemons_turns_fail_after_their_lease_and_its_agents_move() {
    TestDb::each(
        "a_silent_daemons_turns_fail_after_their_lease_and_its_agents_move",
        a_silent_daemons_turns_fail_after_their_lease_and_its_agents_move_on,
    );
}

fn a_silent_daemons_turns_fail_after_their_lease_and_its_agents_move_on(db: &TestDb) {
    let mut a = db.open();
    a.take_seat(seat("daemon-a", 200));
    a.register_daemon("host-a").unwrap();
    a.declare_runs(&worker_runs(), &[]).unwrap();
    a.insert_agent(&agent("lead", None), None).unwrap();
    a.insert_agent(&agent("w", Some("lead")), None).unwrap();
    let sync = NewMessage {
        from: Sender {
            id: "id-lead",
            name: "lead",
        },
        to_id: "id-w",
        text: "q",
        sync: true,
        kind: MessageKind::Message,
        delivery: Delivery::Turn,
        thread: None,
        dedupe_key: None,
    };
    a.send(&[sync], None).unwrap();
    a.set_agent_session("id-w", "session-on-a").unwrap();
    let running = a.claim_turns(4).unwrap();
    assert_eq!(running.len(), 1);

    let mut b = db.open();
    b.take_seat(seat("daemon-b", 200));
    b.register_daemon("host-b").unwrap();
    b.declare_runs(&worker_runs(), &[]).unwrap();
    // A beats its heart: its turn's lease holds, its agents stay.
    a.heartbeat(&[running[0].id.clone()]).unwrap();
    assert_eq!(b.expire_leases().unwrap(), 0);
    assert!(b.adopt_agents(8, true).unwrap().is_empty());
    assert!(b.claim_turns(4).unwrap().is_empty(), "not b's agents");
    // A falls silent.
    std::thread::sleep(std::time::Duration::from_millis(300));
    b.heartbeat(&[]).unwrap();
    assert_eq!(b.expire_leases().unwrap(), 1);
    // The turn failed; its agent did not (it did nothing wrong).
    let turns = b.recent_turns("id-w", 5).unwrap();
    assert_eq!(turns[0].status, TurnStatus::Failed);
    assert!(
        turns[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("lease"),
        "{turns:?}"
    );
    assert_eq!(b.agent_status("id-w").unwrap().state, AgentState::Idle);
    // A's late answer changes nothing: the sender was told once.
    assert!(!a.finish_turn(&done(&running[0])).unwrap());
    let kinds: Vec<&str> = b
        .all_messages()
        .unwrap()
        .iter()
        .map(|m| m.kind.as_str())
        .collect();
    assert_eq!(kinds, ["message", "no_reply"]);
    // B takes A's agents; their sessions stay on A's host.
    let mut moved: Vec<String> = b
        .adopt_agents(8, true)
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    moved.sort();
    assert_eq!(moved, ["lead", "w"]);
    assert_eq!(b.agent_status("id-w").unwrap().session_id, None);
    let next = b.claim_turns(4).unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].message.as_ref().unwrap().kind, MessageKind::NoReply);
    assert!(a.claim_turns(4).unwrap().is_empty(), "a runs nothing now");
    // A restarted B queues its own running turn again, nobody else's.
    let daemons = b.daemons().unwrap();
    assert_eq!(
        daemons.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["host-a", "host-b"]
    );
    assert_eq!(a.recover_running().unwrap(), 0);
    assert_eq!(b.recover_running().unwrap(), 1);
    let owners =
        b.db.rows("SELECT DISTINCT daemon_id FROM agents", args![])
            .unwrap();
    assert_eq!(owners.len(), 1);
}

#[test]
fn a_queued_turn_is_announced_to_the_daemon_that_runs_its_agent() {
    let Some(db) = TestDb::postgres("a_queued_turn_is_announced_to_the_daemon_that_runs_its_agent")
    else {
        return;
    };
    let mut store = db.open();
    store.take_seat(seat("daemon-a", 30_000));
    store.insert_agent(&agent("a", None), None).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let url = match db.location() {
        StateDatabase::Postgres(url) => url,
        StateDatabase::Sqlite(_) => unreachable!(),
    };
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let _ = listen_for_turns(&url, |payload| {
                let _ = tx.send(payload.to_string());
            })
            .await;
        });
    });
    // The listener may not listen yet: turns are queued until one is heard.
    let heard = (0..50).find_map(|_| {
        store.queue_prompt("id-a", "hello").unwrap();
        rx.recv_timeout(std::time::Duration::from_millis(100)).ok()
    });
    assert_eq!(heard.as_deref(), Some("daemon-a"));
}

#[test]
fn the_teams_budget_holds_across_daemons() {
    TestDb::each(
        "the_teams_budget_holds_across_daemons",
        the_teams_budget_holds_across_daemons_on,
    );
}

fn the_teams_budget_holds_across_daemons_on(db: &TestDb) {
    // Two daemons ask at once, 20 times each, for a team of 7 a minute.
    let start = std::sync::Barrier::new(2);
    let ask = || {
        let store = db.open();
        let start = &start;
        move || {
            start.wait();
            (0..20)
                .filter(|_| store.team_admit(Some(7), None).unwrap() == TeamAdmission::Admitted)
                .count()
        }
    };
    let (a, b) = (ask(), ask());
    let admitted = std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = scope.spawn(b);
        a.join().unwrap() + b.join().unwrap()
    });
    // Unless the minute turned in between (then up to twice).
    assert!(admitted == 7 || admitted == 14, "{admitted} admitted");
    match db.open().team_admit(Some(7), None).unwrap() {
        TeamAdmission::MinuteSpent { retry_after_s } => assert!((1..=60).contains(&retry_after_s)),
        TeamAdmission::Admitted => assert_eq!(admitted, 7, "a new minute"),
        other => panic!("{other:?}"),
    }
    // Tokens: what every daemon's agents used today counts.
    let (one, two) = (db.open(), db.open());
    one.add_model_usage("id-a", "anthropic", 60, 20).unwrap();
    assert_eq!(
        two.team_admit(None, Some(100)).unwrap(),
        TeamAdmission::Admitted
    );
    two.add_model_usage("id-b", "openai", 15, 5).unwrap();
    assert_eq!(
        one.team_admit(None, Some(100)).unwrap(),
        TeamAdmission::DaySpent
    );
    assert_eq!(
        one.team_admit(None, Some(101)).unwrap(),
        TeamAdmission::Admitted
    );
}

#[test]
fn a_connection_lost_inside_a_transaction_commits_none_of_it() {
    let Some(db) = TestDb::postgres("a_connection_lost_inside_a_transaction_commits_none_of_it")
    else {
        return;
    };
    let store = db.open();
    let admin = db.admin().unwrap();
    let insert = "INSERT INTO server_switches (server, enabled, updated_at) VALUES (?1, 1, 0)";
    let outcome = store.db.transaction(|tx| {
        tx.execute(insert, args!["first"])?;
        let pid: i64 = tx
            .one("SELECT CAST(pg_backend_pid() AS BIGINT)", &[])?
            .get(0)?;
        admin.execute(
            "SELECT pg_terminate_backend(CAST(?1 AS INTEGER))",
            args![pid],
        )?;
        std::thread::sleep(std::time::Duration::from_millis(200));
        tx.execute(insert, args!["second"])?;
        tx.execute(insert, args!["third"])?;
        Ok(())
    });
    let error = outcome.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    // Nothing of the transaction, not even a statement on a new connection.
    assert!(store.server_switches().unwrap().is_empty());
    store.set_server_enabled("after", true).unwrap();
    assert_eq!(store.server_switches().unwrap().len(), 1);
}

#[test]
fn a_call_past_its_bound_is_cancelled_and_the_daemon_keeps_its_lock() {
    let Some(db) =
        TestDb::postgres("a_call_past_its_bound_is_cancelled_and_the_daemon_keeps_its_lock")
    else {
        return;
    };
    let mut store = db.open();
    store.take_seat(seat("daemon-a", 30_000));
    store.hold_daemon_lock().unwrap();
    let slow = store.db.execute(
        "INSERT INTO server_switches (server, enabled, updated_at) SELECT 'slow', 1, 0 FROM pg_sleep(8)",
        &[],
    );
    let error = slow.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    // The next call connects again and takes the lock back from the
    // connection it gave up on, which the server had not seen go.
    store.set_server_enabled("next", true).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    let names: Vec<String> = store
        .server_switches()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["next"],
        "the slow insert was cancelled, not committed late"
    );
    // And another process with this daemon's id is still refused.
    let mut copy = db.open();
    copy.take_seat(seat("daemon-a", 30_000));
    let refused = copy.hold_daemon_lock().unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("another process runs daemon daemon-a"),
        "{refused}"
    );
}

#[test]
fn concurrent_claims_never_run_two_turns_of_one_agent() {
    TestDb::each(
        "concurrent_claims_never_run_two_turns_of_one_agent",
        concurrent_claims_never_run_two_turns_of_one_agent_on,
    );
}

/// Two connections claiming for one daemon at once (as two schedulers
/// would): the agent's row lock and the check made under it keep each
/// agent to one running turn, and each turn is claimed once.
fn concurrent_claims_never_run_two_turns_of_one_agent_on(db: &TestDb) {
    let setup = db.open();
    let mut queued = HashSet::new();
    for i in 0..20 {
        setup
            .insert_agent(&agent(&format!("c{i}"), None), None)
            .unwrap();
        for t in 0..5 {
            queued.insert(
                setup
                    .queue_prompt(&format!("id-c{i}"), &format!("t{t}"))
                    .unwrap(),
            );
        }
    }
    let start = std::sync::Barrier::new(2);
    let run = || {
        let mut store = db.open();
        let start = &start;
        move || {
            start.wait();
            let (mut ran, mut idle) = (Vec::new(), 0);
            while idle < 20 {
                let turns = store.claim_turns(4).unwrap();
                idle = if turns.is_empty() { idle + 1 } else { 0 };
                for turn in &turns {
                    let running: i64 = store
                        .db
                        .one(
                            "SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'running'",
                            args![turn.agent.id],
                        )
                        .unwrap()
                        .get(0)
                        .unwrap();
                    assert_eq!(running, 1, "two turns of {} at once", turn.agent.name);
                    assert!(store.finish_turn(&done(turn)).unwrap());
                    ran.push(turn.id.clone());
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            ran
        }
    };
    let (a, b) = (run(), run());
    let ran = std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = scope.spawn(b);
        let mut ran = a.join().unwrap();
        ran.extend(b.join().unwrap());
        ran
    });
    let once: HashSet<String> = ran.iter().cloned().collect();
    assert_eq!(once.len(), ran.len(), "a turn ran twice");
    assert_eq!(once, queued);
}

#[test]
fn the_teams_day_is_reserved_across_daemons() {
    TestDb::each(
        "the_teams_day_is_reserved_across_daemons",
        the_teams_day_is_reserved_across_daemons_on,
    );
}

/// Two daemons reserve 300 tokens at once, ten times each, from a team's
/// day of 1,000: the room is taken while used and reserved are under it,
/// so exactly four (0, 300, 600, 900), whatever the interleaving.
fn the_teams_day_is_reserved_across_daemons_on(db: &TestDb) {
    let start = std::sync::Barrier::new(2);
    let ask = |daemon: &'static str| {
        let store = db.open();
        let start = &start;
        move || {
            start.wait();
            (0..10)
                .filter(|n| {
                    let id = format!("{daemon}-{n}");
                    store.team_reserve(1000, &id, 300, 60_000).unwrap() == TeamAdmission::Admitted
                })
                .count()
        }
    };
    let (a, b) = (ask("a"), ask("b"));
    let admitted = std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = scope.spawn(b);
        a.join().unwrap() + b.join().unwrap()
    });
    assert_eq!(admitted, 4);
    let store = db.open();
    assert_eq!(
        store.team_admit(None, Some(1000)).unwrap(),
        TeamAdmission::DaySpent,
        "reserved counts as held"
    );
    // The requests end: their usage recorded, their reservations gone.
    for id in ["a-0", "a-1", "a-2", "a-3", "b-0", "b-1", "b-2", "b-3"] {
        store.team_release(id).unwrap();
    }
    store.add_model_usage("id-a", "anthropic", 50, 50).unwrap();
    assert_eq!(
        store.team_reserve(1000, "c-0", 300, 60_000).unwrap(),
        TeamAdmission::Admitted
    );
    // A reservation past its time (its daemon stopped) holds nothing.
    store.team_release("c-0").unwrap();
    assert_eq!(
        store.team_reserve(1000, "d-0", 5000, -1).unwrap(),
        TeamAdmission::Admitted
    );
    assert_eq!(
        store.team_admit(None, Some(101)).unwrap(),
        TeamAdmission::Admitted
    );
    store.prune_team_minutes().unwrap();
    assert_eq!(
        store.team_admit(None, Some(100)).unwrap(),
        TeamAdmission::DaySpent
    );
}

/// Adoption judges the adopter as placement does: a daemon that does not
/// run the agent's role, runs it with another policy, or does not
/// declare the shared path the dead daemon reached the workspace under,
/// does not take the agent; it waits (still the dead daemon's) for one
/// that can.
#[test]
fn only_a_daemon_that_can_run_an_agent_adopts_it() {
    TestDb::each(
        "only_a_daemon_that_can_run_an_agent_adopts_it",
        only_a_daemon_that_can_run_an_agent_adopts_it_on,
    );
}

fn only_a_daemon_that_can_run_an_agent_adopts_it_on(db: &TestDb) {
    let shared = |paths: &[&str]| Offer {
        shared_paths: paths.iter().map(std::path::PathBuf::from).collect(),
        ..Offer::default()
    };
    let daemon = |id: &str, roles: &[(&str, &str)], paths: &[&str]| {
        let mut store = db.open();
        store.take_seat(seat(id, 200));
        store.register_daemon(&format!("host-{id}")).unwrap();
        let roles = roles
            .iter()
            .map(|(r, h)| (r.to_string(), h.to_string()))
            .collect();
        store.declare_runs(&roles, &[]).unwrap();
        store.declare_offer(&shared(paths)).unwrap();
        store
    };
    let a = daemon("daemon-a", &[("worker", "h")], &["/srv/team"]);
    let mut w = agent("w", None);
    w.workspace = Some("/srv/team/project".into());
    a.insert_agent(&w, None).unwrap();
    let mut others = [
        daemon("no-role", &[("reviewer", "h")], &["/srv/team"]),
        daemon("other-policy", &[("worker", "h2")], &["/srv/team"]),
        daemon("not-shared", &[("worker", "h")], &["/srv"]),
    ];
    // a falls silent; the others beat for a lease and judge it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    for store in &mut others {
        store.heartbeat(&[]).unwrap();
        assert!(
            store.adopt_agents(8, true).unwrap().is_empty(),
            "{} adopted w",
            store.seat().daemon_id
        );
    }
    let owner = |store: &Store| store.agent_daemon("id-w").unwrap();
    assert_eq!(owner(&a).as_deref(), Some("daemon-a"), "w waits");
    let mut able = daemon(
        "able",
        &[("worker", "h"), ("reviewer", "h")],
        &["/srv/team"],
    );
    able.heartbeat(&[]).unwrap();
    let taken: Vec<String> = able
        .adopt_agents(8, true)
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(taken, ["w"]);
    assert_eq!(owner(&a).as_deref(), Some("able"));
}

/// Adoption is judged when the agent has no daemon, and when its dead
/// daemon's row declares no policy for the role (svcfin b): an agent no
/// daemon ran is taken only by a daemon that runs its role; one whose
/// daemon declares no policy for its role waits (it was judged by the
/// adopter's own policy: any policy).
#[test]
fn adoption_is_judged_without_a_daemon_or_a_declared_policy() {
    TestDb::each(
        "adoption_is_judged_without_a_daemon_or_a_declared_policy",
        |db: &TestDb| {
            let daemon = |id: &str, roles: &[(&str, &str)]| {
                let mut store = db.open();
                store.take_seat(seat(id, 200));
                store.register_daemon(&format!("host-{id}")).unwrap();
                let roles = roles
                    .iter()
                    .map(|(r, h)| (r.to_string(), h.to_string()))
                    .collect();
                store.declare_runs(&roles, &[]).unwrap();
                store
            };
            let a = daemon("daemon-a", &[("worker", "strict")]);
            a.insert_agent(&agent("w", None), None).unwrap();
            a.insert_agent(&agent("v", None), None).unwrap();
            // The attack: v has no daemon; a's row stops declaring worker.
            let sql = "UPDATE agents SET daemon_id = NULL WHERE name = 'v'";
            assert_eq!(a.write_as_attacker(sql).unwrap(), 1);
            let sql = "UPDATE daemons SET roles = '{}' WHERE id = 'daemon-a'";
            assert_eq!(a.write_as_attacker(sql).unwrap(), 1);
            let mut loose = daemon("loose", &[("worker", "loose-policy")]);
            let mut none = daemon("no-worker", &[("reviewer", "x")]);
            std::thread::sleep(std::time::Duration::from_millis(300));
            let adopted = |store: &mut Store| -> Vec<String> {
                store.heartbeat(&[]).unwrap();
                let taken = store.adopt_agents(8, true).unwrap();
                taken.into_iter().map(|a| a.name).collect()
            };
            assert!(adopted(&mut none).is_empty(), "no worker role: nothing");
            assert_eq!(adopted(&mut loose), ["v"], "w waits for a declared policy");
            assert_eq!(
                loose.agent_daemon("id-w").unwrap().as_deref(),
                Some("daemon-a")
            );
        },
    );
}
