//! Nothing left behind on either engine: a daemon SIGKILLed mid-turn
//! leaves its turn's container running (the engine keeps it); started
//! again, it removes it before the turn runs again, and a container of
//! another daemon (another label) is untouched. A daemon stopped
//! (SIGTERM) removes its turns' containers and queues the turns again.

use super::containerd::{Containerd, pids_with, text};
use super::*;

const DAEMON_LABEL: &str = "io.substrat.daemon";

/// The engine a test runs its team on.
enum Engine {
    Podman,
    Containerd(Containerd),
}

impl Engine {
    fn podman(test: &str) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED {test}: containers through substrat-oci need root");
            return None;
        }
        if Command::new("podman").arg("--version").output().is_err() {
            println!("SKIPPED {test}: podman is not installed (scripts/setup installs it)");
            return None;
        }
        sandbox_works(test, "native").then_some(Engine::Podman)
    }

    fn daemon_args(&self) -> Vec<&'static str> {
        match self {
            Engine::Podman => vec!["--engine", "podman"],
            Engine::Containerd(ctrd) => ctrd.daemon_args(),
        }
    }

    /// The names of the containers labelled with `daemon`.
    fn of_daemon(&self, daemon: &str) -> Vec<String> {
        match self {
            Engine::Podman => {
                let filter = format!("label={DAEMON_LABEL}={daemon}");
                let out = Command::new("podman")
                    .args(["ps", "--all", "--filter", &filter, "--format", "{{.Names}}"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}", text(&out.stderr));
                text(&out.stdout).lines().map(str::to_string).collect()
            }
            Engine::Containerd(ctrd) => ctrd.labelled(DAEMON_LABEL, daemon),
        }
    }

    /// Whether the container `name` runs.
    fn runs(&self, name: &str) -> bool {
        match self {
            Engine::Podman => {
                let out = Command::new("podman")
                    .args(["inspect", "--format", "{{.State.Running}}", name])
                    .output()
                    .unwrap();
                text(&out.stdout).trim() == "true"
            }
            Engine::Containerd(ctrd) => ctrd
                .tasks()
                .lines()
                .any(|l| l.starts_with(&format!("{name} ")) && l.contains("RUNNING")),
        }
    }

    /// Starts `name`, a container of another daemon (labelled so, under
    /// the engine's own runtime), sleeping in a busybox root.
    fn run_other(&self, name: &str, daemon: &str, root: &Path) {
        let label = format!("{DAEMON_LABEL}={daemon}");
        let root_text = root.display().to_string();
        let out = match self {
            Engine::Podman => Command::new("podman")
                .args(["--runtime", "runc", "run", "-d", "--name", name])
                .args(["--label", &label, "--network", "none", "--no-hosts"])
                .args([
                    "--ulimit",
                    "nofile=1024:1024",
                    "--ulimit",
                    "nproc=1024:1024",
                ])
                .args(["--rootfs", &root_text, "/bin/busybox", "sleep", "600"])
                .output()
                .unwrap(),
            Engine::Containerd(ctrd) => ctrd.ctr(&[
                "run",
                "-d",
                "--rootfs",
                "--label",
                &label,
                &root_text,
                name,
                "/bin/busybox",
                "sleep",
                "600",
            ]),
        };
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    fn remove(&self, name: &str) {
        match self {
            Engine::Podman => {
                let _ = Command::new("podman")
                    .args(["rm", "--force", "--time", "0", name])
                    .output();
            }
            Engine::Containerd(ctrd) => {
                let _ = ctrd.ctr(&["tasks", "delete", "--force", name]);
                let _ = ctrd.ctr(&["containers", "delete", name]);
            }
        }
    }
}

/// A root of the static busybox alone (the other daemon's container).
fn busybox_root(test: &str) -> Option<tempfile::TempDir> {
    if !Path::new("/bin/busybox").is_file() {
        println!("SKIPPED {test}: busybox-static is not installed (scripts/setup installs it)");
        return None;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.path().join("bin/busybox")).unwrap();
    Some(root)
}

#[test]
fn podman_containers_of_a_killed_daemon_are_swept_and_no_others() {
    let test = "podman_containers_of_a_killed_daemon_are_swept_and_no_others";
    if let Some(engine) = Engine::podman(test) {
        nothing_left_behind(test, &engine);
    }
}

#[test]
fn containerd_containers_of_a_killed_daemon_are_swept_and_no_others() {
    let test = "containerd_containers_of_a_killed_daemon_are_swept_and_no_others";
    if let Some(ctrd) = Containerd::start(test) {
        nothing_left_behind(test, &Engine::Containerd(ctrd));
    }
}

#[test]
fn a_timed_out_turns_container_is_removed_on_both_engines() {
    let test = "a_timed_out_turns_container_is_removed_on_both_engines";
    if let Some(engine) = Engine::podman(test) {
        timed_out_turn_leaves_nothing(&engine);
    }
    if let Some(ctrd) = Containerd::start(test) {
        timed_out_turn_leaves_nothing(&Engine::Containerd(ctrd));
    }
}

/// A turn past the daemon's `--turn-timeout` fails, and nothing of its
/// container is left (stopped through the engine, then removed by name).
fn timed_out_turn_leaves_nothing(engine: &Engine) {
    let mut args = engine.daemon_args();
    args.extend(["--turn-timeout", "3"]);
    let team = Team::start_with_args("native", 2, repo().join("policies"), args);
    let daemon = std::fs::read_to_string(team.state().join("daemon.id")).unwrap();
    let marker = format!(
        "timeout-{}",
        uuid_like("timeout").split('-').next().unwrap()
    );
    let plan = json!({"turns": [{"steps": [{"shell": format!("sleep 600; : {marker}")}]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "z", "--workspace", &ws, &with_plan("go", &plan)]);
    wait_until("the turn's container runs", 60, || {
        engine.of_daemon(daemon.trim()).len() == 1
    });
    wait_until("the turn times out", 60, || {
        team.settled() && team.turns("z").len() == 1
    });
    let turn = &team.turns("z")[0];
    assert_eq!(turn.status, "failed", "{turn:?}");
    assert!(
        turn.error
            .as_deref()
            .unwrap_or_default()
            .contains("timed out"),
        "{turn:?}"
    );
    assert_eq!(engine.of_daemon(daemon.trim()), Vec::<String>::new());
    assert_eq!(pids_with(&marker), Vec::<i32>::new(), "a process survived");
}

fn nothing_left_behind(test: &str, engine: &Engine) {
    let Some(root) = busybox_root(test) else {
        return;
    };
    let other_daemon = uuid_like(test);
    let other = format!("other-{}", &other_daemon[..8]);
    engine.run_other(&other, &other_daemon, root.path());
    let mut team =
        Team::start_with_args("native", 2, repo().join("policies"), engine.daemon_args());
    let daemon = std::fs::read_to_string(team.state().join("daemon.id"))
        .unwrap()
        .trim()
        .to_string();
    // A turn that sleeps for ten minutes the first time it runs (not
    // again), marked so that its processes can be found: only a sweep
    // ends its container in time.
    let marker = format!("swept-{}", &other_daemon[..8]);
    let plan = json!({"turns": [{"steps": [
        {"shell": format!("[ -e ran ] || {{ touch ran; sleep 600; }}; : {marker}; echo slept")},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "s", "--workspace", &ws, &with_plan("go", &plan)]);
    let mut first = Vec::new();
    wait_until("the turn's container runs", 60, || {
        first = engine.of_daemon(&daemon);
        first.len() == 1 && engine.runs(&first[0]) && !pids_with(&marker).is_empty()
    });

    // SIGKILL: the daemon cannot remove anything; the engine keeps the
    // container running.
    team.child.kill().unwrap();
    team.child.wait().unwrap();
    assert!(
        engine.runs(&first[0]),
        "the container ended with the daemon"
    );
    let _ = std::fs::remove_file(team.state().join("control.sock"));
    team.child = Team::daemon(team.root.path(), "native", 2, &team.policies, &team.extra);
    // Swept before the turn runs again (in a container of its own).
    wait_until("the killed daemon's container is gone", 30, || {
        !engine.of_daemon(&daemon).contains(&first[0])
    });
    wait_until("the turn runs again and ends", 90, || {
        team.settled() && team.turns("s").len() == 1
    });
    let turn = &team.turns("s")[0];
    assert_eq!(
        (turn.status.as_str(), turn.attempts),
        ("done", 2),
        "{turn:?}"
    );
    assert!(
        turn.result.as_deref().unwrap_or_default().contains("slept"),
        "{turn:?}"
    );
    assert_eq!(engine.of_daemon(&daemon), Vec::<String>::new());
    assert_eq!(pids_with(&marker), Vec::<i32>::new(), "a process survived");

    a_stopped_daemon_leaves_nothing(engine, &mut team, &daemon, &marker);

    // The other daemon's container: still there, still running.
    assert_eq!(engine.of_daemon(&other_daemon), vec![other.clone()]);
    assert!(
        engine.runs(&other),
        "the other daemon's container was ended"
    );
    engine.remove(&other);
}

/// SIGTERM mid-turn: the daemon removes its turn's container and the
/// turn is queued again.
fn a_stopped_daemon_leaves_nothing(engine: &Engine, team: &mut Team, daemon: &str, marker: &str) {
    let plan = json!({"turns": [{"steps": [{"shell": format!("sleep 600; : {marker}")}]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "t", "--workspace", &ws, &with_plan("go", &plan)]);
    wait_until("the second turn's container runs", 60, || {
        engine.of_daemon(daemon).len() == 1 && !pids_with(marker).is_empty()
    });
    let pid = nix::unistd::Pid::from_raw(team.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = team.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(engine.of_daemon(daemon), Vec::<String>::new());
    assert_eq!(pids_with(marker), Vec::<i32>::new(), "a process survived");
    assert_eq!(team.turns("t")[0].status, "queued", "{:?}", team.turns("t"));
}

/// A daemon id for the other daemon's container, unique to this run.
fn uuid_like(test: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (test, std::process::id(), now).hash(&mut hasher);
    format!("{:016x}-other", hasher.finish())
}

/// A daemon SIGKILLed mid-turn and started again without `--engine`:
/// the engine its turns ran on is recorded in its state directory, and
/// its container (the workspace bound) is removed all the same.
#[test]
fn a_killed_daemons_container_is_swept_when_it_restarts_without_engine() {
    let test = "a_killed_daemons_container_is_swept_when_it_restarts_without_engine";
    let Some(engine) = Engine::podman(test) else {
        return;
    };
    let mut team =
        Team::start_with_args("native", 2, repo().join("policies"), engine.daemon_args());
    let daemon = std::fs::read_to_string(team.state().join("daemon.id"))
        .unwrap()
        .trim()
        .to_string();
    let plan = json!({"turns": [{"steps": [
        {"shell": "[ -e ran ] || { touch ran; sleep 600; }; : swept-noengine-marker; echo slept"},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "s", "--workspace", &ws, &with_plan("go", &plan)]);
    let mut first = Vec::new();
    wait_until("the turn's container runs", 60, || {
        first = engine.of_daemon(&daemon);
        first.len() == 1 && engine.runs(&first[0]) && !pids_with("swept-noengine-marker").is_empty()
    });
    team.child.kill().unwrap();
    team.child.wait().unwrap();
    assert!(
        engine.runs(&first[0]),
        "the container ended with the daemon"
    );
    let _ = std::fs::remove_file(team.state().join("control.sock"));
    team.child = Team::daemon(team.root.path(), "native", 2, &team.policies, &[]);
    wait_until("the killed daemon's container is gone", 30, || {
        engine.of_daemon(&daemon).is_empty()
    });
    assert!(!team.state().join("engine.json").exists());
}
