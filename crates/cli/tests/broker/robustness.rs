//! What a hostile or broken client, a second daemon and kill -9 cannot do.

use super::*;

#[test]
fn identity_cannot_be_claimed() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let b = d.create("b", "worker", Some("a"));
    // A relay started for b, pointed at a's socket.
    let mut c = d.connect(&a);
    c.send(&json!({"jsonrpc": "2.0", "method": "notifications/substrat/relay", "params": {"agent_id": b["id"]}}));
    let reply = c.recv();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    let mut rest = String::new();
    assert_eq!(
        c.reader.read_to_string(&mut rest).unwrap(),
        0,
        "the connection is closed"
    );
    // `_meta` or arguments naming another agent.
    let mut c = d.connect(&b).init();
    let r = c.request("tools/call", json!({"name": "send_message", "arguments": {"recipient": "a", "text": "x"}, "_meta": {"agent_id": a["id"]}}));
    assert_eq!(r["error"]["code"], -32600);
    let r = c.request(
        "tools/call",
        json!({"name": "send_message", "arguments": {"recipient": "a", "text": "x", "from": "a"}}),
    );
    assert_eq!(r["error"]["code"], -32600);
    let audit = d.audit();
    assert!(
        audit.contains("relay_agent_id_mismatch") && audit.matches("identity_spoof").count() == 2,
        "{audit}"
    );
    // The correct relay hello is accepted.
    let mut ok = d.connect(&b);
    ok.send(&json!({"jsonrpc": "2.0", "method": "notifications/substrat/relay", "params": {"agent_id": b["id"]}}));
    let mut ok = ok.init();
    assert_eq!(ok.tool_names().len(), 5);
}

#[test]
fn bad_input_gets_errors_and_the_connection_goes_on() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let mut c = d.connect(&a);
    let r = c.request("tools/list", json!({}));
    assert_eq!(r["error"]["code"], -32002, "before initialize: {r}");
    let mut c = c.init();
    c.send_raw(b"this is not json\n");
    assert_eq!(c.recv()["error"]["code"], -32700);
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"\n");
    assert_eq!(c.recv()["error"]["code"], -32700, "truncated JSON");
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"\xff\xfe\"}\n");
    assert_eq!(c.recv()["error"]["code"], -32700, "invalid UTF-8");
    c.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}]\n");
    assert_eq!(
        c.recv()["error"]["message"],
        "batch requests are not supported"
    );
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"ping\",\"params\":{{\"x\":\"{}\"}}}}\n",
        "a".repeat(20 << 20)
    );
    c.send_raw(big.as_bytes());
    assert_eq!(c.recv()["error"]["code"], -32600, "a 20 MB line");
    c.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}));
    assert_eq!(c.recv()["id"], 9);
    c.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}));
    assert_eq!(
        c.recv()["error"]["message"],
        "duplicate request id in this session"
    );
    let r = c.request("no/such/method", json!({}));
    assert_eq!(r["error"]["code"], -32601);
    let r = c.request(
        "tools/call",
        json!({"name": "send_message", "arguments": {"recipient": "a"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "missing argument: {r}");
    let r = c.request(
        "tools/call",
        json!({"name": "send_message", "arguments": {"recipient": 3, "text": "x"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "wrong type: {r}");
    // Found by fuzzing (mcp_request_path): lines rmcp cannot parse went
    // unanswered. Duplicate keys are malformed JSON here (which `id` would
    // one answer?), and a `params` of the wrong shape gets an error with its id.
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":31,\"method\":\"tools/lj\",\"id\":31}\n");
    let r = c.recv();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key `id`"),
        "{r}"
    );
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":32,\"method\":\"tools/call\",\"params\":5}\n");
    let r = c.recv();
    assert_eq!(
        (r["id"].as_i64(), r["error"]["code"].as_i64()),
        (Some(32), Some(-32602)),
        "{r}"
    );
    // Still serving this connection and others.
    assert_eq!(c.tool_names().len(), 5);
    assert_eq!(d.connect(&a).init().tool_names().len(), 5);
}

#[test]
fn too_many_connections_and_a_slow_reader_do_not_stop_others() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let socket = PathBuf::from(a["socket"].as_str().unwrap());
    // A client that sends and never reads.
    let mut slow = UnixStream::connect(&socket).unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "slow", "version": "1"}}});
    slow.write_all(format!("{init}\n").as_bytes()).unwrap();
    slow.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    for i in 2..3000 {
        if slow
            .write_all(
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}\n").as_bytes(),
            )
            .is_err()
        {
            break;
        }
    }
    // 500 connections at once.
    let mut streams: Vec<UnixStream> = (0..500)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let mut refused = 0;
    for s in streams.iter_mut() {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut line = String::new();
        if BufReader::new(&*s)
            .read_line(&mut line)
            .is_ok_and(|n| n > 0)
            && line.contains("too many connections")
        {
            refused += 1;
        }
    }
    assert!(refused >= 480, "{refused} of 500 refused");
    drop(streams);
    // Everyone else is still served.
    let start = Instant::now();
    let mut c = loop {
        let mut probe = Conn::open(&socket);
        // Until the refused connections' slots are free again the daemon
        // may still refuse and close this one too: the write can then fail.
        let sent = probe
            .stream
            .write_all(format!("{init}\n").as_bytes())
            .is_ok();
        let mut line = String::new();
        if sent && probe.reader.read_line(&mut line).is_ok() && line.contains("\"result\"") {
            break probe;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the socket recovers"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    c.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(c.tool_names().len(), 5);
    let b = d.create("b", "worker", None);
    assert_eq!(d.connect(&b).init().tool_names().len(), 5);
    drop(slow);
}

#[test]
fn a_second_daemon_on_the_same_state_dir_is_refused() {
    let d = Daemon::start();
    let control = d.state().join("control.sock");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = inode(&control);
    let out = Command::new(bin())
        .args(["daemon", "--policies"])
        .arg(repo().join("tests/broker/policies"))
        .arg("--state-dir")
        .arg(d.state())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("in use by another daemon (pid {})", d.child.id())),
        "{stderr}"
    );
    // The first daemon's socket is the same file and still answers.
    assert_eq!(inode(&control), before);
    assert!(d.agent(&["list"]).is_ok());
}

