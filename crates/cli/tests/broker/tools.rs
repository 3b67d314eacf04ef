//! The agents' tools through the daemon

use super::*;

#[test]
fn agents_sockets_and_state_dir_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let lead = d.create("lead", "worker", None);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.state()), 0o700);
    let socket = PathBuf::from(lead["socket"].as_str().unwrap());
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(
        socket,
        d.state()
            .join("agents")
            .join(lead["id"].as_str().unwrap())
            .join("broker.sock")
    );
    assert!(
        d.agent(&["create", "lead"])
            .unwrap_err()
            .contains("name_taken")
    );
    assert!(
        d.agent(&["create", "x", "--role", "nosuch"])
            .unwrap_err()
            .contains("unknown_role")
    );
    assert!(
        d.agent(&["create", "../evil"])
            .unwrap_err()
            .contains("invalid_name")
    );
    let w1 = d.create("w1", "worker", Some("lead"));
    let mut open_session = d.connect(&w1).init();
    assert!(!open_session.call("check_inbox", json!({})).1);
    assert!(
        d.agent(&["remove", "lead"])
            .unwrap_err()
            .contains("has_children")
    );
    let list = d.agent(&["list"]).unwrap();
    let names: Vec<&str> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lead", "w1"]);
    d.agent(&["remove", "w1"]).unwrap();
    // A session that was open when the agent was removed can do nothing more.
    let (r, err) = open_session.call("check_inbox", json!({}));
    assert!(err && r["error"] == "agent_removed", "{r}");
    let w1_dir = d.state().join("agents");
    let start = Instant::now();
    while std::fs::read_dir(&w1_dir).unwrap().count() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the removed agent's socket stays"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn messaging_team_rules_and_operator_messages() {
    let d = Daemon::start();
    let lead = d.create("lead", "worker", None);
    let w1 = d.create("w1", "worker", Some("lead"));
    d.create("w2", "worker", Some("lead"));
    d.create("stranger", "worker", None);
    let mut lead_c = d.connect(&lead).init();
    let (sent, err) = lead_c.call(
        "send_message",
        json!({"recipient": "w1", "text": "hello", "sync": true}),
    );
    assert!(
        !err && sent["status"] == "sent" && sent["waiting_for_reply"] == true,
        "{sent}"
    );
    // Other teams are not reachable, and look the same as names that do not exist.
    let (refused, err) = lead_c.call(
        "send_message",
        json!({"recipient": "stranger", "text": "x"}),
    );
    let (missing, _) = lead_c.call("send_message", json!({"recipient": "nobody", "text": "x"}));
    assert!(
        err && refused["error"] == "unknown_recipient" && missing["error"] == "unknown_recipient"
    );
    // A sync message and the operator's message are w1's next turns (no
    // provider runs them in this daemon); an async one waits in the inbox.
    d.agent(&["send", "w1", "from the operator"]).unwrap();
    let (async_sent, _) = lead_c.call(
        "send_message",
        json!({"recipient": "w1", "text": "fyi", "sync": false}),
    );
    assert_eq!(async_sent["waiting_for_reply"], false);
    let mut w1_c = d.connect(&w1).init();
    let (inbox, _) = w1_c.call("check_inbox", json!({}));
    let messages = inbox["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{inbox}");
    assert_eq!(
        (messages[0]["from"].as_str(), messages[0]["text"].as_str()),
        (Some("lead"), Some("fyi"))
    );
    assert_eq!(messages[0]["message_id"], async_sent["message_id"]);
    let (empty, _) = w1_c.call("check_inbox", json!({}));
    assert_eq!(
        empty["messages"].as_array().unwrap().len(),
        0,
        "delivered messages are gone"
    );
    let w1_view = d.agent(&["inspect", "w1"]).unwrap()["activity"].clone();
    let prompts: Vec<&str> = w1_view["recent_turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, ["from the operator", "hello"], "newest first");
    assert_eq!(
        (w1_view["state"].as_str(), w1_view["queued_turns"].as_u64()),
        (Some("waiting"), Some(2))
    );
    let lead_view = d.agent(&["inspect", "lead"]).unwrap()["activity"].clone();
    assert_eq!(
        (
            lead_view["state"].as_str(),
            lead_view["awaiting_replies"].as_u64()
        ),
        (Some("waiting"), Some(1)),
        "the lead waits for its sync reply"
    );
    // Siblings and parent are in reach; a broadcast goes to siblings.
    let (reply, _) = w1_c.call(
        "send_message",
        json!({"recipient": "w2", "text": "hi sibling", "sync": false}),
    );
    assert_eq!(reply["status"], "sent");
    let (b, _) = w1_c.call("broadcast", json!({"text": "all"}));
    assert_eq!(b["recipient_count"], 1);
    // inspect_agent: subordinates only.
    let (view, err) = lead_c.call("inspect_agent", json!({"name": "w1"}));
    assert!(
        !err && view["state"] == "waiting"
            && view["recent_messages"].as_array().unwrap().len() >= 3,
        "{view}"
    );
    let (denied, err) = w1_c.call("inspect_agent", json!({"name": "lead"}));
    assert!(err && denied["error"] == "unknown_subordinate");
}

