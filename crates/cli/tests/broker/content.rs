//! Nothing lost between an upstream and an agent: the reference servers'
//! tool definitions and results, as the agent reads them through the
//! broker, compared whole with what a direct client reads from the same
//! server (its JSON parsed by rmcp's model, as the broker's own client
//! does), and a role's output limit cutting what the agent reads.
//!
//! Upstreams: npm `server-everything` run by the daemon in its sandbox
//! (stdio) and again as a remote server (`streamableHttp`), and a server
//! of ours on the Python SDK (`tests/python/peers/content_server.py`,
//! streamable HTTP) for what server-everything lacks: icons, `_meta`,
//! audio, a large image. All installed by scripts/setup under .cache/peers.
//!
//! Documented differences (docs/upstreams.md): tool names carry the
//! `<server>_` prefix; fields outside rmcp's model (server-everything's
//! `execution`) are not relayed.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout};

use rmcp::model::{CallToolResult, Tool};

use super::*;

pub(super) fn peer(path: &str) -> PathBuf {
    repo().join(".cache/peers").join(path)
}

pub(super) fn everything() -> PathBuf {
    peer("npm/node_modules/.bin/mcp-server-everything")
}

fn fixture() -> (PathBuf, PathBuf) {
    (
        peer("venv/bin/python3"),
        repo().join("tests/python/peers/content_server.py"),
    )
}

fn installed(test: &str) -> bool {
    let ok = everything().exists() && fixture().0.exists();
    if !ok {
        println!(
            "SKIPPED {test}: the reference servers are not under .cache/peers: run scripts/setup"
        );
    }
    ok
}

/// Kills a process when the test ends, however it ends.
pub(super) struct Killed(pub(super) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A direct MCP client of a server over stdio (JSON lines).
struct Direct {
    _child: Killed,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    id: i64,
}

impl Direct {
    fn start(program: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut direct = Direct {
            _child: Killed(child),
            stdin,
            stdout,
            id: 0,
        };
        direct.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "direct", "version": "1"}}),
        );
        direct.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        direct
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The request's result (notifications and the server's own requests
    /// are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "{method}: EOF"
            );
            let reply: Value = serde_json::from_str(&line).unwrap();
            if reply["id"] == id && reply.get("method").is_none() {
                return reply["result"].clone();
            }
        }
    }

    fn tools(&mut self) -> Vec<Value> {
        let listed = self.request("tools/list", json!({}));
        listed["tools"].as_array().unwrap().to_vec()
    }

    fn call(&mut self, tool: &str, args: &Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }
}

/// What an rmcp client reads from `value`: parsed by its model, written
/// again as JSON text (as on the wire: an f32 priority of 0.7 stays 0.7).
fn through<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> Value {
    let parsed: T =
        serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
    serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap()
}

/// A daemon with the three upstreams and two roles: `relay` (the worker's
/// output limit) and `tight` (1 KiB).
struct Setup {
    root: tempfile::TempDir,
    _daemon: Killed,
    _remotes: Vec<Killed>,
}

