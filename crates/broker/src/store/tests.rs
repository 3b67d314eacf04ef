//! The store against a real SQLite file and, where one is given, a real
//! PostgreSQL database (testdb.rs): every test but the SQLite legacy one
//! runs on both.

use super::testdb::TestDb;
use super::*;
use crate::upstream::menu::PinState;

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

#[test]
fn agents_messages_and_inbox_depth() {
    TestDb::each(
        "agents_messages_and_inbox_depth",
        agents_messages_and_inbox_depth_on,
    );
}

fn agents_messages_and_inbox_depth_on(db: &TestDb) {
    let mut store = db.open();
    store.insert_agent(&agent("lead", None), None).unwrap();
    store
        .insert_agent(&agent("w1", Some("lead")), None)
        .unwrap();
    assert!(
        store
            .insert_agent(&agent("w1", Some("lead")), None)
            .is_err(),
        "names are unique"
    );
    assert_eq!(store.children("id-lead").unwrap().len(), 1);
    let from = Sender {
        id: "id-lead",
        name: "lead",
    };
    let msg = |text| NewMessage {
        from: from.clone(),
        to_id: "id-w1",
        text,
        sync: false,
        kind: MessageKind::Message,
        delivery: Delivery::Inbox,
        thread: None,
        dedupe_key: None,
    };
    let sent = store
        .send(&[msg("a"), msg("b"), msg("c")], Some(2))
        .unwrap();
    assert!(
        sent[0].is_some() && sent[1].is_some() && sent[2].is_none(),
        "the third does not fit"
    );
    assert_eq!(store.queued_count("id-w1").unwrap(), 2);
    let inbox = store.take_inbox("id-w1", 5000).unwrap().0;
    assert_eq!(
        inbox.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(store.take_inbox("id-w1", 5000).unwrap().0.is_empty());
    // Durable: a new connection sees the same state.
    drop(store);
    let store = db.open();
    assert_eq!(store.recent_messages("id-w1", 10).unwrap().len(), 2);
    assert_eq!(store.agent_by_name("w1").unwrap().unwrap().depth, 1);
}

fn turn_message<'a>(
    from: &'a str,
    to: &'a str,
    text: &'a str,
    key: Option<&str>,
) -> NewMessage<'a> {
    NewMessage {
        from: Sender {
            id: from,
            name: from.trim_start_matches("id-"),
        },
        to_id: to,
        text,
        sync: true,
        kind: MessageKind::Message,
        delivery: Delivery::Turn,
        thread: None,
        dedupe_key: key.map(String::from),
    }
}

#[test]
fn a_sync_message_is_a_turn_and_its_answer_the_senders_next_turn() {
    TestDb::each(
        "a_sync_message_is_a_turn_and_its_answer_the_senders_next_turn",
        a_sync_message_is_a_turn_and_its_answer_the_senders_next_turn_on,
    );
}

