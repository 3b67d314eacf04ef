//! A remote upstream MCP server (`url`) behind the broker: an agent in its
//! sandbox calls the server's tool through the broker; the server's bearer
//! token, in the daemon's environment, is found nowhere in that sandbox.
//! The server is the Python SDK's (PyPI `mcp`, installed by scripts/setup
//! under .cache/peers) over streamable HTTP, refusing requests without the
//! token.

use std::net::TcpStream;

use super::*;

/// The peers' Python and the test server, when scripts/setup installed them.
fn remote_server_command(test: &str) -> Option<(PathBuf, PathBuf)> {
    let python = repo().join(".cache/peers/venv/bin/python3");
    let script = repo().join("tests/python/peers/remote_server.py");
    if !python.exists() {
        println!(
            "SKIPPED {test}: the Python MCP SDK is not installed under .cache/peers: run scripts/setup"
        );
        return None;
    }
    Some((python, script))
}

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_remote_servers_tool_works_from_a_sandbox_and_its_token_stays_out() {
    let test = "a_remote_servers_tool_works_from_a_sandbox_and_its_token_stays_out";
    if !sandbox_works(test, "native") {
        return;
    }
    let Some((python, script)) = remote_server_command(test) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let token = format!("remote-token-{}-{}", std::process::id(), free_port());
    let port = free_port();
    let _server = Server(
        Command::new(python)
            .arg(script)
            .args(["streamable", &port.to_string()])
            .env("REMOTE_TEST_TOKEN", &token)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("the remote server listens", 30, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let upstreams = root.path().join("upstreams.json");
    let servers = json!({"mcpServers": {"remote": {
        "url": format!("http://127.0.0.1:{port}/mcp"),
        "bearer_token_env": "SUBSTRAT_TEST_REMOTE_TOKEN",
        "headers": {"X-Org": "acme"},
    }}});
    std::fs::write(&upstreams, servers.to_string()).unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(
        policies.join("remote-user.toml"),
        "version = 1\nextends = \"worker\"\n[tools]\nallow = [\"remote_*\"]\n",
    )
    .unwrap();
    let child = Command::new(bin())
        .args(["daemon", "--provider", "stand-in", "--backend", "native"])
        .arg("--policies")
        .arg(&policies)
        .arg("--upstreams")
        .arg(&upstreams)
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .env("SUBSTRAT_TEST_REMOTE_TOKEN", &token)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    wait_until("the daemon listens", 30, || {
        UnixStream::connect(team.state().join("control.sock")).is_ok()
    });
    wait_until("the remote server is up", 60, || {
        let list = agent_json_tools(&team.state());
        list["servers"][0]["status"]["status"] == "up"
    });
    let control = "control-marker-of-the-search";
    let plan = json!({"turns": [{"steps": [
        {"write": "marker.txt", "text": control},
        {"call": "remote_seen"},
        {"shell": secret_search(&base64(&token), control)},
        {"reply": "{results}"},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "r",
        "--role",
        "remote-user",
        "--workspace",
        &ws,
        &with_plan("go", &plan),
    ]);
    wait_until("the turn ends", 120, || {
        team.settled() && team.turns("r").len() == 1
    });
    let turn = &team.turns("r")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    let result = turn.result.clone().unwrap_or_default();
    // The call went through the broker, with the token and the header.
    assert!(result.contains("org=acme refused=0"), "{result}");
    let found = std::fs::read_to_string(team.ws().join("found.txt"))
        .unwrap_or_else(|e| panic!("the search did not run ({e}): {result}"));
    assert!(found.starts_with("real=0 control="), "{found}");
    assert!(
        !found.contains("control=0"),
        "the search did not see its control: {found}"
    );
}

/// `tools list --json` from the daemon.
fn agent_json_tools(state: &Path) -> Value {
    let out = Command::new(bin())
        .args(["tools", "list", "--json", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}
