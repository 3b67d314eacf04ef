//! The built stand-in binary end to end: CLI, stream-json events, the
//! session store, resume, and a real MCP server over stdio.
// Test helpers outside #[test] functions may unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_substrat-stand-in-agent");

struct Run {
    code: i32,
    events: Vec<Value>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn types(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?"))
            .collect()
    }

    fn result(&self) -> &Value {
        let last = self.events.last().expect("no events");
        assert_eq!(last["type"], "result", "last event: {last}");
        last
    }

    fn session_id(&self) -> String {
        self.result()["session_id"].as_str().unwrap().to_string()
    }
}

struct Env {
    home: tempfile::TempDir,
    ws: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            home: tempfile::tempdir().unwrap(),
            ws: tempfile::tempdir().unwrap(),
        }
    }

    fn ws(&self) -> PathBuf {
        self.ws.path().canonicalize().unwrap()
    }

    fn run(&self, extra: &[&str], prompt: &str) -> Run {
        let mut args = vec![
            "--print",
            "--output-format",
            "stream-json",
            "--trust",
            "--approve-mcps",
            "--model",
            "test-model",
        ];
        let ws = self.ws();
        args.extend(["--workspace", ws.to_str().unwrap()]);
        args.extend(extra);
        args.push(prompt);
        self.raw(&args)
    }

    fn raw(&self, args: &[&str]) -> Run {
        let out = Command::new(BIN)
            .args(args)
            .env("HOME", self.home.path())
            .current_dir(self.home.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let events = stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        Run {
            code: out.status.code().unwrap_or(-1),
            events,
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn store(&self, session: &str) -> PathBuf {
        let digest = Sha256::digest(self.ws().to_str().unwrap().as_bytes());
        let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.home
            .path()
            .join(".cursor/chats")
            .join(&hash[..32])
            .join(session)
            .join("store.db")
    }
}

fn with_plan(text: &str, plan: &Value) -> String {
    format!("{text}\n```substrat-plan\n{plan}\n```\n")
}

fn file_plan() -> Value {
    json!({"turns": [
        {"when": "Reply from w1", "steps": [{"reply": "w1 said: {prompt}"}]},
        {"steps": [
            {"write": "notes.txt", "text": "hello notes"},
            {"read": "notes.txt"},
            {"reply": "done: {last}"}
        ]}
    ]})
}

fn tables(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn meta(db: &Path) -> Value {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let hex: String = conn
        .query_row("SELECT value FROM meta WHERE key = '0'", [], |r| r.get(0))
        .unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn runs_a_plan_then_resumes_it() {
    let env = Env::new();
    let first = env.run(&[], &with_plan("Start the work.", &file_plan()));
    assert_eq!(first.code, 0, "stderr: {}", first.stderr);
    assert_eq!(first.types(), ["system", "user", "assistant", "result"]);
    let session = first.session_id();
    let init = &first.events[0];
    assert_eq!(init["subtype"], "init");
    assert_eq!(init["model"], "test-model");
    assert_eq!(init["cwd"], env.ws().to_str().unwrap());
    assert_eq!(init["session_id"], session.as_str());
    let text = "done: read notes.txt: ok: hello notes";
    assert_eq!(first.events[2]["message"]["content"][0]["text"], text);
    assert!(first.events[2].get("timestamp_ms").is_none());
    let result = first.result();
    assert_eq!(
        (result["subtype"].as_str(), result["is_error"].as_bool()),
        (Some("success"), Some(false))
    );
    assert_eq!(result["result"], text);
    assert_eq!(
        std::fs::read_to_string(env.ws().join("notes.txt")).unwrap(),
        "hello notes"
    );
    let db = env.store(&session);
    assert!(db.is_file(), "{} missing", db.display());
    assert_eq!(tables(&db), ["blobs", "meta"]);
    let meta = meta(&db);
    assert_eq!(meta["agentId"], session.as_str());
    assert_eq!(meta["latestRootBlobId"].as_str().map(str::len), Some(64));

    let prompt = "Reply from w1 (to message x):\nhello";
    let second = env.run(&["--resume", &session], prompt);
    assert_eq!(second.code, 0, "stderr: {}", second.stderr);
    assert_eq!(second.types(), ["system", "user", "assistant", "result"]);
    assert_eq!(second.session_id(), session);
    assert_eq!(second.result()["result"], format!("w1 said: {prompt}"));
    assert_eq!(second.events[1]["message"]["content"][0]["text"], prompt);
}

#[test]
fn resuming_an_unknown_session_is_an_error_result() {
    let env = Env::new();
    let id = "0b7c4a2e-4d1f-4c55-9a51-5d2f0f0f0f0f";
    let run = env.run(&["--resume", id], "hi");
    assert_eq!(run.code, 1);
    assert_eq!(run.types(), ["result"]);
    let result = run.result();
    assert_eq!(result["is_error"], true);
    assert_eq!(result["subtype"], "error");
    assert_eq!(result["result"], format!("session {id} not found"));
    assert!(!env.store(id).exists());
}

#[test]
fn headless_flags_are_required() {
    let env = Env::new();
    let run = env.raw(&[
        "--print",
        "--output-format",
        "stream-json",
        "--approve-mcps",
        "hi",
    ]);
    assert_eq!(run.code, 2);
    assert_eq!(run.stdout, "");
    assert!(run.stderr.contains("--trust"), "stderr: {}", run.stderr);
    let run = env.raw(&[
        "--print",
        "--output-format",
        "stream-json",
        "--trust",
        "--approve-mcps",
        "--nope",
        "hi",
    ]);
    assert_eq!(run.code, 2);
    let run = env.raw(&["--version"]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.starts_with("substrat-stand-in-agent "));
}

#[test]
fn no_plan_means_nothing_to_do() {
    let env = Env::new();
    let run = env.run(&[], "just chatting");
    assert_eq!(run.code, 0);
    assert_eq!(
        run.result()["result"],
        "stand-in: nothing to do for: just chatting"
    );
}

#[test]
fn partial_output_streams_chunks_before_the_final_text() {
    let env = Env::new();
    let plan = json!({"turns": [{"steps": [{"reply": "a reply long enough for several chunks: {prompt}"}]}]});
    let run = env.run(
        &["--stream-partial-output"],
        &with_plan("the prompt", &plan),
    );
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let full = "a reply long enough for several chunks: the prompt";
    let assistants: Vec<&Value> = run
        .events
        .iter()
        .filter(|e| e["type"] == "assistant")
        .collect();
    let (last, deltas) = assistants.split_last().unwrap();
    assert!(deltas.len() > 1);
    let mut joined = String::new();
    for d in deltas {
        assert!(
            d["timestamp_ms"].as_u64().is_some(),
            "delta without timestamp_ms: {d}"
        );
        let chunk = d["message"]["content"][0]["text"].as_str().unwrap();
        assert!(chunk.chars().count() <= 16);
        joined.push_str(chunk);
    }
    assert_eq!(joined, full);
    assert!(last.get("timestamp_ms").is_none());
    assert_eq!(last["message"]["content"][0]["text"], full);
    assert_eq!(run.result()["result"], full);
}

#[test]
fn raw_lines_fail_and_exit_steps() {
    let env = Env::new();
    let plan = json!({"turns": [
        {"when": "crash", "steps": [{"emit_raw": "not json at all"}, {"exit": 3}]},
        {"when": "odd", "steps": [{"frobnicate": true}]},
        {"steps": [{"read": "missing.txt"}, {"fail": "gave up after {last}"}]}
    ]});
    let run = env.run(&[], &with_plan("crash now", &plan));
    assert_eq!(run.code, 3);
    assert_eq!(run.types(), ["system", "user"]);
    assert!(run.stdout.contains("\nnot json at all\n"));

    let run = env.run(&[], &with_plan("odd one", &plan));
    assert_eq!(run.code, 1);
    assert_eq!(run.types(), ["system", "user", "result"]);
    let text = run.result()["result"].as_str().unwrap().to_string();
    assert!(
        text.starts_with("unknown step kind \"frobnicate\""),
        "{text}"
    );

    let run = env.run(&[], &with_plan("other", &plan));
    assert_eq!(run.code, 1);
    assert_eq!(
        run.result()["result"],
        "gave up after read missing.txt: error: No such file or directory (os error 2)"
    );
}

const SERVER: &str = r#"
import os
try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server

server = Server("stand-in-test")

@server.tool()
def echo(text: str) -> str:
    """Echo the text back with the configured prefix."""
    return os.environ.get("ECHO_PREFIX", "") + text

def filler(i):
    def f() -> str:
        return f"filler {i}"
    return f

for i in range(45):
    server.add_tool(filler(i), name=f"filler_{i:02d}", description="filler")

with open("server.pid", "w") as pid:
    pid.write(str(os.getpid()))
server.run()
"#;

fn python_mcp_available() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn gone(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    stat.map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
}

#[test]
fn stand_in_calls_mcp_tool() {
    if !python_mcp_available() {
        println!("SKIPPED stand_in_calls_mcp_tool: python3 mcp package not installed");
        return;
    }
    let env = Env::new();
    let ws = env.ws();
    std::fs::write(ws.join("server.py"), SERVER).unwrap();
    std::fs::create_dir(ws.join(".cursor")).unwrap();
    let config = json!({"mcpServers": {
        "py": {"command": "python3", "args": ["server.py"], "env": {"ECHO_PREFIX": "echo: "}},
        "web": {"url": "http://127.0.0.1:9/mcp"}
    }});
    std::fs::write(ws.join(".cursor/mcp.json"), config.to_string()).unwrap();
    let plan = json!({"turns": [{"steps": [
        {"call": "echo", "args": {"text": "hi"}},
        {"call": "filler_44"},
        {"reply": "{results}"}
    ]}]});
    let run = env.run(&[], &with_plan("use the tools", &plan));
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(
        run.stderr
            .contains("stand-in: keeping the first 40 of 46 tools"),
        "stderr: {}",
        run.stderr
    );
    assert_eq!(
        run.types(),
        [
            "system",
            "user",
            "tool_call",
            "tool_call",
            "tool_call",
            "tool_call",
            "assistant",
            "result"
        ]
    );
    let (started, completed) = (&run.events[2], &run.events[3]);
    assert_eq!(started["subtype"], "started");
    assert_eq!(
        started["tool_call"]["mcpToolCall"],
        json!({"name": "echo", "args": {"text": "hi"}})
    );
    assert_eq!(completed["subtype"], "completed");
    assert_eq!(completed["call_id"], started["call_id"]);
    assert_eq!(
        completed["tool_call"]["mcpToolCall"],
        json!({"name": "echo", "is_error": false, "result": "echo: hi"})
    );
    assert_eq!(run.events[5]["tool_call"]["mcpToolCall"]["is_error"], true);
    assert_eq!(
        run.result()["result"],
        "call echo: ok: echo: hi\ncall filler_44: error: not among the 40 tools offered"
    );
    let pid = std::fs::read_to_string(ws.join("server.pid")).unwrap();
    assert!(gone(pid.trim()), "MCP server {pid} still running");
}
