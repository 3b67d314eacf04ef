//! Team scale benchmark (docs/benchmarks.md): a daemon with the stand-in
//! agent, 1,000 registered agents, then 100 of them given a turn at once,
//! twice. Records the time to register the agents, the daemon's memory per
//! idle agent, the time for each round of 100 turns, and the daemon's
//! descriptors and threads before and after (a leak shows as growth).
//!
//! Run: `cargo run --release --example team_scale` (scripts/bench-broker);
//! `WARM=0` runs every turn cold (without `daemon --warm`). Needs a host
//! where the native backend builds sandboxes (root or user namespaces).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/mod.rs"]
mod common;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use common::{control, target_dir};

const AGENTS: usize = 1000;
const RUNNING: usize = 100;

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

/// The daemon's open descriptors and threads.
fn fds_and_threads(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (fds, status_kib(pid, "Threads:"))
}

fn done_turns(state: &Path) -> i64 {
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.query_row(
        "SELECT COUNT(*) FROM turns WHERE status IN ('done', 'failed')",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

fn failed_turns(state: &Path) -> Vec<String> {
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut stmt = db
        .prepare("SELECT COALESCE(error, '') FROM turns WHERE status = 'failed' LIMIT 5")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn start_daemon(state: &Path, warm: bool) -> Child {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    let mut command = Command::new(target_dir().join("substrat-sandbox"));
    command
        .args(["daemon", "--provider", "stand-in", "--backend", "native"])
        .args(["--slots", &RUNNING.to_string()])
        .arg("--policies")
        .arg(&policies)
        .arg("--state-dir")
        .arg(state)
        .env("SUBSTRAT_LOG", "error")
        .stdin(Stdio::null());
    if warm {
        // Released 5 s after their last turn: the descriptors and threads
        // are counted once they are gone.
        command.args(["--warm", "--warm-idle", "5"]);
    }
    let daemon = command.spawn().unwrap();
    while UnixStream::connect(state.join("control.sock")).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
}

/// A turn for each of the first `RUNNING` agents, at once; the time until
/// every one has ended (`ended_before` turns had ended before).
fn round(state: &Path, ended_before: i64) -> Duration {
    let start = Instant::now();
    for i in 0..RUNNING {
        control(
            state,
            json!({"op": "send", "name": format!("a{i}"), "text": "hello"}),
        );
    }
    let want = ended_before + RUNNING as i64;
    while done_turns(state) < want {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the turns did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn main() {
    let warm = std::env::var("WARM").map_or(true, |v| v != "0");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let workspaces = dir.path().join("ws");
    let mut daemon = start_daemon(&state, warm);
    let pid = daemon.id();
    std::thread::sleep(Duration::from_millis(300));
    let rss_start = status_kib(pid, "VmRSS:");
    let start = Instant::now();
    for i in 0..AGENTS {
        let ws = workspaces.join(format!("a{i}"));
        std::fs::create_dir_all(&ws).unwrap();
        control(
            &state,
            json!({"op": "create", "name": format!("a{i}"), "role": "worker", "parent": null,
                   "workspace": ws.display().to_string()}),
        );
    }
    let registering = start.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let rss_registered = status_kib(pid, "VmRSS:");
    let before = fds_and_threads(pid);
    let first = round(&state, 0);
    let second = round(&state, RUNNING as i64);
    // Turns ended; the warm sandboxes released (idle 5 s, swept each
    // second), and the runtime's idle blocking threads gone (10 s).
    std::thread::sleep(Duration::from_secs(12));
    let after = fds_and_threads(pid);
    let failed = failed_turns(&state);
    println!(
        "team scale, {} turns",
        if warm { "warm (daemon --warm)" } else { "cold" }
    );
    println!(
        "| register {AGENTS} agents | {:.2} s | {:.0} per s |",
        registering.as_secs_f64(),
        AGENTS as f64 / registering.as_secs_f64()
    );
    println!(
        "| daemon RSS | {rss_start} KiB at start, {rss_registered} KiB with {AGENTS} agents: {:.1} KiB per idle agent |",
        (rss_registered.saturating_sub(rss_start)) as f64 / AGENTS as f64
    );
    println!(
        "| {RUNNING} turns at once, first round | {:.2} s |",
        first.as_secs_f64()
    );
    println!(
        "| {RUNNING} turns at once, second round | {:.2} s |",
        second.as_secs_f64()
    );
    println!(
        "| daemon descriptors and threads | before {} fds, {} threads; after {} fds, {} threads |",
        before.0, before.1, after.0, after.1
    );
    println!("| failed turns | {} {failed:?} |", failed.len());
    let _ = daemon.kill();
    let _ = daemon.wait();
}