fn a_sync_message_is_a_turn_and_its_answer_the_senders_next_turn_on(db: &TestDb) {
    let mut store = db.open();
    store.insert_agent(&agent("lead", None), None).unwrap();
    store
        .insert_agent(&agent("w1", Some("lead")), None)
        .unwrap();
    let first = store
        .send(&[turn_message("id-lead", "id-w1", "q1", Some("t#1"))], None)
        .unwrap();
    let again = store
        .send(&[turn_message("id-lead", "id-w1", "q1", Some("t#1"))], None)
        .unwrap();
    assert_eq!(first, again, "a re-run finds the first message");
    store
        .send(&[turn_message("id-lead", "id-w1", "q2", None)], None)
        .unwrap();
    assert!(
        store.take_inbox("id-w1", 5000).unwrap().0.is_empty(),
        "turns are not inbox messages"
    );
    assert_eq!(
        store.agent_status("id-lead").unwrap().state,
        AgentState::Waiting
    );
    // One turn per agent at a time, oldest first.
    let claimed = store.claim_turns(5).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.as_ref().unwrap().text, "q1");
    assert!(store.claim_turns(5).unwrap().is_empty());
    assert_eq!(store.agent_status("id-w1").unwrap().state, AgentState::Busy);
    // A restart queues it again.
    assert_eq!(store.recover_running().unwrap(), 1);
    let claimed = store.claim_turns(5).unwrap();
    assert_eq!(
        (claimed[0].attempt, claimed[0].id.clone()),
        (2, claimed[0].id.clone())
    );
    store
        .finish_turn(&TurnFinish {
            turn_id: &claimed[0].id,
            session_id: Some("s-1"),
            outcome: TurnOutcome::Done {
                result: "a1".into(),
            },
            tool_calls: "[]".into(),
            notes: "{}".into(),
        })
        .unwrap();
    let reply = store.claim_turns(5).unwrap();
    let lead_turn = reply.iter().find(|t| t.agent.id == "id-lead").unwrap();
    let m = lead_turn.message.as_ref().unwrap();
    assert_eq!(
        (m.kind.as_str(), m.text.as_str(), m.from_name.as_str()),
        ("reply", "a1", "w1")
    );
    assert_eq!(m.thread, first[0].clone().unwrap());
    let w1_turn = reply.iter().find(|t| t.agent.id == "id-w1").unwrap();
    assert_eq!(
        w1_turn.session_id.as_deref(),
        Some("s-1"),
        "the next turn resumes"
    );
    // A failed turn fails its agent and still answers the sender.
    store
        .finish_turn(&TurnFinish {
            turn_id: &w1_turn.id,
            session_id: None,
            outcome: TurnOutcome::Failed {
                reason: "boom".into(),
            },
            tool_calls: "[]".into(),
            notes: "{}".into(),
        })
        .unwrap();
    let status = store.agent_status("id-w1").unwrap();
    assert_eq!(
        (status.state.as_str(), status.reason.as_deref()),
        ("failed", Some("boom"))
    );
    let kinds: Vec<&str> = store
        .all_messages()
        .unwrap()
        .into_iter()
        .map(|m| m.kind.as_str())
        .collect();
    assert_eq!(kinds, ["message", "message", "reply", "no_reply"]);
}

#[test]
fn an_older_database_gains_the_new_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE agents (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL, parent_id TEXT, workspace TEXT, depth INTEGER NOT NULL, created_at INTEGER NOT NULL);
             INSERT INTO agents VALUES ('id-old', 'old', 'worker', NULL, NULL, 0, 1);",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.agent_by_name("old").unwrap().unwrap().model, None);
    assert_eq!(
        store.agent_status("id-old").unwrap().state,
        AgentState::Idle
    );
    // It is at the latest version now, each step recorded once.
    let all: Vec<i64> = (1..=super::latest_version()).collect();
    assert_eq!(versions(&store), all);
}

fn versions(store: &Store) -> Vec<i64> {
    let rows = store
        .db
        .rows(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .unwrap();
    rows.iter().map(|r| r.get(0).unwrap()).collect()
}

#[test]
fn migrations_run_once_in_order_and_a_newer_database_is_refused() {
    TestDb::each(
        "migrations_run_once_in_order_and_a_newer_database_is_refused",
        migrations_run_once_in_order_and_a_newer_database_is_refused_on,
    );
}

fn migrations_run_once_in_order_and_a_newer_database_is_refused_on(db: &TestDb) {
    let all: Vec<i64> = (1..=super::latest_version()).collect();
    assert_eq!(versions(&db.open()), all);
    let store = db.open();
    assert_eq!(versions(&store), all, "a second open applies nothing");
    // Written by a newer build: refused, and left as it was.
    let newer = super::latest_version() + 1;
    store
        .db
        .execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, 'future', 0)",
            db::args![newer],
        )
        .unwrap();
    let refused = Store::open_at(&db.location()).map(|_| ()).unwrap_err();
    assert!(
        matches!(refused, StoreError::Newer { found, known } if found == newer && known == newer - 1),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("newer substrat-sandbox"),
        "{refused}"
    );
    let mut expected = all.clone();
    expected.push(newer);
    assert_eq!(versions(&store), expected);
}

