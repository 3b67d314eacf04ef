//! The MCP protocol version the broker offers its upstream servers and the
//! one they agree on, with a real server from the registry (npm
//! server-everything in its streamable HTTP mode, installed by
//! scripts/setup under .cache/peers).

use super::*;
use substrat_broker::upstream_supervisor::client::OFFERED_PROTOCOL;

/// The server's process, killed with the test.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// server-everything agrees on the version the broker offers (the newest
/// with an `initialize` handshake, not rmcp's default 2026-07-28), and
/// `tools list` shows it, as JSON and in words.
#[test]
fn a_real_server_agrees_on_the_offered_version_and_tools_list_shows_it() {
    let test = "a_real_server_agrees_on_the_offered_version_and_tools_list_shows_it";
    let everything = repo().join(".cache/peers/npm/node_modules/.bin/mcp-server-everything");
    if !everything.exists() {
        println!("SKIPPED {test}: server-everything is not installed (scripts/setup)");
        return;
    }
    assert_eq!(OFFERED_PROTOCOL.as_str(), "2025-11-25");
    let port = free_port();
    let _server = Server(
        Command::new(&everything)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "server-everything did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    let upstreams = dir.path().join("upstreams.json");
    let servers = json!({"mcpServers": {"web": {"url": format!("http://127.0.0.1:{port}/mcp")}}});
    std::fs::write(&upstreams, servers.to_string()).unwrap();
    let upstreams = upstreams.to_str().unwrap().to_string();
    let d = Daemon::start_with(dir, &["--upstreams", &upstreams]);
    let start = Instant::now();
    let status = loop {
        let out = Command::new(bin())
            .args(["tools", "list", "--json", "--state-dir"])
            .arg(d.state())
            .output()
            .unwrap();
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let status = reply["servers"][0]["status"].clone();
        if status["status"] == "up" {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "not up: {reply}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        status["protocol_version"],
        OFFERED_PROTOCOL.as_str(),
        "{status}"
    );
    let out = Command::new(bin())
        .args(["tools", "list", "--state-dir"])
        .arg(d.state())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("web  up  restarts 0  MCP 2025-11-25\n"),
        "{text}"
    );
}
