//! An agent of an overlay role: its turns write to its layer, never to the
//! workspace; the operator reviews, rolls back a turn and applies.

use super::*;

#[test]
fn an_overlay_agents_turns_are_reviewed_rolled_back_and_applied() {
    let test = "an_overlay_agents_turns_are_reviewed_rolled_back_and_applied";
    if !sandbox_works(test, "native") {
        return;
    }
    let policies = tempfile::tempdir().unwrap();
    std::fs::write(
        policies.path().join("reviewable.toml"),
        "version = 1\nextends = \"worker\"\n[filesystem]\nworkspace_mode = \"overlay\"\n",
    )
    .unwrap();
    let team = Team::start_with_policies("native", 3, policies.path().to_path_buf());
    let ws = team.ws();
    std::fs::write(ws.join("a.txt"), "host\n").unwrap();
    // A repository, so that the agent has a git dir of its own.
    git_in(&ws, &["init", "-q"]);
    git_in(&ws, &["add", "a.txt"]);
    git_in(&ws, &["commit", "-qm", "base"]);
    let base = git_in(&ws, &["rev-parse", "HEAD"]);
    // What a commit by the agent leaves in its own git dir: a new HEAD.
    let agent_head = "1234567890abcdef1234567890abcdef12345678";
    let plan = json!({"turns": [
        {"when": "second", "steps": [
            {"write": "b.txt", "text": "B\n"},
            {"write": ".git/HEAD", "text": format!("{agent_head}\n")},
            {"reply": "wrote b"},
        ]},
        {"when": "third", "steps": [{"write": "a.txt", "text": "A3\n"}, {"reply": "rewrote a"}]},
        {"steps": [{"write": "a.txt", "text": "A1\n"}, {"read": "a.txt"}, {"reply": "{results}"}]},
    ]});
    team.agent(&[
        "spawn",
        "rev",
        "--role",
        "reviewable",
        "--workspace",
        &ws.display().to_string(),
        &with_plan("first", &plan),
    ]);
    wait_until("the first turn", 60, || {
        team.settled() && team.turns("rev").len() == 1
    });
    for prompt in ["second", "third"] {
        team.agent(&["send", "rev", prompt]);
        let n = if prompt == "second" { 2 } else { 3 };
        wait_until(prompt, 60, || {
            team.settled() && team.turns("rev").len() == n
        });
    }
    let turns = team.turns("rev");
    assert!(turns.iter().all(|t| t.status == "done"), "{turns:?}");
    assert!(
        turns[0].result.as_deref().unwrap_or("").contains("A1"),
        "the agent read its own write: {turns:?}"
    );
    // The workspace is as it was; the agent list shows the layer's size.
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "host\n");
    assert!(!ws.join("b.txt").exists());
    assert!(team.state_of("rev")["layer_bytes"].as_u64().unwrap() > 0);

    let stat = |team: &Team| {
        let out = Command::new(bin())
            .args(["agent", "diff", "rev", "--stat", "--state-dir"])
            .arg(team.state())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = stat(&team);
    assert!(
        before.contains("M a.txt (file 644) +1 -1") && before.contains("A b.txt"),
        "{before}"
    );
    let diff = team.agent(&["diff", "rev"]);
    assert_eq!(diff["turns"], json!([1, 2, 3]), "{diff}");
    // Its commits are a range beside the layer; its git dir is not in it.
    assert_eq!(diff["commits"]["base"], json!(base), "{diff}");
    assert_eq!(diff["commits"]["head"], json!(agent_head), "{diff}");
    assert!(!before.contains(".git"), "{before}");
    assert!(
        before.starts_with(&format!("commits: {base}..{agent_head}")),
        "{before}"
    );

    // Undo the third turn only: a.txt is the first turn's again.
    team.agent(&["rollback", "rev", "--turn", "3"]);
    let patch = Command::new(bin())
        .args(["agent", "diff", "rev", "--state-dir"])
        .arg(team.state())
        .output()
        .unwrap();
    let patch = String::from_utf8_lossy(&patch.stdout);
    assert!(patch.contains("-host\n+A1\n"), "{patch}");

    let applied = team.agent(&["apply", "rev"]);
    assert_eq!(applied["applied"], json!(["a.txt", "b.txt"]), "{applied}");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "A1\n");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "B\n");
    assert!(stat(&team).contains("\n0 paths changed, 0 insertions(+), 0 deletions(-)\n"));

    // A direct agent has no layer to review.
    let refused = team.agent_fails(&["diff", "nobody"]);
    assert!(refused.contains("nobody"), "{refused}");
}

/// Issue 40: a turn that ran after the operator's diff stops a plain
/// apply; `agent review` suspends the agent while its owner reads, and
/// apply resumes it.
#[test]
fn review_suspends_the_agent_and_apply_takes_only_what_was_shown() {
    let test = "review_suspends_the_agent_and_apply_takes_only_what_was_shown";
    if !sandbox_works(test, "native") {
        return;
    }
    let policies = tempfile::tempdir().unwrap();
    std::fs::write(
        policies.path().join("reviewable.toml"),
        "version = 1\nextends = \"worker\"\n[filesystem]\nworkspace_mode = \"overlay\"\n",
    )
    .unwrap();
    let team = Team::start_with_policies("native", 3, policies.path().to_path_buf());
    let ws = team.ws();
    let plan = json!({"turns": [
        {"when": "second", "steps": [{"write": "unseen.txt", "text": "U\n"}, {"reply": "u"}]},
        {"when": "third", "steps": [{"write": "later.txt", "text": "L\n"}, {"reply": "l"}]},
        {"steps": [{"write": "seen.txt", "text": "S\n"}, {"reply": "s"}]},
    ]});
    team.agent(&[
        "spawn",
        "rev",
        "--role",
        "reviewable",
        "--workspace",
        &ws.display().to_string(),
        &with_plan("first", &plan),
    ]);
    wait_until("the first turn", 60, || {
        team.settled() && team.turns("rev").len() == 1
    });
    team.agent(&["diff", "rev"]);
    team.agent(&["send", "rev", "second"]);
    wait_until("the second turn", 60, || {
        team.settled() && team.turns("rev").len() == 2
    });
    let refused = team.agent_fails(&["apply", "rev"]);
    assert!(
        refused
            .contains("a turn ran after the last diff (the layer's turns then: [1], now: [1, 2])"),
        "{refused}"
    );
    assert!(!ws.join("seen.txt").exists() && !ws.join("unseen.txt").exists());

    // Review: suspended, then shown; a prompt sent meanwhile waits.
    let shown = team.agent(&["review", "rev"]);
    let digest = shown["digest"].as_str().unwrap().to_string();
    assert_eq!(team.state_of("rev")["state"], json!("suspended"), "{shown}");
    team.agent(&["send", "rev", "third"]);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let turns = team.turns("rev");
    let ran = turns.iter().filter(|t| t.status != "queued").count();
    assert_eq!(ran, 2, "no turn while under review: {turns:?}");
    let applied = team.agent(&["apply", "rev", "--expect", &digest]);
    assert_eq!(
        applied["applied"],
        json!(["seen.txt", "unseen.txt"]),
        "{applied}"
    );
    // Resumed by the apply: the prompt sent during the review runs.
    wait_until("the turn queued during the review", 60, || {
        team.settled() && team.turns("rev").iter().all(|t| t.status == "done")
    });
    assert_ne!(team.state_of("rev")["state"], json!("suspended"));
    assert!(!ws.join("later.txt").exists(), "its write is in the layer");
}
