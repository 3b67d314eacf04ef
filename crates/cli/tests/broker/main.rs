//! The broker, run as users run it: `substrat-sandbox daemon` in a fresh
//! process with its own state directory, agents made with the CLI, and
//! clients speaking MCP (JSON lines) on the agents' sockets.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;
use common::*;

mod content;
mod operator;
mod postgres;
mod protocol;
mod recovery;
mod robustness;
mod role_http;
mod roles;
mod team_ca;
mod tls;
mod tools;
mod upstreams;

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
        Self::start_with(dir, &[])
    }

    /// With more daemon arguments.
    fn start_with(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_with_env(dir, extra, &[])
    }

    /// With more daemon arguments and environment variables.
    fn start_with_env(dir: tempfile::TempDir, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let child = Command::new(bin())
            .args(["daemon"])
            .args(extra)
            .envs(env.iter().copied())
            .arg("--policies")
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
        agent_json(&self.state(), args)
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
