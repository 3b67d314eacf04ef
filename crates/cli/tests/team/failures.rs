//! Turns that fail, workspaces swapped for links, turns waiting for a slot.

use super::*;

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

/// A CLI older than its provider is written for fails each turn at once,
/// saying so (a stand-in `codex` in npm's layout that reports 0.100.0).
#[test]
fn a_cli_older_than_its_provider_fails_its_turns_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let modules = root.path().join("node_modules");
    let vendor = modules.join("@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin");
    std::fs::create_dir_all(&vendor).unwrap();
    std::fs::create_dir_all(modules.join("@openai/codex/bin")).unwrap();
    std::fs::create_dir_all(modules.join(".bin")).unwrap();
    let program = vendor.join("codex");
    std::fs::write(
        &program,
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'codex-cli 0.100.0'\n",
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = modules.join("@openai/codex/bin/codex.js");
    std::fs::write(&script, "").unwrap();
    std::os::unix::fs::symlink(&script, modules.join(".bin/codex")).unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let path = format!(
        "{}:{}",
        modules.join(".bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new(bin())
        .args(["daemon", "--provider", "codex", "--backend", "native"])
        .arg("--policies")
        .arg(repo().join("policies"))
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .env("PATH", path)
        .env("SUBSTRAT_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let control = root.path().join("state/control.sock");
    wait_until("the daemon listens", 10, || {
        UnixStream::connect(&control).is_ok()
    });
    let team = Team {
        root,
        backend: "native",
        policies: repo().join("policies"),
        child,
        extra: Vec::new(),
    };
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "old", "--workspace", &ws, "hello"]);
    wait_until("the turn ends", 30, || team.settled());
    let turns = team.turns("old");
    assert_eq!(turns.len(), 1, "{turns:#?}");
    assert_eq!(turns[0].status, "failed");
    assert_eq!(
        turns[0].error.as_deref(),
        Some(
            "codex codex-cli 0.100.0 is older than 0.169.0, the oldest version this daemon runs (its flags and configuration are those of 0.169.0); update it"
        )
    );
}

/// `demo --provider claude --model-upstream ... --model ...`: the team on
/// a model endpoint the operator names, the model it asks for; a lead
/// that gives up stops the demo at once (not after its five minutes) with
/// the turns and the reason, and its temporary directory is removed.
#[test]
fn a_demo_whose_lead_gives_up_stops_at_once_and_cleans_up() {
    let test = "a_demo_whose_lead_gives_up_stops_at_once_and_cleans_up";
    if !super::clis::clis_available(test, "claude") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rules = serde_json::json!([{"when": "You lead a small team", "final": "I will not"}]);
    let model = super::clis::Model::start(dir.path(), &rules);
    let start = std::time::Instant::now();
    let out = Command::new(bin())
        .args([
            "demo",
            "--provider",
            "claude",
            "--model",
            "claude-scripted-7",
        ])
        .arg("--model-upstream")
        .arg(format!("anthropic=http://127.0.0.1:{}", model.port))
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        1,
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
    assert!(
        stdout.contains(&format!("against http://127.0.0.1:{}", model.port)),
        "{stdout}"
    );
    assert!(
        stdout.contains("  [lead] instructions turn, done: I will not"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "== stopped: the team can no longer finish: no turn runs or waits (lead idle)"
        ),
        "{stdout}"
    );
    let removed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("== removed "))
        .and_then(|l| l.strip_suffix(" (--keep keeps it)"))
        .unwrap_or_else(|| panic!("no removal said: {stdout}"));
    assert!(!Path::new(removed).exists(), "{removed} is left");
    let asked: Vec<Value> = model.requests();
    assert!(
        asked.iter().any(|r| r["model"] == "claude-scripted-7"),
        "the model asked for: {asked:?}"
    );
}
