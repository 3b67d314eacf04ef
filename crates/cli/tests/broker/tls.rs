//! Relays on other hosts (`daemon --listen-tls`, `agent cert`): the real
//! relay binary over TCP with mutual TLS; the agent it speaks for is the
//! one its certificate was issued to, and nothing else gets in.

use super::*;

/// The relay's answers to `requests`, and whether it ended well, as the
/// agent `agent_id` with the credentials in `dir`.
fn remote_relay(addr: &str, dir: &Path, agent_id: &str, requests: &str) -> (Vec<Value>, bool) {
    let mut child = Command::new(Path::new(bin()).with_file_name("substrat-mcp-server"))
        .args(["--agent-id", agent_id])
        .env("SUBSTRAT_BROKER", format!("tls://{addr}"))
        .env("SUBSTRAT_TLS_DIR", dir)
        .env_remove("SUBSTRAT_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(requests.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answers = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (answers, out.status.success())
}

fn session(text: &str) -> String {
    [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send_message","arguments":{"recipient":"b","text":text,"sync":false}}}),
    ]
    .iter()
    .map(|v| format!("{v}\n"))
    .collect()
}

/// Whether the send (id 2) went through.
fn sent(answers: &[Value]) -> bool {
    answers
        .iter()
        .any(|a| a["id"] == 2 && a["result"]["isError"] == false)
}

/// Whether the daemon said the certificate speaks for no agent.
fn refused(answers: &[Value]) -> bool {
    answers.iter().any(|a| {
        a["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("speaks for no agent"))
    })
}

fn issue(d: &Daemon, name: &str, out: &Path, replace: bool) -> Value {
    let out = out.to_str().unwrap();
    let mut args = vec!["cert", name, "--out", out];
    if replace {
        args.push("--replace");
    }
    d.agent(&args).unwrap()
}

fn listening(d: &Daemon) -> String {
    let file = d.state().join("tls/listening");
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            return text.trim().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no TLS listener");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_remote_relay_speaks_for_the_agent_its_certificate_names() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start_with(
        tempfile::tempdir().unwrap(),
        &["--listen-tls", "127.0.0.1:0"],
    );
    let addr = listening(&d);
    let a = d.create("a", "worker", None);
    let b = d.create("b", "worker", Some("a"));
    let (a_id, b_id) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let certs = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (certs.path().join("a"), certs.path().join("b"));
    let issued = issue(&d, "a", &a_dir, false);
    issue(&d, "b", &b_dir, false);
    assert_eq!(
        issued["fingerprint"].as_str().unwrap().len(),
        64,
        "{issued}"
    );
    assert!(
        !issued.to_string().contains("PRIVATE KEY"),
        "the key is not shown"
    );
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(a_dir.join("agent.key")), 0o600);
    // An --out others can write to is refused before anything is issued.
    let shared = certs.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused_out = d.agent(&["cert", "a", "--out", shared.to_str().unwrap()]);
    assert!(refused_out.is_err(), "{refused_out:?}");

    // As a, with a's certificate: the message reaches b, from a.
    let (answers, ok) = remote_relay(&addr, &a_dir, a_id, &session("over tls"));
    assert!(ok && sent(&answers), "{answers:?}");
    let mut bc = d.connect(&b).init();
    let (inbox, _) = bc.call("check_inbox", json!({}));
    let from: Vec<&str> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["from"].as_str().unwrap())
        .collect();
    assert_eq!(from, ["a"], "{inbox}");

    // b's certificate with a's id: the certificate decides; refused.
    let (answers, _) = remote_relay(&addr, &b_dir, a_id, &session("spoofed"));
    assert!(!sent(&answers), "{answers:?}");
    assert!(d.audit().contains("relay_agent_id_mismatch"));

    // Another daemon's authority: no handshake.
    let other = Daemon::start();
    other.create("a", "worker", None);
    let foreign = certs.path().join("foreign");
    issue(&other, "a", &foreign, false);
    // Trusting this daemon (its ca.crt), showing the other's certificate:
    // this daemon's check refuses it.
    std::fs::copy(a_dir.join("ca.crt"), foreign.join("ca.crt")).unwrap();
    let (answers, _) = remote_relay(&addr, &foreign, a_id, &session("foreign"));
    assert!(!sent(&answers), "{answers:?}");

    // A session open across --replace is closed at its next line.
    let mut open = Command::new(Path::new(bin()).with_file_name("substrat-mcp-server"))
        .args(["--agent-id", a_id])
        .env("SUBSTRAT_BROKER", format!("tls://{addr}"))
        .env("SUBSTRAT_TLS_DIR", &a_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_relay = open.stdin.take().unwrap();
    let mut from_relay = BufReader::new(open.stdout.take().unwrap());
    let mut answer = || {
        let mut line = String::new();
        from_relay.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap_or(Value::Null)
    };
    to_relay.write_all(session("before").as_bytes()).unwrap();
    assert!(sent(&[answer(), answer()]), "the open session sends");
    // Replaced: the old certificate is revoked, the new one works.
    let old = certs.path().join("a-old");
    std::fs::create_dir(&old).unwrap();
    for f in ["agent.crt", "agent.key", "ca.crt"] {
        std::fs::copy(a_dir.join(f), old.join(f)).unwrap();
    }
    let replaced = issue(&d, "a", &a_dir, true);
    assert_eq!(replaced["certificates"], 1, "{replaced}");
    let again = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"send_message","arguments":{"recipient":"b","text":"after","sync":false}}});
    to_relay.write_all(format!("{again}\n").as_bytes()).unwrap();
    let cut = answer();
    assert!(refused(std::slice::from_ref(&cut)), "{cut}");
    drop(to_relay);
    open.wait().unwrap();
    let (answers, _) = remote_relay(&addr, &old, a_id, &session("revoked"));
    assert!(!sent(&answers) && refused(&answers), "{answers:?}");
    let (answers, ok) = remote_relay(&addr, &a_dir, a_id, &session("renewed"));
    assert!(ok && sent(&answers), "{answers:?}");

    // A removed agent's certificate is revoked with it.
    d.agent(&["remove", "b"]).unwrap();
    let (answers, _) = remote_relay(&addr, &b_dir, b_id, &session("gone"));
    assert!(!sent(&answers) && refused(&answers), "{answers:?}");
}

/// A database writer moves a's certificate to b (agent_certs.agent_id):
/// the certificate names a (its URI SAN), so it speaks for nobody; the
/// relay as b is refused at the handshake's end.
#[test]
fn a_certificate_moved_to_another_agent_in_the_database_speaks_for_nobody() {
    let d = Daemon::start_with(
        tempfile::tempdir().unwrap(),
        &["--listen-tls", "127.0.0.1:0"],
    );
    let addr = listening(&d);
    d.create("a", "worker", None);
    let b = d.create("b", "worker", Some("a"));
    let b_id = b["id"].as_str().unwrap();
    let certs = tempfile::tempdir().unwrap();
    let a_dir = certs.path().join("a");
    let issued = issue(&d, "a", &a_dir, false);
    let db = rusqlite::Connection::open(d.state().join("state.db")).unwrap();
    let moved = db
        .execute(
            "UPDATE agent_certs SET agent_id = ?1 WHERE fingerprint = ?2",
            rusqlite::params![b_id, issued["fingerprint"].as_str().unwrap()],
        )
        .unwrap();
    assert_eq!(moved, 1, "the attack was made");
    let (answers, _) = remote_relay(&addr, &a_dir, b_id, &session("as b"));
    assert!(!sent(&answers) && refused(&answers), "{answers:?}");
}