impl Setup {
    fn start() -> Self {
        let root = tempfile::tempdir().unwrap();
        let everything_port = free_port();
        let fixture_port = free_port();
        let (python, script) = fixture();
        let remotes = vec![
            Killed(
                Command::new(everything())
                    .arg("streamableHttp")
                    .env("PORT", everything_port.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            ),
            Killed(
                Command::new(python)
                    .arg(script)
                    .args(["streamable", &fixture_port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            ),
        ];
        let policies = root.path().join("policies");
        std::fs::create_dir(&policies).unwrap();
        let peers = repo().join(".cache/peers");
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
                peers.display()
            ),
        )
        .unwrap();
        let scope = "[tools]\nallow = [\"everything_*\", \"remote_*\", \"fixture_*\"]\n";
        std::fs::write(
            policies.join("relay.toml"),
            format!("version = 1\nextends = \"worker\"\n{scope}"),
        )
        .unwrap();
        std::fs::write(
            policies.join("tight.toml"),
            format!(
                "version = 1\nextends = \"worker\"\n{scope}[mcp]\nmax_output_bytes = \"1KiB\"\n"
            ),
        )
        .unwrap();
        let servers = json!({"mcpServers": {
            "everything": {"command": everything(), "policy": "upstream-peers"},
            "remote": {"url": format!("http://127.0.0.1:{everything_port}/mcp")},
            "fixture": {"url": format!("http://127.0.0.1:{fixture_port}/mcp")},
        }});
        let upstreams = root.path().join("upstreams.json");
        std::fs::write(&upstreams, servers.to_string()).unwrap();
        for port in [everything_port, fixture_port] {
            wait_for("a remote server listens", || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        }
        let daemon = Killed(
            Command::new(bin())
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
                .unwrap(),
        );
        let setup = Setup {
            root,
            _daemon: daemon,
            _remotes: remotes,
        };
        wait_for("every upstream is up", || {
            let list = setup.tools_list();
            list["servers"]
                .as_array()
                .is_some_and(|s| s.len() == 3 && s.iter().all(|s| s["status"]["status"] == "up"))
        });
        setup
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn tools_list(&self) -> Value {
        let out = Command::new(bin())
            .args(["tools", "list", "--json", "--state-dir"])
            .arg(self.state())
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn agent(&self, name: &str, role: &str) -> Conn {
        let agent = agent_json(&self.state(), &["create", name, "--role", role]).unwrap();
        Conn::open(Path::new(agent["socket"].as_str().unwrap())).init()
    }
}

pub(super) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent's tools of `server`, without the `<server>_` prefix.
fn relayed_tools(conn: &mut Conn, server: &str) -> Vec<Value> {
    let reply = conn.request("tools/list", json!({}));
    let prefix = format!("{server}_");
    reply["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| {
            let name = t["name"].as_str()?.strip_prefix(&prefix)?.to_string();
            let mut t = t.clone();
            t["name"] = json!(name);
            Some(t)
        })
        .collect()
}

fn relayed_call(conn: &mut Conn, tool: &str, args: &Value) -> Value {
    let reply = conn.request("tools/call", json!({"name": tool, "arguments": args}));
    assert!(reply["result"].is_object(), "{tool}: {reply}");
    reply["result"].clone()
}

/// Times of day ("5:04:29 AM") masked: server-everything stamps its
/// resources with the time they are read.
fn untimed(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(
            s.split(' ')
                .map(|w| {
                    let digits = w.chars().all(|c| c.is_ascii_digit() || c == ':');
                    if digits && w.matches(':').count() == 2 {
                        "T"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        ),
        Value::Array(items) => Value::Array(items.iter().map(untimed).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), untimed(v))).collect())
        }
        other => other.clone(),
    }
}

/// server-everything's calls that show each content kind: text, image,
/// annotations, resource links, embedded text resources, structured content.
fn everything_calls() -> Vec<(&'static str, Value)> {
    vec![
        ("echo", json!({"message": "a \"quoted\" \\ line\né😀"})),
        ("get-sum", json!({"a": 2, "b": 3})),
        ("get-tiny-image", json!({})),
        (
            "get-annotated-message",
            json!({"messageType": "success", "includeImage": true}),
        ),
        ("get-annotated-message", json!({"messageType": "error"})),
        ("get-resource-links", json!({"count": 4})),
        (
            "get-resource-reference",
            json!({"resourceType": "Text", "resourceId": 2}),
        ),
        ("get-structured-content", json!({"location": "Chicago"})),
    ]
}

#[test]
fn reference_servers_reach_the_agent_as_a_direct_client_sees_them() {
    let test = "reference_servers_reach_the_agent_as_a_direct_client_sees_them";
    if !installed(test) {
        return;
    }
    let setup = Setup::start();
    let mut agent = setup.agent("relay-a", "relay");
    let mut direct = Direct::start(&everything(), &[]);
    let raw = direct.tools();
    let seen: Vec<Value> = raw.iter().map(through::<Tool>).collect();
    // What rmcp's model leaves out of server-everything's definitions.
    for (raw, seen) in raw.iter().zip(&seen) {
        let mut raw = raw.clone();
        raw.as_object_mut().unwrap().remove("execution");
        assert_eq!(raw, *seen);
    }
    for server in ["everything", "remote"] {
        assert_eq!(relayed_tools(&mut agent, server), seen, "{server}");
        for (tool, args) in everything_calls() {
            let direct = through::<CallToolResult>(&direct.call(tool, &args));
            let relayed = relayed_call(&mut agent, &format!("{server}_{tool}"), &args);
            assert_eq!(untimed(&relayed), untimed(&direct), "{server}_{tool}");
        }
    }
    // A blob resource arrives as one (its bytes hold the time of the read).
    let blob = relayed_call(
        &mut agent,
        "everything_get-resource-reference",
        &json!({"resourceType": "Blob", "resourceId": 1}),
    );
    assert!(blob["content"][1]["resource"]["blob"].is_string(), "{blob}");
    // Ours: icons, _meta, an output schema; audio, blobs, a larger image.
    let (python, script) = fixture();
    let mut direct = Direct::start(&python, &[script.to_str().unwrap(), "stdio"]);
    let seen: Vec<Value> = direct.tools().iter().map(through::<Tool>).collect();
    assert_eq!(relayed_tools(&mut agent, "fixture"), seen);
    assert!(
        seen[0]["icons"].is_array() && seen[0]["_meta"].is_object(),
        "{seen:?}"
    );
    for (tool, args) in [
        ("kinds", json!({"image_bytes": 3000})),
        ("dressed", json!({"city": "Zürich \"quoted\""})),
    ] {
        let direct = through::<CallToolResult>(&direct.call(tool, &args));
        let relayed = relayed_call(&mut agent, &format!("fixture_{tool}"), &args);
        assert_eq!(relayed, direct, "fixture_{tool}");
    }
}

fn marker(removed: usize, total: usize) -> String {
    format!("\n[substrat: output truncated, {removed} of {total} bytes removed]")
}

/// The text of the relayed result's only block; it must be `text` cut on
/// a char boundary as close to `limit` bytes as the boundaries allow.
fn assert_cut_at(result: &Value, text: &str, limit: usize) {
    assert_eq!(
        result["content"].as_array().map(Vec::len),
        Some(1),
        "{result}"
    );
    let got = result["content"][0]["text"].as_str().unwrap();
    let room = limit - marker(text.len(), text.len()).len();
    let mut keep = room;
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    let expected = format!("{}{}", &text[..keep], marker(text.len() - keep, text.len()));
    assert_eq!(got, expected);
    assert!(got.len() <= limit && got.len() > limit - 4, "{}", got.len());
}

#[test]
fn a_roles_output_limit_cuts_what_the_agent_reads() {
    let test = "a_roles_output_limit_cuts_what_the_agent_reads";
    if !installed(test) {
        return;
    }
    let setup = Setup::start();
    let mut agent = setup.agent("tight-a", "tight");
    // Long text; quotes, backslashes and newlines (2 bytes each in JSON);
    // multi-byte characters: each cut at 1 KiB of the text itself.
    for message in ["x".repeat(3000), "\"\\\n".repeat(1000), "é😀".repeat(500)] {
        let args = json!({"message": message});
        let result = relayed_call(&mut agent, "everything_echo", &args);
        assert_cut_at(&result, &format!("Echo: {message}"), 1024);
        assert_ne!(result["isError"], true, "{result}");
    }
    // A 3,000-byte image becomes a placeholder; every other block stays.
    let mut direct = {
        let (python, script) = fixture();
        Direct::start(&python, &[script.to_str().unwrap(), "stdio"])
    };
    let args = json!({"image_bytes": 3000});
    let mut expected = through::<CallToolResult>(&direct.call("kinds", &args));
    expected["content"][1] = json!({"type": "text",
        "text": "[substrat: image/png, 2.9 KiB: over this role's limit of 1 KiB, left out]"});
    assert_eq!(relayed_call(&mut agent, "fixture_kinds", &args), expected);
    // Structured content over what is left goes with a note; the text stays.
    let city = "c".repeat(600);
    let args = json!({"city": city});
    let direct_result = through::<CallToolResult>(&direct.call("dressed", &args));
    let relayed = relayed_call(&mut agent, "fixture_dressed", &args);
    assert_eq!(relayed["content"][0], direct_result["content"][0]);
    assert!(relayed.get("structuredContent").is_none(), "{relayed}");
    let note = relayed["content"][1]["text"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("[substrat: structuredContent, ")
            && note.ends_with("over what is left of this role's limit of 1 KiB, left out]"),
        "{relayed}"
    );
    // The tool has an output schema: without its structured content the
    // result is an error, so a client that checks the schema does not fail.
    assert_eq!(relayed["isError"], true, "{relayed}");
}