#[test]
fn removing_an_agent_answers_whoever_waits_on_it() {
    TestDb::each(
        "removing_an_agent_answers_whoever_waits_on_it",
        removing_an_agent_answers_whoever_waits_on_it_on,
    );
}

fn removing_an_agent_answers_whoever_waits_on_it_on(db: &TestDb) {
    let mut store = db.open();
    store.insert_agent(&agent("lead", None), None).unwrap();
    store
        .insert_agent(&agent("w1", Some("lead")), None)
        .unwrap();
    store
        .send(&[turn_message("id-lead", "id-w1", "q", None)], None)
        .unwrap();
    assert_eq!(store.agent_status("id-lead").unwrap().awaiting_replies, 1);
    assert!(store.remove_agent("id-w1").unwrap());
    assert_eq!(store.agent_status("id-lead").unwrap().awaiting_replies, 0);
    let next = store.claim_turns(5).unwrap();
    let m = next[0].message.as_ref().unwrap();
    assert_eq!(
        (next[0].agent.id.as_str(), m.kind.as_str(), m.text.as_str()),
        (
            "id-lead",
            "no_reply",
            "its turn failed: the agent was removed"
        )
    );
    assert!(!store.remove_agent("id-w1").unwrap());
}

#[test]
fn pins_trust_first_sight_and_quarantine_changes_until_approved() {
    TestDb::each(
        "pins_trust_first_sight_and_quarantine_changes_until_approved",
        pins_trust_first_sight_and_quarantine_changes_until_approved_on,
    );
}

fn pins_trust_first_sight_and_quarantine_changes_until_approved_on(db: &TestDb) {
    let store = db.open();
    let q = |why: &str| PinState::Quarantined(why.to_string());
    assert_eq!(
        store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
        PinState::Approved
    );
    assert_eq!(
        store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
        PinState::Approved
    );
    let changed = "its definition changed since it was approved";
    assert_eq!(
        store.check_pin("s", "t", 0, "h2", "{}", None).unwrap(),
        q(changed)
    );
    // Changing back does not lift the quarantine: an operator decides.
    assert_eq!(
        store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
        q(changed)
    );
    assert_eq!(
        store.approve_pin("s", "t", "h2").unwrap(),
        Approval::Mismatch("h1".into()),
        "a short or wrong hash approves nothing"
    );
    assert_eq!(
        store.approve_pin("s", "t", "h1").unwrap(),
        Approval::Mismatch("h1".into()),
        "at least 12 characters"
    );
    store
        .check_pin("s", "t", 0, "h1aaaaaaaaaaaaa", "{}", None)
        .unwrap();
    assert_eq!(
        store.approve_pin("s", "t", "h1aaaaaaaaaa").unwrap(),
        Approval::Approved
    );
    assert_eq!(
        store
            .check_pin("s", "t", 0, "h1aaaaaaaaaaaaa", "{}", None)
            .unwrap(),
        PinState::Approved
    );
    assert_eq!(
        store
            .check_pin("s", "hidden", 1, "h", "{}", Some("hidden character"))
            .unwrap(),
        q("hidden character")
    );
    assert_eq!(
        store.approve_pin("s", "never", "h1aaaaaaaaaa").unwrap(),
        Approval::Unknown
    );
    let pins = store.pins().unwrap();
    assert_eq!(pins.len(), 2);
    assert_eq!(
        (pins[0].tool.as_str(), pins[0].state.as_str()),
        ("t", "approved"),
        "in listed order"
    );
}

#[test]
fn model_usage_is_counted_per_agent_and_day_and_survives_a_reopen() {
    TestDb::each(
        "model_usage_is_counted_per_agent_and_day_and_survives_a_reopen",
        model_usage_is_counted_per_agent_and_day_and_survives_a_reopen_on,
    );
}

