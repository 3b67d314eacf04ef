//! What the planner reads of the daemons table (issue 42's attacks): a
//! row another daemon wrote is checked before it is believed.

use super::db::args;
use super::testdb::TestDb;
use super::testdb::agent;
use super::*;
use crate::placement::Plan;

fn seated(db: &TestDb, daemon: &str) -> Store {
    let mut store = db.open();
    store.take_seat(Seat {
        daemon_id: daemon.into(),
        lease_ms: 30_000,
    });
    store.register_daemon(&format!("host:/{daemon}")).unwrap();
    store
        .declare_runs(&super::race_tests::worker_runs(), &["cli".into()])
        .unwrap();
    store
}

/// Inserts `name` placed on `on` by `maker`; returns where it went.
fn place(maker: &mut Store, name: &str, on: &str) -> String {
    let plan = Plan {
        daemon_id: on.into(),
        here: false,
        reason: "placed: test".into(),
        policy_hash: "h".into(),
    };
    let start = AgentStart {
        created_by: None,
        persona: None,
        role_args: None,
        first: None,
        placement: Some(&plan),
    };
    maker.insert_new_agent(&agent(name), &start).unwrap()
}

fn live(store: &Store, id: &str) -> Option<crate::placement::Candidate> {
    store
        .live_daemons()
        .unwrap()
        .into_iter()
        .find(|d| d.id == id)
}

#[test]
fn a_negative_max_agents_is_no_free_slot() {
    TestDb::each("a_negative_max_agents_is_no_free_slot", |db| {
        let mut maker = seated(db, "maker");
        let target = seated(db, "target");
        target
            .db
            .execute(
                "UPDATE daemons SET max_agents = -1 WHERE id = 'target'",
                &[],
            )
            .unwrap();
        let seen = live(&maker, "target").unwrap();
        assert_eq!((seen.max_agents, seen.free()), (Some(0), 0));
        // The settle under the row lock refuses it too.
        assert_eq!(place(&mut maker, "n", "target"), "maker");
    });
}

#[test]
fn a_heartbeat_in_the_future_is_not_alive() {
    TestDb::each("a_heartbeat_in_the_future_is_not_alive", |db| {
        let mut maker = seated(db, "maker");
        let target = seated(db, "target");
        target
            .declare_offer(&Offer {
                max_agents: Some(4),
                ..Offer::default()
            })
            .unwrap();
        assert!(live(&maker, "target").is_some());
        // Ten leases ahead: it would look alive for five minutes.
        target
            .db
            .execute(
                "UPDATE daemons SET heartbeat_at = heartbeat_at + 300000 WHERE id = 'target'",
                &[],
            )
            .unwrap();
        assert_eq!(live(&maker, "target"), None);
        assert_eq!(place(&mut maker, "f", "target"), "maker");
        let why = maker
            .agent_daemons()
            .unwrap()
            .into_iter()
            .find(|r| r.agent_id == "id-f")
            .and_then(|r| r.why);
        assert_eq!(
            why.as_deref(),
            Some("here: daemon host:/target, chosen, stopped answering")
        );
    });
}

#[test]
fn declared_paths_that_are_not_plain_absolute_paths_are_dropped() {
    TestDb::each(
        "declared_paths_that_are_not_plain_absolute_paths_are_dropped",
        |db| {
            let maker = seated(db, "maker");
            let target = seated(db, "target");
            let paths =
                r#"["/srv/team", "relative", "/srv/../etc", "/srv/a\u001b[2Jb", "/srv/ok"]"#;
            target
                .db
                .execute(
                    "UPDATE daemons SET shared_paths = ?1, state_dir = ?2 WHERE id = 'target'",
                    args![paths, "/var/lib/s\u{1b}]0;pwned\u{7}"],
                )
                .unwrap();
            let seen = live(&maker, "target").unwrap();
            let expected: Vec<std::path::PathBuf> = vec!["/srv/team".into(), "/srv/ok".into()];
            assert_eq!(seen.shared_paths, expected);
            assert!(
                !maker
                    .daemon_socket_dirs()
                    .unwrap()
                    .iter()
                    .any(|(id, _)| id == "target"),
                "a state_dir with control characters is not used"
            );
        },
    );
}

/// A failed (or killed) agent runs no turns: its slot is free again. A
/// suspended one keeps it (it may be resumed).
#[test]
fn only_agents_not_failed_hold_a_slot() {
    TestDb::each("only_agents_not_failed_hold_a_slot", |db| {
        let mut maker = seated(db, "maker");
        let mut target = seated(db, "target");
        target
            .declare_offer(&Offer {
                max_agents: Some(2),
                ..Offer::default()
            })
            .unwrap();
        assert_eq!(place(&mut maker, "a", "target"), "target");
        assert_eq!(place(&mut maker, "b", "target"), "target");
        assert_eq!(place(&mut maker, "c", "target"), "maker");
        target
            .set_agent_state("id-a", StoredState::Failed, Some("killed"))
            .unwrap();
        target
            .set_agent_state("id-b", StoredState::Suspended, None)
            .unwrap();
        assert_eq!(live(&maker, "target").unwrap().free(), 1);
        assert_eq!(place(&mut maker, "d", "target"), "target");
        assert_eq!(place(&mut maker, "e", "target"), "maker");
        // Removed: no row, no slot.
        assert!(target.remove_agent("id-d").unwrap());
        assert_eq!(live(&maker, "target").unwrap().free(), 1);
    });
}

/// Under the chosen daemon's row lock: it must run the agent's role with
/// the policy the plan names, and the agent's CLI.
#[test]
fn a_daemon_not_running_the_role_or_cli_gets_no_agent() {
    TestDb::each("a_daemon_not_running_the_role_or_cli_gets_no_agent", |db| {
        let mut maker = seated(db, "maker");
        let target = seated(db, "target");
        target
            .declare_offer(&Offer {
                max_agents: Some(8),
                ..Offer::default()
            })
            .unwrap();
        let why = |maker: &Store, id: &str| {
            maker
                .agent_daemons()
                .unwrap()
                .into_iter()
                .find(|r| r.agent_id == id)
                .and_then(|r| r.why)
        };
        assert_eq!(place(&mut maker, "same", "target"), "target");
        // Another policy under the role's name.
        let other: std::collections::BTreeMap<String, String> =
            [("worker".to_string(), "other".to_string())].into();
        target.declare_runs(&other, &["cli".into()]).unwrap();
        assert_eq!(place(&mut maker, "policy", "target"), "maker");
        assert_eq!(
            why(&maker, "id-policy").as_deref(),
            Some("here: daemon host:/target, chosen, does not run role worker as here")
        );
        // The role, not the CLI the agent names.
        target
            .declare_runs(&super::race_tests::worker_runs(), &["cli".into()])
            .unwrap();
        let mut named = agent("named");
        named.provider = Some("other-cli".into());
        let plan = Plan {
            daemon_id: "target".into(),
            here: false,
            reason: "placed: test".into(),
            policy_hash: "h".into(),
        };
        let start = AgentStart {
            created_by: None,
            persona: None,
            role_args: None,
            first: None,
            placement: Some(&plan),
        };
        assert_eq!(maker.insert_new_agent(&named, &start).unwrap(), "maker");
        named.provider = Some("cli".into());
        named.id = "id-named2".into();
        named.name = "named2".into();
        assert_eq!(maker.insert_new_agent(&named, &start).unwrap(), "target");
    });
}
