//! New agents' first turns (docs/benchmarks.md, issue 23): a daemon with
//! the stand-in agent, a lead agent in a workspace, then new agents of the
//! worker role in the same workspace, one at a time, each with a first
//! turn the stand-in answers at once, then a second. Each turn is timed
//! from queued to done by the daemon's own clock (milliseconds), for a
//! cold daemon, `--warm` (a new agent's first turn builds its sandbox) and
//! `--warm --warm-pool worker=1` (built ahead while the team works).
//!
//! Run: `cargo run --release --example first_turns` (scripts/bench-broker);
//! `BACKEND=bwrap` for the bwrap backend. Needs a host where that backend
//! builds sandboxes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/mod.rs"]
mod common;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use common::{control, target_dir};

const KIDS: usize = 25;

/// The agent's turns that ended: (status, queued -> done in ms), oldest first.
fn ended_turns(state: &Path, name: &str) -> Vec<(String, i64)> {
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut stmt = db
        .prepare(
            "SELECT t.status, t.finished_at - t.created_at FROM turns t JOIN agents a ON a.id = t.agent_id
             WHERE a.name = ?1 AND t.finished_at IS NOT NULL ORDER BY t.seq",
        )
        .unwrap();
    stmt.query_map([name], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn wait_turns(state: &Path, name: &str, count: usize) -> Vec<(String, i64)> {
    let start = Instant::now();
    loop {
        let ended = ended_turns(state, name);
        if ended.len() >= count {
            for (status, _) in &ended {
                assert_eq!(status, "done", "{name}: {ended:?}");
            }
            return ended;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{name}: no end");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The backend: `native`, or `BACKEND=bwrap`.
fn backend() -> String {
    std::env::var("BACKEND").unwrap_or_else(|_| "native".into())
}

fn start_daemon(state: &Path, extra: &[&str]) -> Child {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let daemon = Command::new(target_dir().join("substrat-sandbox"))
        .args(["daemon", "--provider", "stand-in", "--backend", &backend()])
        .args(["--slots", "8"])
        .args(extra)
        .arg("--policies")
        .arg(&policies)
        .arg("--state-dir")
        .arg(state)
        .env("SUBSTRAT_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    while UnixStream::connect(state.join("control.sock")).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
}

fn spawn(state: &Path, name: &str, ws: &Path) {
    control(
        state,
        json!({"op": "spawn", "name": name, "role": "worker", "workspace": ws.display().to_string(),
               "model": null, "instructions": "hello"}),
    );
}

/// First and second turns of `KIDS` new agents (ms, queued to done).
fn run(label: &str, extra: &[&str]) -> (Vec<i64>, Vec<i64>) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut daemon = start_daemon(&state, extra);
    spawn(&state, "lead", &ws);
    wait_turns(&state, "lead", 1);
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..KIDS {
        // Time for the pool to build again (the same pause in every mode).
        std::thread::sleep(Duration::from_millis(300));
        let name = format!("k{i}");
        spawn(&state, &name, &ws);
        first.push(wait_turns(&state, &name, 1)[0].1);
        control(&state, json!({"op": "send", "name": name, "text": "again"}));
        second.push(wait_turns(&state, &name, 2)[1].1);
        // Its sandbox released: only the pool's and the lead's stay.
        control(&state, json!({"op": "suspend", "name": name}));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    println!("{label}: first turns {first:?}, second turns {second:?}");
    (first, second)
}

fn median_p90(mut ms: Vec<i64>) -> (i64, i64) {
    ms.sort_unstable();
    (ms[ms.len() / 2], ms[(ms.len() * 9) / 10])
}

fn main() {
    let cold = run("cold", &[]);
    let warm = run("warm", &["--warm"]);
    let pool = run("warm pool", &["--warm", "--warm-pool", "worker=1"]);
    println!(
        "| a new agent's turns, queued to done (ms), {KIDS} agents, {} backend | first: median, p90 | second: median, p90 |",
        backend()
    );
    for (label, (first, second)) in [
        ("cold daemon", cold),
        ("daemon --warm", warm),
        ("daemon --warm --warm-pool worker=1", pool),
    ] {
        let (f50, f90) = median_p90(first);
        let (s50, s90) = median_p90(second);
        println!("| {label} | {f50}, {f90} | {s50}, {s90} |");
    }
}
