//! Roles as MCP prompts; upstream servers' network by category.

use super::*;

#[test]
fn prompts_are_the_roles() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let mut c = d.connect(&a).init();
    let list = c.request("prompts/list", json!({}));
    let names: Vec<&str> = list["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for role in ["worker", "reviewer", "strict", "tight", "scoped"] {
        assert!(names.contains(&role), "{names:?}");
    }
    let prompt = c.request("prompts/get", json!({"name": "scoped"}));
    let text = prompt["result"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains("worker agent")
            && text.ends_with("Tools in scope for this role: send_message, check_inbox."),
        "{text}"
    );
    assert_eq!(
        c.request("prompts/get", json!({"name": "nope"}))["error"]["code"],
        -32602
    );
}

#[test]
fn upstream_servers_get_network_only_in_the_network_category() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(
        policies.join("net.toml"),
        "version = 1\nextends = \"worker\"\nnetwork = \"host\"\n",
    )
    .unwrap();
    let start = |servers: &str| {
        let file = dir.path().join("upstreams.json");
        std::fs::write(&file, format!("{{\"mcpServers\": {{{servers}}}}}")).unwrap();
        let out = Command::new(bin())
            .args(["daemon", "--policies"])
            .arg(&policies)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--upstreams")
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = start(r#""s": {"command": "x", "category": "system", "policy": "net"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("only category network servers get network"),
        "{err}"
    );
    let (code, err) = start(r#""n": {"command": "x", "category": "network", "policy": "worker"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("they need a policy with it"), "{err}");
    let (code, err) = start(r#""u": {"command": "x", "policy": "nope"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("policy `nope` is not a known role"), "{err}");
    // The valid pairing starts (the server itself may not: `x` is no program).
    let file = dir.path().join("ok.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"n": {"command": "x", "category": "network", "policy": "net"}}}"#,
    )
    .unwrap();
    let mut daemon = Command::new(bin())
        .args(["daemon", "--policies"])
        .arg(&policies)
        .arg("--state-dir")
        .arg(dir.path().join("state-ok"))
        .arg("--upstreams")
        .arg(&file)
        .env("SUBSTRAT_LOG", "error")
        .spawn()
        .unwrap();
    let control = dir.path().join("state-ok/control.sock");
    let start = Instant::now();
    while UnixStream::connect(&control).is_err() {
        assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
}
