//! `daemon --warm`: an agent's turns in one sandbox kept between them (its
//! /tmp lasts), released on suspend; the confinement of such turns is
//! proven in the cli tests (check --prove --warm).

use super::*;

/// The daemon's children serving turns (launchers with `--serve-turns`;
/// their own children, forked, share the command line).
fn warm_launchers(team: &Team) -> usize {
    warm_launcher_pids(team).len()
}

fn warm_launcher_pids(team: &Team) -> Vec<String> {
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
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("--serve-turns"))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether each warm sandbox is frozen: its first process's freezer group
/// (v1 `freezer.state`, else v2 `cgroup.events`), read from /proc. The
/// launcher itself is never in it.
fn warm_sandboxes_frozen(team: &Team) -> Vec<bool> {
    warm_launcher_pids(team)
        .iter()
        .map(|launcher| {
            let first = child_pids(launcher)
                .into_iter()
                .next()
                .unwrap_or_else(|| "0".into());
            let groups =
                std::fs::read_to_string(format!("/proc/{first}/cgroup")).unwrap_or_default();
            let own =
                std::fs::read_to_string(format!("/proc/{launcher}/cgroup")).unwrap_or_default();
            let v1 = |text: &str| {
                text.lines()
                    .find_map(|l| l.split_once(":freezer:").map(|(_, p)| p.to_string()))
            };
            match v1(&groups) {
                Some(path) => {
                    assert_ne!(
                        v1(&own),
                        Some(path.clone()),
                        "the launcher is not in the freezer group"
                    );
                    std::fs::read_to_string(format!("/sys/fs/cgroup/freezer{path}/freezer.state"))
                        .is_ok_and(|s| s.trim() == "FROZEN")
                }
                None => {
                    let v2 = |text: &str| {
                        text.lines()
                            .find_map(|l| l.strip_prefix("0::"))
                            .unwrap_or("/")
                            .to_string()
                    };
                    let path = v2(&groups);
                    assert_ne!(v2(&own), path, "the launcher is not in the freezer group");
                    std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.events"))
                        .is_ok_and(|s| s.lines().any(|l| l == "frozen 1"))
                }
            }
        })
        .collect()
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
    // Frozen until its next turn: a freezer group is made by root (or in
    // a delegated group: not this test's).
    let root = nix::unistd::geteuid().is_root();
    if root {
        wait_until("the idle sandbox is frozen", 10, || {
            warm_sandboxes_frozen(&team) == [true]
        });
    } else {
        println!(
            "SKIPPED the freezer part of {test}: not root, and no delegated group to freeze in"
        );
    }
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
    if root {
        wait_until("frozen again", 10, || {
            warm_sandboxes_frozen(&team) == [true]
        });
    }
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

/// The `--agent-id` of a launcher's command line.
fn launcher_agent_id(pid: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args.iter().position(|a| a == "--agent-id")?;
    args.get(at + 1).cloned()
}

/// `--warm-pool worker=1`: the lead's turn has a worker's sandbox built
/// ahead for its workspace; the child it spawns takes that sandbox's
/// reserved id, and its first turn runs there (no new launcher), confined
/// as any turn (a write outside its binds refused). The pool is built
/// again for the next child.
#[test]
fn a_spawned_agents_first_turn_runs_in_a_sandbox_built_ahead() {
    first_turn_built_ahead(
        "a_spawned_agents_first_turn_runs_in_a_sandbox_built_ahead",
        "native",
    );
}

#[test]
fn a_spawned_agents_first_turn_runs_in_a_sandbox_built_ahead_under_bwrap_too() {
    first_turn_built_ahead(
        "a_spawned_agents_first_turn_runs_in_a_sandbox_built_ahead_under_bwrap_too",
        "bwrap",
    );
}

fn first_turn_built_ahead(test: &str, backend: &'static str) {
    if !sandbox_works(test, backend) {
        return;
    }
    let team = Team::start_with_args(
        backend,
        3,
        repo().join("policies"),
        // A turn that hangs fails (and is logged) well within the test's
        // wait, instead of running for the default half hour.
        vec!["--warm", "--warm-pool", "worker=1", "--turn-timeout", "40"],
    );
    let kid = json!({"turns": [{"steps": [
        {"write": "kid.txt", "text": "in the workspace"},
        {"write": "/usr/pool-escape", "text": "x"},
        {"call": "check_inbox"},
        {"reply": "kid: {results}"},
    ]}]});
    let lead = json!({"turns": [
        {"when": "spawn", "steps": [
            {"call": "spawn_agent", "args": {"name": "kid", "role": "worker",
                "instructions": with_plan("Kid.", &kid)}},
            {"reply": "spawned"},
        ]},
        {"steps": [{"reply": "ready"}]},
    ]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "lead",
        "--role",
        "worker",
        "--workspace",
        &ws,
        &with_plan("Lead.", &lead),
    ]);
    wait_until("the lead's first turn ends", 60, || {
        team.settled() && team.turns("lead").len() == 1
    });
    let lead_id = team.agent_id("lead");
    let (reserved, ahead_pid) = built_ahead(&team, &[&lead_id]);
    let marker = team.state().join("agents").join(&reserved).join("pooled");
    assert!(marker.exists(), "a reserved directory is marked");
    team.agent(&["send", "lead", "spawn"]);
    let start = std::time::Instant::now();
    while !(team.settled() && team.turns("kid").len() == 1) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting until the kid's first turn ends: lead {:?}, kid {:?}",
            team.turns("lead"),
            team.turns("kid")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        team.agent_id("kid"),
        reserved,
        "the kid took the reserved id"
    );
    assert!(!marker.exists(), "the directory is the kid's now");
    kid_turn_was_confined(&team);
    // Its turn ran in the sandbox built ahead: that launcher is still the
    // kid's, and no other launcher names the kid.
    let pids = warm_launcher_pids(&team);
    assert!(pids.contains(&ahead_pid), "{pids:?}");
    let kids: Vec<_> = pids
        .iter()
        .filter(|pid| launcher_agent_id(pid).as_deref() == Some(reserved.as_str()))
        .collect();
    assert_eq!(
        kids,
        [&ahead_pid],
        "one sandbox for the kid: the one built ahead"
    );
    // The kid's turn asked for the pool again.
    an_unused_reservation_ends_with_its_agent(&team, &[&lead_id, &reserved]);
}

