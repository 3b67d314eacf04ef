//! Agent teams end to end: `substrat-sandbox daemon --provider stand-in`
//! in a fresh process, turns run by the stand-in agent in real sandboxes,
//! every step checked in the daemon's own SQLite state and on the host.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../src/team_plan.rs"]
mod team_plan;

mod common;
use common::*;

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
    child: Child,
}

impl Team {
    fn start(backend: &'static str) -> Self {
        Self::start_with(backend, 3)
    }

    fn start_with(backend: &'static str, slots: u16) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ws")).unwrap();
        let child = Self::daemon(root.path(), backend, slots);
        Team {
            root,
            backend,
            child,
        }
    }

    fn daemon(root: &Path, backend: &str, slots: u16) -> Child {
        let child = Command::new(bin())
            .args(["daemon", "--provider", "stand-in", "--backend", backend])
            .args(["--slots", &slots.to_string()])
            .arg("--policies")
            .arg(repo().join("policies"))
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
        self.child = Self::daemon(self.root.path(), self.backend, 3);
    }

    fn agent(&self, args: &[&str]) -> Value {
        let out = Command::new(bin())
            .arg("agent")
            .args(args)
            .arg("--json")
            .arg("--state-dir")
            .arg(self.state())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "agent {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
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

// The same team over both backends: chats, socket, read-only mcp.json and
// the isolation between agents must not depend on the backend.
#[test]
fn team_flow_survives_a_daemon_kill_9_native() {
    team_flow("team_flow_survives_a_daemon_kill_9_native", "native");
}

#[test]
fn team_flow_survives_a_daemon_kill_9_bwrap() {
    team_flow("team_flow_survives_a_daemon_kill_9_bwrap", "bwrap");
}

fn team_flow(test: &str, backend: &'static str) {
    if !sandbox_works(test, backend) {
        return;
    }
    let mut team = Team::start(backend);
    let (ws, state, home) = (team.ws(), team.state(), home());
    let paths = TeamPaths {
        workspace: &ws,
        state_dir: &state,
        home: &home,
    };
    let ws_arg = ws.display().to_string();
    team.agent(&[
        "spawn",
        "lead",
        "--workspace",
        &ws_arg,
        &lead_instructions(&paths),
    ]);

    // Kill the daemon while the lead's turn that broadcast is still running.
    wait_until("the lead broadcasts", 60, || {
        team.count("SELECT COUNT(*) FROM messages WHERE kind = 'broadcast'") == 2
    });
    let lead_id = team.agent_id("lead");
    let running: i64 = team
        .db()
        .query_row(
            "SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'running'",
            [&lead_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        running, 1,
        "the lead's broadcasting turn runs when the daemon dies"
    );
    team.kill9_and_restart();
    wait_until("the flow settles after the restart", 90, || {
        team.settled() && team.turns("lead").len() == 4
    });

    // Every message exactly once, none lost: the re-run broadcast found its
    // first run's messages.
    let kinds: Vec<(String, i64)> = {
        let db = team.db();
        let mut stmt = db
            .prepare("SELECT kind, COUNT(*) FROM messages GROUP BY kind ORDER BY kind")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let expected: Vec<(String, i64)> = [
        ("broadcast", 2),
        ("instructions", 3),
        ("message", 1),
        ("reply", 3),
        ("report", 2),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), *n))
    .collect();
    assert_eq!(kinds, expected);

    // The lead: instructions, the sync reply, one reply per broadcast respondent.
    let lead = team.turns("lead");
    assert!(lead.iter().all(|t| t.status == "done"), "{lead:?}");
    assert_eq!(
        lead.iter().map(|t| t.kind.as_str()).collect::<Vec<_>>(),
        ["instructions", "reply", "reply", "reply"]
    );
    let question: (String, String) = team
        .db()
        .query_row(
            "SELECT id, text FROM messages WHERE kind = 'message'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(question.1, "What is 6*7?");
    let answer = &lead[1];
    assert_eq!(
        (
            answer.from.as_deref(),
            answer.thread.as_deref(),
            answer.text.as_deref()
        ),
        (
            Some("w1"),
            Some(question.0.as_str()),
            Some("the answer is 42")
        ),
        "the sync reply is the lead's next turn"
    );
    assert_eq!(answer.attempts, 2, "the turn the daemon died in ran again");
    assert!(
        answer
            .result
            .as_deref()
            .unwrap()
            .contains("call broadcast: ok:"),
        "{answer:?}"
    );
    let session = lead[0].session.clone().unwrap();
    assert!(
        lead.iter()
            .all(|t| t.session.as_deref() == Some(session.as_str())),
        "every later turn resumed the first session: {lead:?}"
    );
    let broadcast_thread: String = team
        .db()
        .query_row(
            "SELECT DISTINCT thread FROM messages WHERE kind = 'broadcast'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let mut respondents: Vec<&str> = lead[2..]
        .iter()
        .map(|t| {
            assert_eq!(t.thread.as_deref(), Some(broadcast_thread.as_str()));
            t.from.as_deref().unwrap()
        })
        .collect();
    respondents.sort();
    assert_eq!(respondents, ["w1", "w2"]);
    let inbox_reads: String = lead[2..]
        .iter()
        .map(|t| t.result.clone().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    for report in [
        "w1 finished its instructions: w1 ready",
        "w2 finished its instructions:",
    ] {
        assert_eq!(
            inbox_reads.matches(report).count(),
            1,
            "{report} in {inbox_reads}"
        );
    }

    // The worker's attempts on its sibling, the daemon's state and its own
    // mcp.json all failed, seen from inside its sandbox.
    let w2 = team.turns("w2");
    let probe = w2[0].result.clone().unwrap();
    let lines: Vec<&str> = probe.lines().collect();
    assert_eq!(lines.len(), 5, "{probe}");
    assert_eq!(
        lines[0],
        format!(
            "read {}/w1/notes.txt: error: No such file or directory (os error 2)",
            ws.display()
        )
    );
    assert_eq!(lines[1], format!("list {}: ok: w2", ws.display()));
    assert_eq!(
        lines[2],
        format!(
            "list {}/agents: error: No such file or directory (os error 2)",
            state.display()
        )
    );
    let own_chats = lines[3]
        .strip_prefix(&format!("list {}/.cursor/chats: ok: ", home.display()))
        .unwrap_or_else(|| panic!("{}", lines[3]));
    assert!(!own_chats.contains(','), "only its own chats: {own_chats}");
    assert_eq!(
        lines[4],
        "write .cursor/mcp.json: error: Read-only file system (os error 30)"
    );
    // The file the worker tried to read is there, and mcp.json is untouched.
    assert_eq!(
        std::fs::read_to_string(ws.join("w1/notes.txt")).unwrap(),
        "w1 private notes"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("w2/.cursor/mcp.json")).unwrap(),
        ""
    );
    let w2_id = team.agent_id("w2");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(state.join("agents").join(&w2_id).join("mcp.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config["mcpServers"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["substrat"]
    );
    // Each agent's sessions live in its own chats directory only.
    let w1_session = team.turns("w1")[0].session.clone().unwrap();
    let sessions_of = |id: &str| -> Vec<String> {
        let chats = state.join("agents").join(id).join("chats");
        let mut found = Vec::new();
        for hash in std::fs::read_dir(&chats).unwrap() {
            for s in std::fs::read_dir(hash.unwrap().path()).unwrap() {
                let s = s.unwrap().path();
                assert!(s.join("store.db").is_file(), "{}", s.display());
                found.push(s.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        found
    };
    assert_eq!(
        sessions_of(&team.agent_id("w1")),
        std::slice::from_ref(&w1_session)
    );
    assert!(!sessions_of(&w2_id).contains(&w1_session));
    for name in ["lead", "w1", "w2"] {
        assert_eq!(team.state_of(name)["state"], "idle", "{name}");
    }
}

#[test]
fn a_killed_turn_fails_its_agent_and_the_team_goes_on_native() {
    killed_turn(
        "a_killed_turn_fails_its_agent_and_the_team_goes_on_native",
        "native",
    );
}

#[test]
fn a_killed_turn_fails_its_agent_and_the_team_goes_on_bwrap() {
    killed_turn(
        "a_killed_turn_fails_its_agent_and_the_team_goes_on_bwrap",
        "bwrap",
    );
}

fn killed_turn(test: &str, backend: &'static str) {
    if !sandbox_works(test, backend) {
        return;
    }
    let mut team = Team::start(backend);
    let sleepy = json!({"turns": [
        {"when": "work", "steps": [{"sleep_ms": 60000}, {"reply": "worked"}]},
        {"when": "nap", "steps": [{"sleep_ms": 3000}, {"reply": "napped"}]},
        {"steps": [{"reply": "up"}]},
    ]});
    let boss = json!({"turns": [
        {"when": "No reply from sleepy", "steps": [{"reply": "boss saw: {prompt}"}]},
        {"when": "carry on", "steps": [
            {"emit_raw": "this is not json"},
            {"emit_raw": "{\"type\":\"thinking\",\"text\":\"hm\"}"},
            {"reply": "carrying on"},
        ]},
        {"steps": [
            {"call": "spawn_agent", "args": {"name": "sleepy", "instructions": with_plan("You are sleepy.", &sleepy)}},
            {"call": "send_message", "args": {"recipient": "sleepy", "text": "work"}},
            {"reply": "asked"},
        ]},
    ]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "boss",
        "--workspace",
        &ws,
        &with_plan("Boss.", &boss),
    ]);
    let busy_with = |team: &Team, kind: &str| {
        team.turns("sleepy")
            .iter()
            .any(|t| t.status == "running" && t.kind == kind)
    };
    wait_until("sleepy works on the message", 60, || {
        busy_with(&team, "message")
    });
    assert_eq!(team.state_of("sleepy")["state"], "busy");
    let killed = team.agent(&["kill", "sleepy"]);
    assert_eq!(killed["stopped_running_turn"], true);
    wait_until("the team settles after the kill", 30, || team.settled());
    let sleepy_state = team.state_of("sleepy");
    assert_eq!(
        (
            sleepy_state["state"].as_str(),
            sleepy_state["reason"].as_str()
        ),
        (Some("failed"), Some("killed by the operator"))
    );
    let work = team.turns("sleepy")[1].clone();
    assert_eq!(
        (work.status.as_str(), work.error.as_deref()),
        ("failed", Some("killed by the operator"))
    );
    // The sender is told, as its next turn, and goes on.
    let boss_turns = team.turns("boss");
    let notice = boss_turns.last().unwrap();
    assert_eq!(notice.kind, "no_reply");
    assert!(
        notice
            .result
            .as_deref()
            .unwrap()
            .starts_with("boss saw: No reply from sleepy (to message "),
        "{notice:?}"
    );
    assert!(
        notice
            .result
            .as_deref()
            .unwrap()
            .ends_with("its turn failed: killed by the operator")
    );
    team.agent(&["send", "boss", "carry on"]);
    wait_until("the boss carries on", 30, || {
        team.settled() && team.turns("boss").len() == 3
    });
    assert_eq!(team.turns("boss")[2].result.as_deref(), Some("carrying on"));
    // Odd lines in the provider's stream are kept in the turn's activity.
    let boss_view = team.agent(&["inspect", "boss"]);
    let notes = &boss_view["activity"]["recent_turns"][0]["stream_notes"];
    assert_eq!(
        notes["notes"],
        json!([
            "malformed line (expected ident at line 1 column 2): this is not json",
            "unknown event `thinking`"
        ]),
        "{notes}"
    );
    // Only a suspended or failed agent can be resumed.
    let refused = team.agent_fails(&["resume", "boss"]);
    assert!(
        refused.contains("only a suspended or failed agent can be resumed"),
        "{refused}"
    );

    // A failed agent runs nothing until resumed; suspend stops a running
    // turn and queues it again; both survive a daemon restart.
    team.agent(&["send", "sleepy", "nap"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(team.state_of("sleepy")["state"], "failed");
    assert_eq!(team.state_of("sleepy")["queued_turns"], 1);
    let resumed = team.agent(&["resume", "sleepy"]);
    assert_eq!(
        resumed["continue_turn_queued"], false,
        "its nap turn was queued"
    );
    wait_until("sleepy naps", 30, || busy_with(&team, "operator"));
    let suspended = team.agent(&["suspend", "sleepy"]);
    assert_eq!(suspended["stopped_running_turn"], true);
    wait_until("the nap turn is queued again", 30, || {
        team.turns("sleepy").last().unwrap().status == "queued"
    });
    team.kill9_and_restart();
    std::thread::sleep(Duration::from_millis(1500));
    let after = team.state_of("sleepy");
    assert_eq!(
        (after["state"].as_str(), after["queued_turns"].as_u64()),
        (Some("suspended"), Some(1))
    );
    let session = after["session_id"].as_str().unwrap().to_string();
    team.agent(&["resume", "sleepy"]);
    wait_until("the nap finishes", 30, || team.settled());
    let nap = team.turns("sleepy").last().unwrap().clone();
    assert_eq!(
        (
            nap.kind.as_str(),
            nap.status.as_str(),
            nap.result.as_deref(),
            nap.attempts
        ),
        ("operator", "done", Some("napped"), 2)
    );
    assert_eq!(
        nap.session.as_deref(),
        Some(session.as_str()),
        "resumed with --resume"
    );
    assert_eq!(team.state_of("sleepy")["state"], "idle");
}

#[test]
fn a_child_workspace_swapped_for_a_link_is_refused() {
    let test = "a_child_workspace_swapped_for_a_link_is_refused";
    if !sandbox_works(test, "native") {
        return;
    }
    let team = Team::start("native");
    let lead = json!({"turns": [{"steps": [
        {"call": "spawn_agent", "args": {"name": "kid", "workspace_subdir": "a/kid",
            "instructions": with_plan("Kid.", &json!({"turns": [{"steps": [{"reply": "ok"}]}]}))}},
        {"reply": "spawned"},
    ]}]});
    let ws = team.ws();
    team.agent(&[
        "spawn",
        "lead",
        "--workspace",
        &ws.display().to_string(),
        &with_plan("Lead.", &lead),
    ]);
    wait_until("the kid's first turn", 60, || {
        team.settled() && team.turns("kid").len() == 1
    });
    assert_eq!(team.turns("kid")[0].status, "done");
    // The lead (its workspace is above the kid's) swaps a directory on the
    // kid's path for a link to a directory of the host.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("kid")).unwrap();
    std::fs::rename(ws.join("a"), ws.join("a-old")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.join("a")).unwrap();
    team.agent(&["send", "kid", "hi"]);
    wait_until("the kid's second turn ends", 60, || {
        team.settled() && team.turns("kid").len() == 2
    });
    let turn = team.turns("kid")[1].clone();
    assert_eq!(turn.status, "failed");
    let reason = turn.error.unwrap();
    assert!(
        reason.contains("open workspace") && reason.contains("symbolic links"),
        "{reason}"
    );
    assert!(
        !outside.path().join("kid/.cursor").exists(),
        "nothing made through the link"
    );
    assert_eq!(team.state_of("kid")["state"], "failed");
}

#[test]
fn turns_wait_for_a_free_slot() {
    let test = "turns_wait_for_a_free_slot";
    if !sandbox_works(test, "native") {
        return;
    }
    let team = Team::start_with("native", 1);
    let nap = with_plan(
        "Nap.",
        &json!({"turns": [{"steps": [{"sleep_ms": 700}, {"reply": "rested"}]}]}),
    );
    let ws = team.ws().display().to_string();
    for name in ["one", "two", "three"] {
        team.agent(&["spawn", name, "--workspace", &ws, &nap]);
    }
    // With one slot, never two turns at once; the others wait queued.
    let (mut most_running, mut saw_waiting) = (0, false);
    wait_until("all three turns ran", 60, || {
        let running = team.count("SELECT COUNT(*) FROM turns WHERE status = 'running'");
        let queued = team.count("SELECT COUNT(*) FROM turns WHERE status = 'queued'");
        most_running = most_running.max(running);
        saw_waiting |= running == 1 && queued >= 1;
        team.count("SELECT COUNT(*) FROM turns WHERE status = 'done'") == 3
    });
    assert_eq!(most_running, 1, "one slot, one turn at a time");
    assert!(saw_waiting, "a turn waited in the queue for the slot");
}
