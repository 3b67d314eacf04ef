//! The broker, run as users run it: `substrat-sandbox daemon` in a fresh
//! process with its own state directory, agents made with the CLI, and
//! clients speaking MCP (JSON lines) on the agents' sockets.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Daemon {
    dir: tempfile::TempDir,
    child: Child,
}

impl Daemon {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir)
    }

    fn start_in(dir: tempfile::TempDir) -> Self {
        let child = Command::new(bin())
            .args(["daemon", "--policies"])
            .arg(repo().join("tests/broker/policies"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("SUBSTRAT_LOG", "warn,rmcp=error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let control = dir.path().join("state/control.sock");
        let start = Instant::now();
        while UnixStream::connect(&control).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { dir, child }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `substrat-sandbox agent ARGS --json`: the parsed answer, or the failure.
    fn agent(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(bin())
            .arg("agent")
            .args(args)
            .arg("--json")
            .arg("--state-dir")
            .arg(self.state())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}")))
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    fn create(&self, name: &str, role: &str, parent: Option<&str>) -> Value {
        let mut args = vec!["create", name, "--role", role];
        if let Some(parent) = parent {
            args.extend(["--parent", parent]);
        }
        self.agent(&args).unwrap()
    }

    fn connect(&self, agent: &Value) -> Conn {
        Conn::open(Path::new(agent["socket"].as_str().unwrap()))
    }

    fn audit(&self) -> String {
        std::fs::read_to_string(self.state().join("audit.log")).unwrap_or_default()
    }

    fn kill9(mut self) -> tempfile::TempDir {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Hand the state directory over without a clean shutdown.
        let old = std::mem::replace(&mut self.dir, dir);
        std::mem::forget(self);
        old
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Conn {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: i64,
}

impl Conn {
    fn open(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn {
            stream,
            reader,
            next_id: 100,
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn send(&mut self, value: &Value) {
        self.send_raw(format!("{value}\n").as_bytes());
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let reply = self.recv();
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    fn init(mut self) -> Self {
        let reply = self.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}));
        assert!(
            reply["result"]["capabilities"]["tools"].is_object(),
            "{reply}"
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        self
    }

    /// Calls a tool; the result's JSON body (parsed when it is JSON) and isError.
    fn call(&mut self, tool: &str, args: Value) -> (Value, bool) {
        let reply = self.request("tools/call", json!({"name": tool, "arguments": args}));
        let result = &reply["result"];
        assert!(result.is_object(), "{tool}: {reply}");
        let text = result["content"][0]["text"].as_str().unwrap().to_string();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (body, result["isError"] == true)
    }

    fn tool_names(&mut self) -> Vec<String> {
        let reply = self.request("tools/list", json!({}));
        reply["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }
}

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