/// The kid's first turn: its workspace written, a write outside its binds
/// refused, its broker socket (bound ahead, served once it exists)
/// answering.
fn kid_turn_was_confined(team: &Team) {
    let first = &team.turns("kid")[0];
    assert_eq!(first.status, "done", "{first:?}");
    let result = first.result.clone().unwrap_or_default();
    assert!(result.contains("write kid.txt: ok"), "{result}");
    assert!(result.contains("call check_inbox: ok"), "{result}");
    // The root is read-only in the sandbox (EROFS), whatever the turn.
    assert!(
        result.contains("write /usr/pool-escape: error: Read-only file system"),
        "{result}"
    );
    assert!(!std::path::Path::new("/usr/pool-escape").exists());
    assert_eq!(
        std::fs::read_to_string(team.ws().join("kid.txt")).unwrap(),
        "in the workspace"
    );
}

/// A new reservation (none of `agents`), which an agent made without a
/// turn takes; removed before any turn, its sandbox ends.
fn an_unused_reservation_ends_with_its_agent(team: &Team, agents: &[&str]) {
    let (again, again_pid) = built_ahead(team, agents);
    let ws = team.ws().display().to_string();
    team.agent(&["create", "idle", "--role", "worker", "--workspace", &ws]);
    assert_eq!(team.agent_id("idle"), again, "the new agent took it");
    team.agent(&["remove", "idle"]);
    wait_until("the unused sandbox ends", 30, || {
        !warm_launcher_pids(team).contains(&again_pid)
    });
}

/// A sandbox built ahead: its reserved id (none of `agents`) and its
/// launcher's pid, once the sandbox's first process has a child (init, or
/// bwrap's pid 1): the launcher has said hello to the daemon by then.
fn built_ahead(team: &Team, agents: &[&str]) -> (String, String) {
    let mut ahead = None;
    wait_until("a sandbox is built ahead", 60, || {
        ahead = warm_launcher_pids(team).into_iter().find_map(|pid| {
            let id = launcher_agent_id(&pid)?;
            (!agents.contains(&id.as_str()) && has_grandchild(&pid)).then_some((id, pid))
        });
        ahead.is_some()
    });
    ahead.unwrap()
}

fn has_grandchild(pid: &str) -> bool {
    child_pids(pid)
        .iter()
        .any(|child| !child_pids(child).is_empty())
}
