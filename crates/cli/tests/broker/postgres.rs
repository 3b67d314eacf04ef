//! The daemon with its state in PostgreSQL (`--state postgres://...`),
//! where SUBSTRAT_TEST_POSTGRES names a database (CI: scripts/postgres).
//! Each test has a schema of its own in it.

use super::*;

#[test]
fn daemons_on_postgres_share_the_team_and_lose_nothing_on_kill_9() {
    let test = "daemons_on_postgres_share_the_team_and_lose_nothing_on_kill_9";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let d = Daemon::start_with(tempfile::tempdir().unwrap(), &["--state", &url]);
    let lead = d.create("lead", "bulk", None);
    d.create("w", "bulk", Some("lead"));
    let mut c = d.connect(&lead).init();
    let mut acknowledged = Vec::new();
    for i in 0..50 {
        let (r, _) = c.call(
            "send_message",
            json!({"recipient": "w", "text": format!("m{i}"), "sync": false}),
        );
        acknowledged.push(r["message_id"].as_str().unwrap().to_string());
    }
    // The state is in the database, and nowhere else.
    assert!(!d.state().join("state.db").exists());
    assert_eq!(schema.query("SELECT count(*) FROM agents"), "2");
    assert_eq!(
        schema.query("SELECT count(*) FROM messages WHERE status = 'queued'"),
        "50"
    );
    assert_eq!(
        schema.query("SELECT max(version) FROM schema_migrations"),
        "3"
    );

    // A second daemon (another state directory, the address from the
    // environment) serves the same team: it lists the agents and where
    // they run, and leaves to their daemon what changes them.
    let second = tempfile::tempdir().unwrap();
    let mut other = Command::new(bin())
        .args(["daemon", "--policies"])
        .arg(repo().join("tests/broker/policies"))
        .arg("--state-dir")
        .arg(second.path().join("state"))
        .env("SUBSTRAT_STATE", &url)
        .env("SUBSTRAT_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let control = second.path().join("state/control.sock");
    let start = Instant::now();
    while UnixStream::connect(&control).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the second daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let listed = agent_json(&second.path().join("state"), &["list"]).unwrap();
    let first_name = format!(":{}", d.state().canonicalize().unwrap().display());
    for agent in listed["agents"].as_array().unwrap() {
        let daemon = &agent["daemon"];
        assert_eq!(daemon["here"], false, "{agent}");
        assert!(
            daemon["daemon"].as_str().unwrap().ends_with(&first_name),
            "{agent}"
        );
    }
    let refused = agent_json(&second.path().join("state"), &["suspend", "w"]).unwrap_err();
    assert!(refused.contains("`w` runs on daemon"), "{refused}");
    // Messages sent through it reach the agent on the first.
    let sent = agent_json(
        &second.path().join("state"),
        &["send", "w", "from the second"],
    )
    .unwrap();
    assert!(sent["message_id"].is_string(), "{sent}");
    let _ = other.kill();
    let _ = other.wait();

    // A copy of the first's state directory (its daemon id) is refused
    // while the first runs: the same agents' turns would run twice.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir(copy.path().join("state")).unwrap();
    std::fs::copy(
        d.state().join("daemon.id"),
        copy.path().join("state/daemon.id"),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["daemon", "--state-dir"])
        .arg(copy.path().join("state"))
        .env("SUBSTRAT_STATE", &url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the state database is in use: another process runs daemon"),
        "{err}"
    );

    // Killed: a new daemon on the same database loses nothing it acknowledged.
    let dir = d.kill9();
    let d = Daemon::start_with(dir, &["--state", &url]);
    let w = d.agent(&["inspect", "w"]).unwrap();
    let mut wc = d.connect(&w["agent"]).init();
    let (inbox, _) = wc.call("check_inbox", json!({}));
    let ids: Vec<String> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, acknowledged);
    // The operator's message through the second daemon waits as w's next
    // turn (no provider here runs it).
    assert_eq!(
        schema.query("SELECT count(*) FROM turns t JOIN messages m ON m.id = t.message_id WHERE t.status = 'queued' AND m.text = 'from the second'"),
        "1"
    );
}

#[test]
fn a_bad_state_address_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let start = |state: &str| {
        let out = Command::new(bin())
            .args(["daemon", "--state", state, "--state-dir"])
            .arg(dir.path().join("state"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = start("/var/lib/state.db");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is neither sqlite:PATH nor a postgres://"),
        "{err}"
    );
    // Nothing listens at this port: refused, the password never shown.
    let (code, err) = start("postgres://u:hunter2@127.0.0.1:9/db?connect_timeout=2");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("the state database is unavailable"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // TLS to the database is not offered yet: an address asking for it
    // is refused, not served in the clear.
    let (code, err) = start("postgres://u@127.0.0.1:9/db?sslmode=require");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("TLS to the database is not supported yet"),
        "{err}"
    );
    assert!(!dir.path().join("state/control.sock").exists());
}
