//! `daemon --warm`: an agent's turns in one sandbox kept between them (its
//! /tmp lasts), released on suspend; the confinement of such turns is
//! proven in the cli tests (check --prove --warm).

use super::*;

/// The daemon's children serving turns (launchers with `--serve-turns`;
/// their own children, forked, share the command line).
fn warm_launchers(team: &Team) -> usize {
    let daemon = team.child.id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // The parent pid: the 2nd field after the command's parentheses.
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1));
            ppid == Some(daemon.as_str())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains("--serve-turns"))
        .count()
}

#[test]
fn an_agents_turns_share_its_warm_sandbox_until_it_is_suspended() {
    let test = "an_agents_turns_share_its_warm_sandbox_until_it_is_suspended";
    if !sandbox_works(test, "native") {
        return;
    }
    let team = Team::start_with_args("native", 2, repo().join("policies"), vec!["--warm"]);
    let plan = json!({"turns": [
        {"when": "second", "steps": [{"read": "/tmp/warm-marker"}, {"reply": "{last}"}]},
        {"steps": [{"write": "/tmp/warm-marker", "text": "kept"}, {"reply": "wrote"}]},
    ]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "w", "--workspace", &ws, &with_plan("first", &plan)]);
    wait_until("the first turn ends", 60, || {
        team.settled() && team.turns("w").len() == 1
    });
    assert_eq!(team.turns("w")[0].status, "done", "{:?}", team.turns("w"));
    assert_eq!(
        warm_launchers(&team),
        1,
        "the sandbox is kept after the turn"
    );
    team.agent(&["send", "w", "second"]);
    wait_until("the second turn ends", 60, || {
        team.settled() && team.turns("w").len() == 2
    });
    let second = &team.turns("w")[1];
    assert_eq!(second.status, "done", "{second:?}");
    // The first turn's /tmp, still there: the same sandbox.
    assert!(
        second.result.as_deref().unwrap_or("").contains("kept"),
        "{second:?}"
    );
    assert_eq!(warm_launchers(&team), 1, "one sandbox for both turns");
    team.agent(&["suspend", "w"]);
    wait_until("the sandbox is released", 10, || warm_launchers(&team) == 0);
}

/// The same under the bwrap backend: its helper serves the turns.
#[test]
fn an_agents_turns_share_its_warm_sandbox_under_bwrap_too() {
    let test = "an_agents_turns_share_its_warm_sandbox_under_bwrap_too";
    if !sandbox_works(test, "bwrap") {
        return;
    }
    let team = Team::start_with_args("bwrap", 2, repo().join("policies"), vec!["--warm"]);
    let plan = json!({"turns": [
        {"when": "second", "steps": [{"read": "/tmp/warm-marker"}, {"reply": "{last}"}]},
        {"steps": [{"write": "/tmp/warm-marker", "text": "kept"}, {"reply": "wrote"}]},
    ]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "w", "--workspace", &ws, &with_plan("first", &plan)]);
    wait_until("the first turn ends", 60, || {
        team.settled() && team.turns("w").len() == 1
    });
    team.agent(&["send", "w", "second"]);
    wait_until("the second turn ends", 60, || {
        team.settled() && team.turns("w").len() == 2
    });
    let second = &team.turns("w")[1];
    assert_eq!(second.status, "done", "{second:?}");
    assert!(
        second.result.as_deref().unwrap_or("").contains("kept"),
        "{second:?}"
    );
    assert_eq!(warm_launchers(&team), 1, "one sandbox for both turns");
}
