//! Upstreams that go away come back, and notifications flow between an
//! agent and an upstream (issue 41). Real servers (npm server-everything
//! over streamable HTTP, SSE and in its sandbox; a Python SDK server of
//! ours, `tests/python/peers/notify_server.py`), a real daemon, the agent
//! a raw MCP client on its socket. Times are printed (`--nocapture`);
//! the bounds asserted are generous.

use super::content::{Killed, everything, peer, wait_for};
use super::*;

fn installed(test: &str) -> bool {
    let ok = everything().exists() && peer("venv/bin/python3").exists();
    if !ok {
        println!(
            "SKIPPED {test}: the reference servers are not under .cache/peers: run scripts/setup"
        );
    }
    ok
}

/// A daemon serving `servers` (the `mcpServers` object) to role `relay`.
struct Setup {
    root: tempfile::TempDir,
    daemon: Option<Killed>,
}

impl Setup {
    fn start(servers: Value) -> Self {
        let root = tempfile::tempdir().unwrap();
        let policies = root.path().join("policies");
        std::fs::create_dir(&policies).unwrap();
        std::fs::write(
            policies.join("upstream-peers.toml"),
            format!(
                "version = 1\nextends = \"upstream\"\n[filesystem]\nbinds = [\n\
                 {{ source = \"/usr\", mode = \"ro\" }},\n\
                 {{ source = \"/bin\", mode = \"ro\", optional = true }},\n\
                 {{ source = \"/lib\", mode = \"ro\", optional = true }},\n\
                 {{ source = \"/lib64\", mode = \"ro\", optional = true }},\n\
                 {{ source = \"/etc/ld.so.cache\", mode = \"ro\", optional = true }},\n\
                 {{ source = \"${{WORKSPACE}}\", mode = \"rw\" }},\n\
                 {{ source = \"{}\", mode = \"ro\" }},\n]\n",
                peer("").display()
            ),
        )
        .unwrap();
        let scope = "[tools]\nallow = [\"remote_*\", \"local_*\", \"notify_*\"]\n";
        std::fs::write(
            policies.join("relay.toml"),
            format!("version = 1\nextends = \"worker\"\n{scope}"),
        )
        .unwrap();
        let count = servers.as_object().map_or(0, |s| s.len());
        let upstreams = root.path().join("upstreams.json");
        std::fs::write(&upstreams, json!({"mcpServers": servers}).to_string()).unwrap();
        let daemon = Command::new(bin())
            .arg("daemon")
            .arg("--policies")
            .arg(&policies)
            .arg("--upstreams")
            .arg(&upstreams)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .env("SUBSTRAT_LOG", "warn,rmcp=error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let setup = Setup {
            root,
            daemon: Some(Killed(daemon)),
        };
        wait_for("every upstream is up", || {
            let servers = setup.servers();
            servers.len() == count && servers.iter().all(|s| s["status"]["status"] == "up")
        });
        setup
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    /// `tools list --json`'s servers.
    fn servers(&self) -> Vec<Value> {
        let out = Command::new(bin())
            .args(["tools", "list", "--json", "--state-dir"])
            .arg(self.state())
            .output()
            .unwrap();
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        list["servers"].as_array().cloned().unwrap_or_default()
    }

    fn status(&self, server: &str) -> Value {
        let servers = self.servers();
        let found = servers.iter().find(|s| s["server"] == server);
        found.map_or(Value::Null, |s| s["status"].clone())
    }

    fn agent(&self, name: &str) -> Conn {
        let agent = agent_json(&self.state(), &["create", name, "--role", "relay"]).unwrap();
        Conn::open(Path::new(agent["socket"].as_str().unwrap())).init()
    }

    /// Stops the daemon as an operator does (SIGTERM) and waits for it.
    fn stop(&mut self) {
        let Some(mut daemon) = self.daemon.take() else {
            return;
        };
        let pid = daemon.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let start = Instant::now();
        while daemon.0.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the daemon did not stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// server-everything serving `mode` (`streamableHttp`, `sse`) on `port`.
fn serve_everything(mode: &str, port: u16) -> Killed {
    let child = Command::new(everything())
        .arg(mode)
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("server-everything listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Killed(child)
}

/// A request's answer, notifications before it skipped.
fn ask(conn: &mut Conn, method: &str, params: Value) -> Value {
    conn.next_id += 1;
    let id = conn.next_id;
    conn.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    until_answer(conn, id).0
}

fn tool_names(conn: &mut Conn) -> Vec<String> {
    let reply = ask(conn, "tools/list", json!({}));
    let tools = reply["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    tools
        .iter()
        .filter_map(|t| Some(t["name"].as_str()?.to_string()))
        .collect()
}

/// Calls `tool`; the reply's text and whether it is an error.
fn call_text(conn: &mut Conn, tool: &str, args: Value) -> (String, bool) {
    let reply = ask(conn, "tools/call", json!({"name": tool, "arguments": args}));
    let result = &reply["result"];
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    (text.to_string(), result["isError"] == true)
}

/// A reason an operator reads: words, no Rust type or module names.
fn assert_plain(reason: &str) {
    for internal in ["::", "rmcp", "Error {", "Closed", "Cancelled", "Some("] {
        assert!(!reason.contains(internal), "{internal:?} in {reason:?}");
    }
}

/// Waits for `server` to be down (its reason plain); the time it took.
fn until_down(setup: &Setup, server: &str) -> Duration {
    let start = Instant::now();
    loop {
        let status = setup.status(server);
        if status["status"] == "down" {
            assert_plain(status["reason"].as_str().unwrap_or_default());
            println!(
                "{server}: down after {:?}: {}",
                start.elapsed(),
                status["reason"]
            );
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{server} not down: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A call while `server` is down: answered at once, "not running".
fn assert_refused_at_once(conn: &mut Conn, tool: &str) {
    let start = Instant::now();
    let (text, is_error) = call_text(conn, tool, json!({"message": "meanwhile"}));
    let took = start.elapsed();
    println!("{tool} while down: answered in {took:?}: {text}");
    assert!(
        is_error && text.contains("is not running (restarting)"),
        "{text}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// Waits for `server` to be up again, then calls `tool` (a few tries:
/// the agent's role limits its steps and rate); the time it took.
fn until_back(setup: &Setup, conn: &mut Conn, server: &str, tool: &str) -> Duration {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        if setup.status(server)["status"] == "up" {
            let (text, is_error) = call_text(conn, tool, json!({"message": "back"}));
            if !is_error {
                assert_eq!(text, "Echo: back");
                return start.elapsed();
            }
            assert_plain(&text);
            tries += 1;
            assert!(tries < 5, "not back: {text}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{server} not back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_remote_server_that_restarts_is_down_at_once_and_back_soon() {
    let test = "a_remote_server_that_restarts_is_down_at_once_and_back_soon";
    if !installed(test) {
        return;
    }
    for (mode, transport, path) in [
        ("streamableHttp", "streamable_http", "mcp"),
        ("sse", "sse", "sse"),
    ] {
        let port = free_port();
        let server = serve_everything(mode, port);
        let url = format!("http://127.0.0.1:{port}/{path}");
        let setup = Setup::start(json!({"remote": {"url": url, "transport": transport}}));
        let mut agent = setup.agent(&format!("agent-{path}"));
        assert_eq!(
            call_text(&mut agent, "remote_echo", json!({"message": "x"})).0,
            "Echo: x"
        );
        // Gone: down at once, calls refused at once; back soon after it returns.
        drop(server);
        let down = until_down(&setup, "remote");
        assert!(down < Duration::from_secs(5), "{mode}: {down:?}");
        assert_refused_at_once(&mut agent, "remote_echo");
        std::thread::sleep(Duration::from_secs(1));
        let server = serve_everything(mode, port);
        let back = until_back(&setup, &mut agent, "remote", "remote_echo");
        println!("{mode}: back {back:?} after the server returned");
        // Restarted at once on the same port: the old session is unknown
        // to it (server-everything answers HTTP 400); noticed, and back.
        drop(server);
        let _server = serve_everything(mode, port);
        let back = until_back(&setup, &mut agent, "remote", "remote_echo");
        println!("{mode}: back {back:?} after a quick restart");
        assert!(setup.status("remote")["status"] == "up");
    }
}

/// Every process below the daemon whose command line names `what`.
fn processes_of(daemon: u32, what: &str) -> Vec<i32> {
    super::upstreams::descendants(daemon as i32)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(what))
        })
        .collect()
}

#[test]
fn a_local_server_killed_comes_back_and_its_workspace_stays_clean() {
    let test = "a_local_server_killed_comes_back_and_its_workspace_stays_clean";
    if !installed(test) {
        return;
    }
    let servers = json!({"local": {"command": everything(), "policy": "upstream-peers"}});
    let mut setup = Setup::start(servers);
    let mut agent = setup.agent("agent-local");
    assert_eq!(
        call_text(&mut agent, "local_echo", json!({"message": "x"})).0,
        "Echo: x"
    );
    let daemon = setup.daemon.as_ref().unwrap().0.id();
    // The server itself (node), not its launcher: the sandbox's command.
    let node: Vec<i32> = processes_of(daemon, "server-everything")
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("node"))
        })
        .collect();
    assert!(!node.is_empty(), "no server process found");
    for pid in &node {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let down = until_down(&setup, "local");
    assert!(down < Duration::from_secs(5), "{down:?}");
    let back = until_back(&setup, &mut agent, "local", "local_echo");
    println!("local: back {back:?} after its process was killed");
    // Stopped with the daemon: the workspace holds what the server wrote
    // (nothing), no mount points (.cursor, .git) the launcher made.
    setup.stop();
    let workspace = setup.state().join("upstreams/local");
    let left: Vec<_> = std::fs::read_dir(&workspace)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", workspace.display());
    let marks: Vec<_> = std::fs::read_dir(setup.state().join("upstreams/local.git"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("mountpoints."))
        .collect();
    assert!(marks.is_empty(), "{marks:?}");
}

/// Reads messages until the answer to `id`; the notifications before it.
fn until_answer(conn: &mut Conn, id: i64) -> (Value, Vec<Value>) {
    let mut notes = Vec::new();
    loop {
        let message = conn.recv();
        if message["id"] == id && message.get("method").is_none() {
            return (message, notes);
        }
        notes.push(message);
    }
}

fn send_call(conn: &mut Conn, id: i64, tool: &str, args: Value, meta: Value) {
    let params = json!({"name": tool, "arguments": args, "_meta": meta});
    conn.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
}

fn methods(notes: &[Value], method: &str) -> Vec<Value> {
    notes
        .iter()
        .filter(|n| n["method"] == method)
        .cloned()
        .collect()
}

#[test]
fn progress_logging_cancellation_and_list_changes_reach_the_other_side() {
    let test = "progress_logging_cancellation_and_list_changes_reach_the_other_side";
    if !installed(test) {
        return;
    }
    let everything_port = free_port();
    let _everything = serve_everything("streamableHttp", everything_port);
    let notify_port = free_port();
    let marks = tempfile::tempdir().unwrap();
    let _notify = Killed(
        Command::new(peer("venv/bin/python3"))
            .arg(repo().join("tests/python/peers/notify_server.py"))
            .arg(notify_port.to_string())
            .arg(marks.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the notify server listens", || {
        std::net::TcpStream::connect(("127.0.0.1", notify_port)).is_ok()
    });
    let setup = Setup::start(json!({
        "remote": {"url": format!("http://127.0.0.1:{everything_port}/mcp")},
        "notify": {"url": format!("http://127.0.0.1:{notify_port}/mcp")},
    }));
    let mut agent = setup.agent("agent-notify");

    // Progress, under the agent's own token.
    let args = json!({"duration": 1, "steps": 3});
    send_call(
        &mut agent,
        1,
        "remote_trigger-long-running-operation",
        args,
        json!({"progressToken": "tok-7"}),
    );
    let (reply, notes) = until_answer(&mut agent, 1);
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    let progress = methods(&notes, "notifications/progress");
    assert_eq!(progress.len(), 3, "{notes:?}");
    for (step, note) in progress.iter().enumerate() {
        assert_eq!(note["params"]["progressToken"], "tok-7");
        assert_eq!(note["params"]["progress"].as_f64(), Some(step as f64 + 1.0));
    }

    // A log message of the server, named after it.
    send_call(
        &mut agent,
        2,
        "remote_toggle-simulated-logging",
        json!({}),
        json!({}),
    );
    let (_, mut notes) = until_answer(&mut agent, 2);
    let start = Instant::now();
    while methods(&notes, "notifications/message").is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no log message: {notes:?}"
        );
        notes.push(agent.recv());
    }
    let log = &methods(&notes, "notifications/message")[0];
    assert_eq!(log["params"]["logger"], "remote", "{log}");

    // Cancelled by the agent: the server's call is cancelled (it says so)
    // and the agent's connection serves the next call at once. (No answer
    // comes for a cancelled request, as MCP says.)
    send_call(
        &mut agent,
        3,
        "notify_slow",
        json!({"seconds": 30}),
        json!({}),
    );
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": 3, "reason": "changed my mind"}}),
    );
    wait_for("the server saw the cancellation", || {
        marks.path().join("cancelled").exists()
    });
    println!(
        "the server saw the cancellation after {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        call_text(&mut agent, "notify_slow", json!({"seconds": 0})).0,
        "slept"
    );

    // A changed tool list: list_changed at the agent, the new tool listed.
    assert!(!tool_names(&mut agent).contains(&"notify_grown".to_string()));
    send_call(&mut agent, 4, "notify_grow", json!({}), json!({}));
    let (_, mut notes) = until_answer(&mut agent, 4);
    let start = Instant::now();
    while methods(&notes, "notifications/tools/list_changed").is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no list_changed: {notes:?}"
        );
        notes.push(agent.recv());
    }
    wait_for("the new tool is listed", || {
        tool_names(&mut agent).contains(&"notify_grown".to_string())
    });
    assert_eq!(call_text(&mut agent, "notify_grown", json!({})).0, "grown");
}
