//! The call path and the team's rules, on a broker over a real store in a
//! temporary directory (no daemon, no sockets).

use super::*;

fn agent(id: &str, parent: Option<&str>) -> Agent {
    Agent {
        id: id.into(),
        name: id.into(),
        role: "worker".into(),
        parent_id: parent.map(str::to_string),
        workspace: None,
        depth: u32::from(parent.is_some()),
        created_at: 0,
        model: None,
    }
}

#[test]
fn parents_children_and_siblings_may_message_strangers_not() {
    let (boss, a, b) = (
        agent("boss", None),
        agent("a", Some("boss")),
        agent("b", Some("boss")),
    );
    let (other_root, stranger) = (agent("other", None), agent("s", Some("other")));
    let may = Broker::may_message;
    assert!(may(&boss, &a) && may(&a, &boss), "parent and child");
    assert!(may(&a, &b) && may(&b, &a), "siblings");
    assert!(!may(&a, &stranger) && !may(&stranger, &boss), "strangers");
    assert!(!may(&a, &a), "itself");
    assert!(!may(&boss, &other_root), "two roots are not siblings");
}

/// A broker with the shipped worker role, in `dir`.
fn broker(dir: &Path) -> Broker {
    let store = Store::open(&dir.join("state.db")).unwrap();
    let audit = Audit::open(&dir.join("audit.log")).unwrap();
    let worker = substrat_policy::load_builtin("worker", &Default::default())
        .unwrap()
        .unwrap();
    let roles = Roles::from([("worker".to_string(), worker)]);
    Broker::new(store, roles, dir.to_path_buf(), audit)
}

fn create(broker: &Broker, name: &str, parent: Option<&Agent>) -> Agent {
    broker
        .create_agent(NewAgent {
            name: name.into(),
            role: "worker".into(),
            parent: parent.cloned(),
            ..NewAgent::default()
        })
        .unwrap()
}

/// The body of a tool result, and whether it is an error result.
fn call(broker: &Broker, from: &Agent, tool: &str, args: Value) -> (Value, bool) {
    let mut session = Session::new(from.id.clone());
    match broker.call_tool(&mut session, tool, args) {
        ToolOutcome::Result { body, is_error } => (body, is_error),
        other => panic!("{tool}: {other:?}"),
    }
}

#[test]
fn messages_follow_the_team_and_land_in_the_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let boss = create(&broker, "boss", None);
    let a = create(&broker, "a", Some(&boss));
    let b = create(&broker, "b", Some(&boss));
    let loner = create(&broker, "loner", None);
    let (_, refused) = call(
        &broker,
        &loner,
        "send_message",
        json!({"recipient": "a", "text": "hi"}),
    );
    assert!(refused, "a stranger's message is refused");
    // An async message waits in the inbox (a sync one is the next turn).
    let args = json!({"recipient": "b", "text": "hi", "sync": false});
    let (body, is_error) = call(&broker, &a, "send_message", args);
    assert!(!is_error, "{body}");
    let (inbox, _) = call(&broker, &b, "check_inbox", json!({}));
    let text = inbox.to_string();
    assert!(text.contains("\"hi\"") && text.contains("\"a\""), "{text}");
    // Read once: the inbox is empty afterwards.
    let (again, _) = call(&broker, &b, "check_inbox", json!({}));
    assert!(!again.to_string().contains("\"hi\""), "{again}");
    assert!(broker.is_subordinate(&boss, &a).unwrap());
    assert!(!broker.is_subordinate(&a, &boss).unwrap());
}

#[test]
fn unknown_tools_and_bad_arguments_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let boss = create(&broker, "boss", None);
    let mut session = Session::new(boss.id.clone());
    assert!(matches!(
        broker.call_tool(&mut session, "no_such_tool", json!({})),
        ToolOutcome::UnknownTool
    ));
    assert!(matches!(
        broker.call_tool(&mut session, "send_message", json!({"recipient": 5})),
        ToolOutcome::InvalidArguments(_)
    ));
}