fn model_usage_is_counted_per_agent_and_day_and_survives_a_reopen_on(db: &TestDb) {
    {
        let store = db.open();
        store.add_model_usage("id-a", "anthropic", 10, 5).unwrap();
        store.add_model_usage("id-a", "openai", 1, 2).unwrap();
        store.add_model_usage("id-b", "gemini", 7, 0).unwrap();
        // An earlier day counts in all, not today.
        store
            .db
            .execute(
                "INSERT INTO model_usage (agent_id, day, api, requests, input_tokens, output_tokens)
                 VALUES ('id-a', 1, 'anthropic', 3, 100, 100)",
                &[],
            )
            .unwrap();
    }
    let store = db.open();
    assert_eq!(
        store.model_tokens_today().unwrap(),
        [("id-a".to_string(), 18), ("id-b".to_string(), 7)]
    );
    let a = store.model_usage("id-a").unwrap();
    assert_eq!((a.requests_today, a.tokens_today, a.requests), (2, 18, 5));
    assert_eq!((a.input_tokens, a.output_tokens), (111, 107));
}

#[test]
fn server_switches_outlast_the_store() {
    TestDb::each(
        "server_switches_outlast_the_store",
        server_switches_outlast_the_store_on,
    );
}

fn server_switches_outlast_the_store_on(db: &TestDb) {
    {
        let store = db.open();
        store.set_server_enabled("web", false).unwrap();
        store.set_server_enabled("fs", true).unwrap();
        store.set_server_enabled("web", true).unwrap();
        store.set_server_enabled("git", false).unwrap();
    }
    let store = db.open();
    assert_eq!(
        store.server_switches().unwrap(),
        [
            ("fs".to_string(), true),
            ("git".to_string(), false),
            ("web".to_string(), true)
        ]
    );
}

#[test]
fn a_new_agent_is_stored_with_its_first_turn_or_not_at_all() {
    TestDb::each(
        "a_new_agent_is_stored_with_its_first_turn_or_not_at_all",
        a_new_agent_is_stored_with_its_first_turn_or_not_at_all_on,
    );
}

fn a_new_agent_is_stored_with_its_first_turn_or_not_at_all_on(db: &TestDb) {
    let mut store = db.open();
    let first = |to: &'static str, key: &'static str| NewMessage {
        from: Sender {
            id: "operator",
            name: "operator",
        },
        to_id: to,
        text: "go",
        sync: false,
        kind: MessageKind::Instructions,
        delivery: Delivery::Turn,
        thread: None,
        dedupe_key: Some(key.to_string()),
    };
    let start = |to, key| AgentStart {
        created_by: Some("spawn-key"),
        persona: Some("You lead."),
        role_args: Some("{\"n\":1}"),
        first: Some(first(to, key)),
        placement: None,
    };
    let lead = agent("lead", None);
    store
        .insert_new_agent(&lead, &start("id-lead", "k1"))
        .unwrap();
    assert_eq!(
        store.agent_persona("id-lead").unwrap().as_deref(),
        Some("You lead.")
    );
    assert_eq!(
        store.agent_role_args("id-lead").unwrap().as_deref(),
        Some("{\"n\":1}")
    );
    assert_eq!(
        store.agent_created_by("spawn-key").unwrap().map(|a| a.id),
        Some(lead.id)
    );
    assert_eq!(
        store.queued_count("id-lead").unwrap(),
        1,
        "its first turn is queued"
    );
    // The first message fails (its dedupe key is taken): the agent is
    // not stored either.
    let w1 = agent("w1", Some("lead"));
    let mut failing = start("id-w1", "k1");
    failing.created_by = None;
    assert!(store.insert_new_agent(&w1, &failing).is_err());
    assert!(store.agent_by_id("id-w1").unwrap().is_none());
    assert_eq!(store.queued_count("id-w1").unwrap(), 0);
}