#[test]
fn spawn_agent_rules() {
    let d = Daemon::start();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("src")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.path().join("escape")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
    let lead = d
        .agent(&[
            "create",
            "lead",
            "--role",
            "tight",
            "--workspace",
            ws.path().to_str().unwrap(),
        ])
        .unwrap();
    let mut c = d.connect(&lead).init();
    for (subdir, why) in [
        ("/etc", "absolute"),
        ("../x", ".."),
        ("escape", "symlink out"),
        (
            "out/new",
            "symlink out, with a directory to create beyond it",
        ),
        ("src/../..", ".."),
    ] {
        let (r, err) = c.call(
            "spawn_agent",
            json!({"name": "child", "instructions": "go", "workspace_subdir": subdir}),
        );
        assert!(err && r["error"] == "workspace", "{why}: {r}");
    }
    assert!(
        !outside.path().join("new").exists(),
        "nothing is created through a link"
    );
    let (r, err) = c.call("spawn_agent", json!({"name": "child", "instructions": "build it", "workspace_subdir": "src/child", "role": "tight"}));
    assert!(
        !err && r["status"] == "created" && r["name"] == "child",
        "{r}"
    );
    assert!(ws.path().join("src/child").is_dir());
    // tight: one child at most, depth 1 at most.
    let (r, _) = c.call(
        "spawn_agent",
        json!({"name": "second", "instructions": "x"}),
    );
    assert_eq!(r["error"], "children_limit");
    let child = d.agent(&["inspect", "child"]).unwrap();
    assert_eq!(
        child["agent"]["workspace"],
        ws.path()
            .join("src/child")
            .canonicalize()
            .unwrap()
            .display()
            .to_string()
    );
    let socket = PathBuf::from(child["agent"]["socket"].as_str().unwrap());
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cc = d.connect(&child["agent"]).init();
    let (r, _) = cc.call(
        "spawn_agent",
        json!({"name": "grandchild", "instructions": "x"}),
    );
    assert_eq!(r["error"], "spawn_depth");
    let view = d.agent(&["inspect", "child"]).unwrap()["activity"].clone();
    assert_eq!(
        (
            view["recent_turns"][0]["kind"].as_str(),
            view["recent_turns"][0]["prompt"].as_str()
        ),
        (Some("instructions"), Some("build it")),
        "the instructions are the child's first turn"
    );
}

#[test]
fn scope_cap_and_unknown_tools_look_the_same() {
    let d = Daemon::start();
    let scoped = d.create("s", "scoped", None);
    let tight = d.create("t", "tight", None);
    let mut c = d.connect(&scoped).init();
    assert_eq!(c.tool_names(), ["send_message", "check_inbox"]);
    let out_of_scope = c.request(
        "tools/call",
        json!({"name": "spawn_agent", "arguments": {"name": "x", "instructions": "y"}}),
    );
    let unknown = c.request(
        "tools/call",
        json!({"name": "no_such_tool", "arguments": {}}),
    );
    assert_eq!(out_of_scope["error"]["code"], unknown["error"]["code"]);
    assert_eq!(
        out_of_scope["error"]["message"]
            .as_str()
            .unwrap()
            .replace("spawn_agent", "X"),
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .replace("no_such_tool", "X")
    );
    let mut t = d.connect(&tight).init();
    assert_eq!(
        t.tool_names(),
        ["send_message", "broadcast", "check_inbox", "spawn_agent"],
        "cap of 4, built-ins in order"
    );
    let over_cap = t.request(
        "tools/call",
        json!({"name": "inspect_agent", "arguments": {"name": "x"}}),
    );
    assert_eq!(over_cap["error"]["code"], -32602);
}

