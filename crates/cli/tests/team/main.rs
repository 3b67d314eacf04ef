//! Agent teams end to end: `substrat-sandbox daemon --provider stand-in`
//! in a fresh process, turns run by the stand-in agent in real sandboxes,
//! every step checked in the daemon's own SQLite state and on the host.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../src/team_plan.rs"]
mod team_plan;

#[path = "../common/mod.rs"]
mod common;
use common::*;

mod clis;
mod containerd;
mod daemons;
mod engine;
mod engine_sweep;
mod failures;
mod flow;
mod gateway_doors;
mod inline;
mod layers;
mod models;
mod placement;
mod remote;
mod runtime_dir;
mod secrets;
mod warm;
mod why;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use team_plan::{TeamPaths, lead_instructions, with_plan};

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").expect("HOME"))
}

/// Whether a sandbox can be built here with `backend`; a test that cannot
/// run says so by name.
fn sandbox_works(test: &str, backend: &str) -> bool {
    let out = Command::new(bin())
        .args([
            "run",
            "--policy",
            "worker",
            "--backend",
            backend,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    if !out.status.success() {
        println!(
            "SKIPPED {test}: no {backend} sandbox on this host: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    out.status.success()
}

struct Team {
    root: tempfile::TempDir,
    backend: &'static str,
    policies: PathBuf,
    child: Child,
    /// More daemon arguments (`--warm`).
    extra: Vec<&'static str>,
}

impl Team {
    fn start(backend: &'static str) -> Self {
        Self::start_with(backend, 3)
    }

    fn start_with(backend: &'static str, slots: u16) -> Self {
        Self::start_with_policies(backend, slots, repo().join("policies"))
    }

    fn start_with_policies(backend: &'static str, slots: u16, policies: PathBuf) -> Self {
        Self::start_with_args(backend, slots, policies, Vec::new())
    }

    fn start_with_args(
        backend: &'static str,
        slots: u16,
        policies: PathBuf,
        extra: Vec<&'static str>,
    ) -> Self {
        Self::start_in(
            tempfile::tempdir().unwrap(),
            backend,
            slots,
            policies,
            extra,
        )
    }

    /// A team whose state directory and workspace are in `root`.
    fn start_in(
        root: tempfile::TempDir,
        backend: &'static str,
        slots: u16,
        policies: PathBuf,
        extra: Vec<&'static str>,
    ) -> Self {
        std::fs::create_dir(root.path().join("ws")).unwrap();
        let child = Self::daemon(root.path(), backend, slots, &policies, &extra);
        Team {
            root,
            backend,
            policies,
            child,
            extra,
        }
    }

    fn daemon(root: &Path, backend: &str, slots: u16, policies: &Path, extra: &[&str]) -> Child {
        let child = Command::new(bin())
            .args(["daemon", "--provider", "stand-in", "--backend", backend])
            .args(["--slots", &slots.to_string()])
            .args(extra)
            .arg("--policies")
            .arg(policies)
            .arg("--state-dir")
            .arg(root.join("state"))
            .env("SUBSTRAT_LOG", "warn,rmcp=error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let control = root.join("state/control.sock");
        wait_until("the daemon listens", 10, || {
            UnixStream::connect(&control).is_ok()
        });
        child
    }

    fn ws(&self) -> PathBuf {
        self.root.path().join("ws").canonicalize().unwrap()
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn kill9_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let _ = std::fs::remove_file(self.state().join("control.sock"));
        self.child = Self::daemon(
            self.root.path(),
            self.backend,
            3,
            &self.policies,
            &self.extra,
        );
    }

    fn agent(&self, args: &[&str]) -> Value {
        agent_json(&self.state(), args).unwrap_or_else(|e| panic!("agent {args:?}: {e}"))
    }

    /// `agent ARGS` that must fail: its message.
    fn agent_fails(&self, args: &[&str]) -> String {
        let out = Command::new(bin())
            .arg("agent")
            .args(args)
            .arg("--state-dir")
            .arg(self.state())
            .output()
            .unwrap();
        assert!(!out.status.success(), "agent {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn db(&self) -> Connection {
        Connection::open_with_flags(
            self.state().join("state.db"),
            OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap()
    }

    fn count(&self, sql: &str) -> i64 {
        self.db().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// No turn queued or running.
    fn settled(&self) -> bool {
        self.count("SELECT COUNT(*) FROM turns WHERE status IN ('queued', 'running')") == 0
    }

    fn agent_id(&self, name: &str) -> String {
        self.db()
            .query_row("SELECT id FROM agents WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .unwrap()
    }

    /// The agent's turns, oldest first: (kind, prompt, status, result, error, attempts, session).
    fn turns(&self, name: &str) -> Vec<Turn> {
        let db = self.db();
        let mut stmt = db
            .prepare(
                "SELECT COALESCE(m.kind, 'resume'), COALESCE(m.text, t.prompt), t.status, t.result, t.error, t.attempts, t.session_id, m.from_name, m.thread
                 FROM turns t JOIN agents a ON a.id = t.agent_id LEFT JOIN messages m ON m.id = t.message_id
                 WHERE a.name = ?1 ORDER BY t.seq",
            )
            .unwrap();
        stmt.query_map([name], |r| {
            Ok(Turn {
                kind: r.get(0)?,
                text: r.get(1)?,
                status: r.get(2)?,
                result: r.get(3)?,
                error: r.get(4)?,
                attempts: r.get(5)?,
                session: r.get(6)?,
                from: r.get(7)?,
                thread: r.get(8)?,
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    fn state_of(&self, name: &str) -> Value {
        let list = self.agent(&["list"]);
        list["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no agent {name} in {list}"))
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone)]
struct Turn {
    kind: String,
    text: Option<String>,
    status: String,
    result: Option<String>,
    error: Option<String>,
    attempts: u32,
    session: Option<String>,
    from: Option<String>,
    thread: Option<String>,
}

fn wait_until(what: &str, seconds: u64, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(seconds),
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell command searching a sandbox for a secret: every file below
/// 2 MiB on every mount but the kernel's and the host's system directories
/// (bound read-only; the daemon writes none of them), the environment and
/// every process's environment and command line, collected before the
/// secret is decoded (it travels base64-encoded, so the command itself, in
/// /proc and in session files, is not what the search finds). Writes
/// `real=N control=M` to found.txt in the working directory: N the hits of
/// the secret, M those of `control`, a string that must be found (proof
/// the search saw what it searched). No command substitution: Gemini CLI's
/// shell tool refuses `$(...)`.
fn secret_search(encoded: &str, control: &str) -> String {
    format!(
        "(env; cat /proc/*/environ /proc/*/cmdline; find / -type f -size -2M \
         -not -path '/proc/*' -not -path '/sys/*' -not -path '/dev/*' -not -path '/usr/*' \
         -not -path '/lib*' -not -path '/bin/*' -not -path '/sbin/*' \
         -not -path /tmp/seen -print0 2>/dev/null | xargs -0 -r cat 2>/dev/null) | tr '\\0' '\\n' > /tmp/seen; \
         echo {encoded} | base64 -d | {{ read -r k; printf 'real='; grep -c -F -- \"$k\" /tmp/seen; \
         printf ' control='; grep -c -F -- {control} /tmp/seen; }} | tr -d '\\n' > found.txt"
    )
}

fn base64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