#[test]
fn a_daemon_refuses_a_destinations_file_it_cannot_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let start = |body: Option<&str>| {
        let file = dir.path().join("destinations.toml");
        match body {
            Some(body) => std::fs::write(&file, body).unwrap(),
            None => {
                let _ = std::fs::remove_file(&file);
            }
        }
        let out = Command::new(bin())
            .args(["daemon", "--provider", "none", "--policies"])
            .arg(repo().join("tests/broker/policies"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--destinations")
            .arg(&file)
            .env("SUBSTRAT_LOG", "error")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = start(None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot read the destinations file"), "{err}");
    let (code, err) = start(Some("[[destination]]\nname = \"m\"\nhost = \"m.test\"\n"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("missing field `networks`"), "{err}");
    let (code, err) = start(Some(
        "[[destination]]\nname = \"m\"\nhost = \"*\"\nnetworks = [\"10.0.0.0/8\"]\n",
    ));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("destination `m`: `host = \"*\"` would let every name resolve"),
        "{err}"
    );
}

#[test]
fn kill_9_loses_no_acknowledged_message_and_no_agent() {
    let d = Daemon::start();
    let lead = d.create("lead", "bulk", None);
    d.create("w", "bulk", Some("lead"));
    let mut c = d.connect(&lead).init();
    let mut acknowledged = Vec::new();
    for i in 0..500 {
        let (r, _) = c.call(
            "send_message",
            json!({"recipient": "w", "text": format!("m{i}"), "sync": false}),
        );
        acknowledged.push(
            r["message_id"]
                .as_str()
                .unwrap_or_else(|| panic!("message {i}: {r}"))
                .to_string(),
        );
    }
    let dir = d.kill9();
    let d = Daemon::start_in(dir);
    let list = d.agent(&["list"]).unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 2);
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
}

/// The relay serves a client on a socket pair (libuv's child stdio), on
/// pipes and on a regular file alike (the last through tokio's blocking
/// stdio): each gets its answers, in order.
#[test]
fn the_relay_serves_stdio_of_every_kind() {
    use std::os::fd::OwnedFd;
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let relay = Path::new(bin()).with_file_name("substrat-mcp-server");
    let requests = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"check_inbox","arguments":{}}}"#,
        "\n"
    );
    let command = || {
        let mut c = Command::new(&relay);
        c.args(["--agent-id", a["id"].as_str().unwrap()])
            .env("SUBSTRAT_SOCKET", a["socket"].as_str().unwrap());
        c
    };
    let answers = |output: &str| -> Vec<Value> {
        output
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let check = |kind: &str, output: &str| {
        let lines = answers(output);
        assert_eq!(lines.len(), 2, "{kind}: {output}");
        assert_eq!(lines[0]["id"], 1, "{kind}: {output}");
        assert_eq!(lines[1]["id"], 2, "{kind}: {output}");
        assert_eq!(lines[1]["result"]["isError"], false, "{kind}: {output}");
    };
    // A socket pair for stdin and stdout.
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let mut child = command()
        .stdin(Stdio::from(OwnedFd::from(theirs.try_clone().unwrap())))
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .unwrap();
    ours.write_all(requests.as_bytes()).unwrap();
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    let mut output = String::new();
    ours.read_to_string(&mut output).unwrap();
    assert!(child.wait().unwrap().success());
    check("socket pair", &output);
    // Pipes.
    let mut child = command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(requests.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    check("pipes", &String::from_utf8_lossy(&out.stdout));
    // A regular file as stdin.
    let file = d.dir.path().join("requests");
    std::fs::write(&file, requests).unwrap();
    let out = command()
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    check("file", &String::from_utf8_lossy(&out.stdout));
}

/// A NUL byte cannot reach a turn (its launch's exec cannot carry one):
/// it is refused where it is given, the field named, over the control
/// socket (a spawn's role argument, `agent send`) and MCP (spawn_agent's
/// instructions and role arguments, send_message, broadcast). Before, each
/// was accepted and its turn failed at launch, again at every retry.
#[test]
fn text_a_launch_cannot_carry_is_refused_where_it_is_given() {
    let d = Daemon::start();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let control = |request: Value| {
        let mut stream = UnixStream::connect(d.state().join("control.sock")).unwrap();
        stream.write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    let nul = "the\u{0}rest";
    let reply = control(json!({"op": "spawn", "name": "r", "role": "responder",
        "workspace": ws, "instructions": "go", "args": {"service": nul}}));
    assert_eq!(reply["error"], "uncarried_text", "{reply}");
    assert_eq!(
        reply["message"],
        "role argument `service`: contains a NUL byte, which a launch cannot carry"
    );
    let reply = control(json!({"op": "spawn", "name": "r", "role": "worker",
        "workspace": ws, "instructions": nul}));
    assert_eq!(
        reply["message"], "the instructions: contains a NUL byte, which a launch cannot carry",
        "{reply}"
    );
    let lead = d.create("lead", "worker", None);
    d.create("kid", "worker", Some("lead"));
    let reply = control(json!({"op": "send", "name": "lead", "text": nul}));
    assert_eq!(
        reply["message"], "the text: contains a NUL byte, which a launch cannot carry",
        "{reply}"
    );
    let mut c = d.connect(&lead).init();
    for (tool, args, field) in [
        (
            "spawn_agent",
            json!({"name": "s", "role": "responder", "instructions": "go",
            "role_args": {"service": nul}}),
            "role argument `service`",
        ),
        (
            "spawn_agent",
            json!({"name": "s", "instructions": nul}),
            "the instructions",
        ),
        (
            "send_message",
            json!({"recipient": "kid", "text": nul}),
            "the text",
        ),
        ("broadcast", json!({"text": nul}), "the text"),
    ] {
        let (body, is_error) = c.call(tool, args);
        assert!(is_error, "{tool}: {body}");
        assert_eq!(body["error"], "uncarried_text", "{tool}: {body}");
        assert_eq!(
            body["message"],
            format!("{field}: contains a NUL byte, which a launch cannot carry"),
            "{tool}"
        );
    }
    // Nothing was left behind: no other agent, no message, no turn.
    let db = rusqlite::Connection::open(d.state().join("state.db")).unwrap();
    let count = |table: &str| -> i64 {
        db.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(count("agents"), 2);
    assert_eq!(count("messages"), 0);
    assert_eq!(count("turns"), 0);
}