#[test]
fn rate_and_step_limits() {
    let d = Daemon::start();
    let limited = d.create("l", "limited", None);
    let mut c = d.connect(&limited).init();
    for _ in 0..3 {
        assert!(!c.call("check_inbox", json!({})).1);
    }
    let (r, err) = c.call("check_inbox", json!({}));
    assert!(
        err && r["status"] == "rate_limited" && r["retry_after_ms"].as_u64().unwrap() > 0,
        "{r}"
    );
    // The bucket refills at one a second.
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!c.call("check_inbox", json!({})).1);

    let stepped = d.create("st", "stepped", None);
    let mut c = d.connect(&stepped).init();
    for _ in 0..3 {
        assert!(!c.call("check_inbox", json!({})).1);
    }
    let (r, err) = c.call("check_inbox", json!({}));
    assert!(err && r["status"] == "step_limit" && r["limit"] == 3, "{r}");
    // A new session is a new turn.
    let mut again = d.connect(&stepped).init();
    assert!(!again.call("check_inbox", json!({})).1);
    let audit = d.audit();
    assert!(
        audit.contains("\"reason\":\"rate_limited\"")
            && audit.contains("\"reason\":\"step_limit\"")
    );
}

#[test]
fn message_size_inbox_depth_and_output_truncation() {
    let d = Daemon::start();
    let boss = d.create("boss", "worker", None);
    let t = d.create("t", "tight", Some("boss"));
    let mut tc = d.connect(&t).init();
    let (r, err) = tc.call(
        "send_message",
        json!({"recipient": "boss", "text": "x".repeat(101)}),
    );
    assert!(err && r["error"] == "message_too_large", "{r}");
    let mut bc = d.connect(&boss).init();
    let long = "é".repeat(400); // 800 bytes each, within the worker's own limit
    for _ in 0..2 {
        assert_eq!(
            bc.call(
                "send_message",
                json!({"recipient": "t", "text": long, "sync": false})
            )
            .0["status"],
            "sent"
        );
    }
    let (r, err) = bc.call(
        "send_message",
        json!({"recipient": "t", "text": "one more"}),
    );
    assert!(
        err && r["error"] == "inbox_full",
        "nothing is dropped silently: {r}"
    );
    // 1,600 bytes of messages in a 1 KiB output limit.
    let (body, _) = tc.call("check_inbox", json!({}));
    let text = body.as_str().expect("a truncated result is text");
    assert!(text.contains("[substrat: output truncated,"), "{text}");
    assert!(text.len() <= 1024, "{}", text.len());
}

#[test]
fn broadcast_fanout_is_limited() {
    let d = Daemon::start();
    d.create("boss", "worker", None);
    let t = d.create("t", "tight", Some("boss"));
    d.create("s1", "worker", Some("boss"));
    let mut c = d.connect(&t).init();
    let (r, err) = c.call("broadcast", json!({"text": "hi"}));
    assert!(
        !err && r["recipient_count"] == 1,
        "one sibling fits a fan-out of 1: {r}"
    );
    d.create("s2", "worker", Some("boss"));
    let (r, err) = c.call("broadcast", json!({"text": "hi"}));
    assert!(err && r["error"] == "broadcast_fanout", "{r}");
}

/// check_inbox gives at most the role's list limit of messages: at the
/// limit all, one past it the limit and a note; the rest stays queued and
/// comes with the next call (nothing is dropped).
#[test]
fn check_inbox_keeps_to_the_list_limit_and_loses_nothing() {
    let d = Daemon::start();
    let boss = d.create("boss", "worker", None);
    let l = d.create("l", "lister", Some("boss"));
    let mut bc = d.connect(&boss).init();
    let mut lc = d.connect(&l).init();
    let send = |bc: &mut Conn, text: &str| {
        let (r, err) = bc.call(
            "send_message",
            json!({"recipient": "l", "text": text, "sync": false}),
        );
        assert!(!err, "{r}");
    };
    let texts = |body: &Value| -> Vec<String> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap().to_string())
            .collect()
    };
    // At the limit.
    send(&mut bc, "1");
    send(&mut bc, "2");
    let (body, _) = lc.call("check_inbox", json!({}));
    assert_eq!(texts(&body), ["1", "2"]);
    assert!(body.get("more_queued").is_none(), "{body}");
    // One past it.
    for t in ["3", "4", "5"] {
        send(&mut bc, t);
    }
    let (body, _) = lc.call("check_inbox", json!({}));
    assert_eq!(texts(&body), ["3", "4"]);
    assert_eq!(body["more_queued"], 1, "{body}");
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("mcp.max_list_entries = 2"),
        "{body}"
    );
    let (body, _) = lc.call("check_inbox", json!({}));
    assert_eq!(texts(&body), ["5"]);
}
