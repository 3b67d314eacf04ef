//! `daemon --engine podman`: an agent's turn as a podman container with
//! substrat-oci as its runtime and the role's policy on top, with the same
//! binds as under substrat-run (its workspace, chats, home, the relay and
//! the broker socket).

use super::*;

/// Root (substrat-oci runs containers as root's subordinate ids) and
/// podman; a test that cannot run says why.
fn podman_usable(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED {test}: containers through substrat-oci need root");
        return false;
    }
    if Command::new("podman").arg("--version").output().is_err() {
        println!("SKIPPED {test}: podman is not installed (scripts/setup installs it)");
        return false;
    }
    sandbox_works(test, "native")
}

#[test]
fn an_agents_turn_runs_as_a_container_inside_its_roles_policy() {
    let test = "an_agents_turn_runs_as_a_container_inside_its_roles_policy";
    if !podman_usable(test) {
        return;
    }
    let team = Team::start_with_args(
        "native",
        2,
        repo().join("policies"),
        vec!["--engine", "podman"],
    );
    // Each attack works in a container without the policy (a writable
    // root, a writable volume): see crates/oci/tests/oci/policy.rs. The
    // git files would run code when a person next uses git here.
    let plan = json!({"turns": [{"steps": [
        {"call": "check_inbox"},
        {"write": "from-container.txt", "text": "made in a container"},
        {"shell": "touch /etc/planted 2>&1; touch /planted-root 2>&1; echo x > .git/config; echo x > .git/commondir; mkdir -p .git/hooks && echo x > .git/hooks/pre-commit; echo shell-done"},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "c", "--workspace", &ws, &with_plan("go", &plan)]);
    wait_until("the turn ends", 120, || {
        team.settled() && team.turns("c").len() == 1
    });
    let turn = &team.turns("c")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    let result = turn.result.clone().unwrap_or_default();
    assert!(result.contains("shell-done"), "{result}");
    // The root is read-only, as substrat-run's (EROFS comes before
    // Landlock's EACCES, which a writable root got here), and nothing was
    // made in the agent's empty root.
    for planted in ["/etc/planted", "/planted-root"] {
        assert!(
            result.contains(&format!("{planted}': Read-only file system")),
            "{result}"
        );
    }

    assert_eq!(
        std::fs::read_to_string(team.ws().join("from-container.txt")).unwrap(),
        "made in a container"
    );
    // The workspace's `.git` was the agent's own (as under substrat-run):
    // nothing the turn wrote there is in the host's tree for git to run.
    for left in [".git/config", ".git/commondir", ".git/hooks/pre-commit"] {
        assert!(
            !team.ws().join(left).exists(),
            "{left} left in the workspace"
        );
    }
    // The broker's tool, through the relay and the socket bound in.
    let id = team.agent_id("c");
    let audit = std::fs::read_to_string(team.state().join("audit.log")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("check_inbox") && l.contains(&id)),
        "{audit}"
    );
    // Only the agent's own places are idmapped (container root acting as
    // host root there): not /usr, not /etc/ssl/certs (the attacker's
    // review of hostsock: every plan source was).
    let oci_toml = team
        .state()
        .join("agents")
        .join(&id)
        .join("container/oci.toml");
    let oci_toml: toml::Table =
        toml::from_str(&std::fs::read_to_string(&oci_toml).unwrap()).unwrap();
    let idmapped: Vec<&str> = oci_toml["idmap_host_paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    let ws_real = team.ws().canonicalize().unwrap();
    assert!(
        idmapped.contains(&ws_real.to_str().unwrap()),
        "{idmapped:?}"
    );
    assert!(
        idmapped
            .iter()
            .all(|p| !p.starts_with("/usr") && !p.starts_with("/etc")),
        "{idmapped:?}"
    );
    assert_eq!(idmapped.len(), 3, "{idmapped:?}");
    // substrat-oci ran it, the role's policy (worker, with the agent's
    // binds) on top: its run report.
    let reports = team
        .state()
        .join("agents")
        .join(&id)
        .join("container/reports");
    let found: Vec<PathBuf> = std::fs::read_dir(&reports)
        .unwrap_or_else(|e| panic!("{}: {e}", reports.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let report: Value = serde_json::from_slice(&std::fs::read(&found[0]).unwrap()).unwrap();
    assert_eq!(report["policies"], json!(["worker"]), "{report}");
    assert_eq!(report["policy"], "config.json+worker", "{report}");
    assert_eq!(report["exit_code"], 0, "{report}");
    assert_eq!(report["host_ids"]["from"], "subordinate", "{report}");
    let root = team.state().join("agents").join(&id).join("container/root");
    assert!(
        !root.join("planted-root").exists(),
        "the turn wrote in its root"
    );
}

/// A role written inline in the daemon's configuration runs as a
/// container too: substrat-oci loads it by name from the file the daemon
/// wrote for it (the role had no file of its own, and was refused).
#[test]
fn an_inline_roles_turn_runs_as_a_container() {
    let test = "an_inline_roles_turn_runs_as_a_container";
    if !podman_usable(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("substrat.toml");
    std::fs::write(
        &config,
        "[roles.boxed]\nsystem_prompt = \"You work in a box.\"\n",
    )
    .unwrap();
    let config: &'static str = Box::leak(config.display().to_string().into_boxed_str());
    // The daemon's state and the workspace below /var, as a system unit's
    // are (/var/lib/substrat): substrat-oci refuses writable binds below a
    // system directory unless the daemon's runtime configuration allows
    // exactly its plan's sources.
    let team = Team::start_in(
        tempfile::tempdir_in("/var/tmp").unwrap(),
        "native",
        2,
        repo().join("policies"),
        vec!["--engine", "podman", "--config", config],
    );
    let plan =
        json!({"turns": [{"steps": [{"shell": "echo boxed > boxed.txt; echo shell-done"}]}]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "b",
        "--role",
        "boxed",
        "--workspace",
        &ws,
        &with_plan("go", &plan),
    ]);
    wait_until("the turn ends", 120, || {
        team.settled() && team.turns("b").len() == 1
    });
    let turn = &team.turns("b")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    assert_eq!(
        std::fs::read_to_string(team.ws().join("boxed.txt")).unwrap(),
        "boxed\n"
    );
}

/// The daemon's `--cgroup-parent` reaches a container turn: its
/// processes are in groups below the parent (podman put them below its
/// own `libpod_parent`, containerd below `/NAMESPACE`).
#[test]
fn a_container_turn_is_below_the_daemons_cgroup_parent() {
    let test = "a_container_turn_is_below_the_daemons_cgroup_parent";
    if podman_usable(test) {
        turn_below_cgroup_parent(test, "container", vec!["--engine", "podman"]);
    }
}

#[test]
fn a_containerd_turn_is_below_the_daemons_cgroup_parent() {
    let test = "a_containerd_turn_is_below_the_daemons_cgroup_parent";
    if let Some(ctrd) = super::containerd::Containerd::start(test) {
        turn_below_cgroup_parent(test, "containerd", ctrd.daemon_args());
    }
}

/// `what` names the parent group (one per test in this process).
fn turn_below_cgroup_parent(test: &str, what: &str, mut args: Vec<&'static str>) {
    let parent = ParentGroups::make(what);
    let Some(pids) = parent
        .dirs
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/pids"))
        .cloned()
    else {
        println!("SKIPPED {test}: no cgroup v1 pids hierarchy here");
        return;
    };
    let name: &'static str = Box::leak(parent.name.clone().into_boxed_str());
    args.extend(["--cgroup-parent", name]);
    let team = Team::start_with_args("native", 2, repo().join("policies"), args);
    let plan = json!({"turns": [{"steps": [{"shell": "sleep 5; echo shell-done"}]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "g", "--workspace", &ws, &with_plan("go", &plan)]);
    // Looked for while the turn runs (its shell sleeps 5 s).
    let mut seen = false;
    wait_until("the turn ends", 60, || {
        seen = seen
            || pids_below(&pids).iter().any(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "sleep\n")
            });
        team.settled() && team.turns("g").len() == 1
    });
    assert!(
        seen,
        "the turn's processes were never below {}",
        pids.display()
    );
    assert_eq!(team.turns("g")[0].status, "done", "{:?}", team.turns("g"));
}

/// The processes of every group below `dir`.
fn pids_below(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let procs =
                std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
            found.extend(procs.split_whitespace().map(str::to_string));
            found.extend(pids_below(&entry.path()));
        }
    }
    found
}
