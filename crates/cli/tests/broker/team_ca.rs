//! The team's certificate authority (`daemon --team-key`, `team ca`): one
//! certificate reaches whichever daemon runs its agent, across a SIGKILL
//! and an adoption (PostgreSQL); a rotation drops no connection and its
//! overlap takes both authorities' certificates; retirement refuses the
//! old ones. The real relay binary over TCP with mutual TLS.

use super::*;

/// A relay kept running, fed and read a line at a time.
struct Relay {
    child: Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl Relay {
    fn start(addresses: &str, dir: &Path, agent_id: &str) -> Self {
        let mut child = Command::new(Path::new(bin()).with_file_name("substrat-mcp-server"))
            .args(["--agent-id", agent_id])
            .env("SUBSTRAT_BROKER", addresses)
            .env("SUBSTRAT_TLS_DIR", dir)
            .env_remove("SUBSTRAT_SOCKET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut relay = Relay {
            child,
            input,
            output,
            next_id: 1,
        };
        let init = relay.request("initialize", json!({"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}));
        assert!(init["result"].is_object(), "{init}");
        relay.line(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        relay
    }

    fn line(&mut self, message: Value) {
        self.input
            .write_all(format!("{message}\n").as_bytes())
            .unwrap();
    }

    /// The answer to one request (lines without an id, such as a refusal
    /// before the connection closes, are returned as they come).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.line(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or(Value::Null)
    }

    fn send(&mut self, recipient: &str, text: &str) -> Value {
        self.request(
            "tools/call",
            json!({"name":"send_message","arguments":{"recipient":recipient,"text":text,"sync":false}}),
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn delivered(answer: &Value) -> bool {
    answer["result"]["isError"] == false
}

fn team_key(dir: &Path) -> String {
    let path = dir.join("team.key");
    let out = Command::new(bin())
        .args(["team", "key", "new"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    path.display().to_string()
}

fn listening(d: &Daemon) -> String {
    let file = d.state().join("tls/listening");
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            return format!("tls://{}", text.trim());
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no TLS listener");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn team(d: &Daemon, args: &[&str]) -> Value {
    let out = Command::new(bin())
        .arg("team")
        .args(args)
        .args(["--json", "--state-dir"])
        .arg(d.state())
        .output()
        .unwrap();
    assert!(out.status.success(), "team {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_for(what: &str, seconds: u64, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(seconds), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_relay_reaches_its_agent_on_the_daemon_that_adopted_it() {
    let test = "a_relay_reaches_its_agent_on_the_daemon_that_adopted_it";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let keys = tempfile::tempdir().unwrap();
    let key = team_key(keys.path());
    let flags = [
        "--state",
        &url,
        "--lease",
        "5",
        "--team-key",
        &key,
        "--listen-tls",
        "127.0.0.1:0",
    ];
    let first = Daemon::start_with(tempfile::tempdir().unwrap(), &flags);
    let second = Daemon::start_with(tempfile::tempdir().unwrap(), &flags);
    let a = first.create("a", "worker", None);
    first.create("b", "worker", Some("a"));
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path().join("a");
    first
        .agent(&["cert", "a", "--out", dir.to_str().unwrap()])
        .unwrap();
    // One authority for both daemons; its key nowhere in the database.
    assert_eq!(schema.query("SELECT count(*) FROM team_authorities"), "1");
    assert_eq!(
        schema.query("SELECT count(*) FROM team_authorities WHERE sealed_key LIKE '%PRIVATE%'"),
        "0"
    );
    let addresses = format!("{},{}", listening(&first), listening(&second));
    let mut relay = Relay::start(&addresses, &dir, a["id"].as_str().unwrap());
    assert!(delivered(&relay.send("b", "through the first")));

    let first_id = std::fs::read_to_string(first.state().join("daemon.id")).unwrap();
    drop(first.kill9());
    wait_for("the second daemon adopts a", 60, || {
        schema.query("SELECT daemon_id FROM agents WHERE name = 'a'") != first_id.trim()
    });
    // The same relay, the same certificate: answered by the second.
    let answer = relay.send("b", "through the second");
    assert!(delivered(&answer), "{answer}");
    let b = second.agent(&["inspect", "b"]).unwrap();
    let mut bc = second.connect(&b["agent"]).init();
    let (inbox, _) = bc.call("check_inbox", json!({}));
    let texts: Vec<&str> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        ["through the first", "through the second"],
        "{inbox}"
    );
}

#[test]
fn rotation_keeps_connections_and_retirement_refuses_the_old_authority() {
    let keys = tempfile::tempdir().unwrap();
    let key = team_key(keys.path());
    let d = Daemon::start_with(
        tempfile::tempdir().unwrap(),
        &["--team-key", &key, "--listen-tls", "127.0.0.1:0"],
    );
    let address = listening(&d);
    let a = d.create("a", "worker", None);
    d.create("b", "worker", Some("a"));
    let a_id = a["id"].as_str().unwrap();
    let certs = tempfile::tempdir().unwrap();
    let (old, new) = (certs.path().join("old"), certs.path().join("new"));
    d.agent(&["cert", "a", "--out", old.to_str().unwrap()])
        .unwrap();
    let mut open = Relay::start(&address, &old, a_id);
    assert!(delivered(&open.send("b", "before")));

    let rotated = team(&d, &["ca", "rotate"]);
    assert_eq!(rotated["rotated_to"], 2, "{rotated}");
    // The listener follows within its poll (2 s).
    std::thread::sleep(Duration::from_secs(3));
    // Open across the rotation: not dropped.
    assert!(delivered(&open.send("b", "across the rotation")));
    // The overlap: a new connection with the old certificate works.
    assert!(delivered(
        &Relay::start(&address, &old, a_id).send("b", "old, overlap")
    ));
    d.agent(&["cert", "a", "--out", new.to_str().unwrap()])
        .unwrap();
    let bundle = std::fs::read_to_string(new.join("ca.crt")).unwrap();
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
    assert!(delivered(
        &Relay::start(&address, &new, a_id).send("b", "new, overlap")
    ));

    let retired = team(&d, &["ca", "retire"]);
    assert_eq!(retired["retired"], 1, "{retired}");
    assert_eq!(retired["certificates_revoked"], 1, "{retired}");
    // The open connection with the old certificate is closed at its next line.
    let cut = open.send("b", "after retirement");
    assert!(!delivered(&cut), "{cut}");
    assert!(cut.to_string().contains("speaks for no agent"), "{cut}");
    std::thread::sleep(Duration::from_secs(3));
    // A new connection with it: refused (the handshake, or the daemon).
    let mut late = Command::new(Path::new(bin()).with_file_name("substrat-mcp-server"))
        .args(["--agent-id", a_id])
        .env("SUBSTRAT_BROKER", &address)
        .env("SUBSTRAT_TLS_DIR", &old)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    late.stdin
        .take()
        .unwrap()
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n")
        .unwrap();
    let out = late.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("-32000") && !text.contains("\"result\""),
        "{text}"
    );
    // The new certificate keeps working; the listener's certificate is
    // now the new authority's.
    assert!(delivered(
        &Relay::start(&address, &new, a_id).send("b", "new, after")
    ));
    let shown = team(&d, &["ca", "show"]);
    let states: Vec<&str> = shown["authorities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["retired", "current"], "{shown}");
}
