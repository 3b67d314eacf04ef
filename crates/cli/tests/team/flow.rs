//! The whole team flow on each backend, through a daemon killed with -9.

use super::*;

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
        &std::fs::read_to_string(state.join("agents").join(&w2_id).join("config/0-mcp.json"))
            .unwrap(),
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

/// The README's main job: `demo` exits 0 only if every step happened.
#[test]
fn the_stand_in_demo_holds() {
    let test = "the_stand_in_demo_holds";
    if !sandbox_works(test, "native") {
        return;
    }
    let out = Command::new(bin()).arg("demo").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // Progress while the team works: the agents' states as they change.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("  ... lead ") && l.ends_with(" s)")),
        "{stdout}"
    );
}
