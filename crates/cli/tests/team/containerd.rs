//! `daemon --engine containerd`: an agent's turn as a container of a
//! private containerd (its root, state and socket in a temporary
//! directory, as tests/python/cri.py and crates/oci's tests start one),
//! `ctr run` with substrat-oci as the runc shim's binary and the role's
//! policy on top, with the same binds as under substrat-run.

use super::*;

/// The namespace the tests' daemons put their containers in.
pub(super) const NAMESPACE: &str = "substrat-test";

/// A containerd started for one test, stopped with everything of it
/// (containers, shims, files) when dropped.
pub(super) struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Containerd {
    /// containerd running here, or None (said why) when this host cannot.
    pub(super) fn start(test: &str) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED {test}: containerd and its shims need root; CI runs this as root");
            return None;
        }
        for tool in ["containerd", "ctr"] {
            if Command::new(tool).arg("--version").output().is_err() {
                println!(
                    "SKIPPED {test}: {tool} is not installed (scripts/setup installs containerd)"
                );
                return None;
            }
        }
        if !sandbox_works(test, "native") {
            return None;
        }
        // Short: containerd's sockets are below it.
        let dir = tempfile::Builder::new()
            .prefix("ctrd")
            .tempdir_in("/tmp")
            .unwrap();
        let p = dir.path();
        let config = format!(
            "version = 2\nroot = {:?}\nstate = {:?}\n[grpc]\n  address = {:?}\n\
             [ttrpc]\n  address = {:?}\n",
            p.join("root"),
            p.join("state"),
            p.join("c.sock"),
            p.join("c.ttrpc"),
        );
        std::fs::write(p.join("config.toml"), config).unwrap();
        // Never the host's /etc/substrat/oci.toml for what runs without
        // the daemon's configuration (the other daemon's container).
        std::fs::write(p.join("oci.toml"), "").unwrap();
        let log = std::fs::File::create(p.join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(p.join("config.toml"))
            .env("SUBSTRAT_OCI_CONFIG", p.join("oci.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let ctrd = Containerd { dir, daemon };
        wait_until("containerd answers", 30, || {
            ctrd.ctr(&["version"]).status.success()
        });
        Some(ctrd)
    }

    pub(super) fn socket(&self) -> PathBuf {
        self.dir.path().join("c.sock")
    }

    /// The daemon's arguments for this containerd.
    pub(super) fn daemon_args(&self) -> Vec<&'static str> {
        let socket: &'static str = Box::leak(self.socket().display().to_string().into_boxed_str());
        vec![
            "--engine",
            "containerd",
            "--containerd-address",
            socket,
            "--containerd-namespace",
            NAMESPACE,
        ]
    }

    pub(super) fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", NAMESPACE])
            .args(args)
            .output()
            .unwrap()
    }

    /// The names of the containers labelled `label=value`.
    pub(super) fn labelled(&self, label: &str, value: &str) -> Vec<String> {
        let filter = format!("labels.\"{label}\"=={value}");
        let out = self.ctr(&["containers", "list", "--quiet", &filter]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(str::to_string).collect()
    }

    /// `ctr tasks list` as printed.
    pub(super) fn tasks(&self) -> String {
        text(&self.ctr(&["tasks", "list"]).stdout)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let listed = self.ctr(&["containers", "list", "--quiet"]);
        for name in text(&listed.stdout).lines() {
            let _ = self.ctr(&["tasks", "delete", "--force", name]);
            let _ = self.ctr(&["containers", "delete", name]);
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        // The shims outlive containerd by design.
        let marker = self.dir.path().display().to_string();
        for pid in pids_with(&marker) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub(super) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Host pids whose command line contains `marker` (not this process).
pub(super) fn pids_with(marker: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()) && n != me)
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn an_agents_turn_runs_on_containerd_inside_its_roles_policy() {
    let test = "an_agents_turn_runs_on_containerd_inside_its_roles_policy";
    let Some(ctrd) = Containerd::start(test) else {
        return;
    };
    let team = Team::start_with_args("native", 2, repo().join("policies"), ctrd.daemon_args());
    // Each attack works in a container without the policy (a writable
    // root, a writable volume): see crates/oci/tests/oci/policy.rs.
    let plan = json!({"turns": [{"steps": [
        {"call": "check_inbox"},
        {"write": "from-containerd.txt", "text": "made in a containerd container"},
        {"shell": "touch /etc/planted 2>&1; touch /planted-root 2>&1; touch /usr/planted 2>&1; echo x > .git/config; echo shell-done"},
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
    // The role's walls: the root read-only as substrat-run's (ctr's
    // --read-only), the host's /usr bound read-only; nothing made in the
    // agent's empty root.
    for planted in ["/etc/planted", "/planted-root"] {
        assert!(
            result.contains(&format!("{planted}': Read-only file system")),
            "{result}"
        );
    }
    assert!(result.contains("cannot touch '/usr/planted'"), "{result}");
    let root = team
        .state()
        .join(format!("agents/{}/container/root", team.agent_id("c")));
    assert!(!root.join("planted-root").exists() && !root.join("etc/planted").exists());
    assert!(!Path::new("/usr/planted").exists());
    assert_eq!(
        std::fs::read_to_string(team.ws().join("from-containerd.txt")).unwrap(),
        "made in a containerd container"
    );
    assert!(!team.ws().join(".git/config").exists(), ".git/config left");
    // The broker's tool, through the relay and the socket bound in.
    let id = team.agent_id("c");
    let audit = std::fs::read_to_string(team.state().join("audit.log")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("check_inbox") && l.contains(&id)),
        "{audit}"
    );
    // substrat-oci ran it under containerd's shim, the role's policy on
    // top: its run report (the container named after the turn).
    let reports = team.state().join(format!("agents/{id}/container/reports"));
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
    let bundle = report["bundle"].as_str().unwrap_or_default();
    assert!(
        bundle.starts_with(&ctrd.dir.path().join("state").display().to_string()),
        "not containerd's bundle: {report}"
    );
    // `--rm`: nothing of the turn is left in containerd.
    assert_eq!(ctrd.ctr(&["containers", "list", "--quiet"]).stdout, b"");
}

/// Issue 44: a child's workspace replaced by a link between its turns
/// (what its parent can do from its own workspace) would have the link's
/// target bound, allowed and idmapped (host root there). The turn is
/// refused naming the link, and nothing is written at the target.
#[test]
fn a_workspace_replaced_by_a_link_between_turns_is_refused_on_containerd() {
    let test = "a_workspace_replaced_by_a_link_between_turns_is_refused_on_containerd";
    let Some(ctrd) = Containerd::start(test) else {
        return;
    };
    let team = Team::start_with_args("native", 2, repo().join("policies"), ctrd.daemon_args());
    let victim = tempfile::tempdir().unwrap();
    std::fs::write(victim.path().join("owned-by-root"), "original").unwrap();
    let sub = team.ws().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let plan = json!({"turns": [
        {"steps": [{"reply": "first"}]},
        {"steps": [{"shell": "echo pwned > owned-by-root; echo made > new-file; echo shell-done"}]},
    ]});
    let ws = sub.display().to_string();
    team.agent(&["spawn", "c", "--workspace", &ws, &with_plan("go", &plan)]);
    wait_until("the first turn ends", 120, || {
        team.settled() && team.turns("c").len() == 1
    });
    assert_eq!(team.turns("c")[0].status, "done", "{:?}", team.turns("c"));
    // The attack: the workspace swapped for a link to a host directory.
    std::fs::remove_dir_all(&sub).unwrap();
    std::os::unix::fs::symlink(victim.path(), &sub).unwrap();
    team.agent(&["send", "c", "again"]);
    wait_until("the second turn ends", 120, || {
        team.settled() && team.turns("c").len() == 2
    });
    let turn = &team.turns("c")[1];
    assert_eq!(turn.status, "failed", "{turn:?}");
    let result = format!("{:?} {:?}", turn.result, turn.error);
    assert!(
        result.contains(&format!("workspace {ws} now leads to")),
        "{result}"
    );
    assert_eq!(
        std::fs::read_to_string(victim.path().join("owned-by-root")).unwrap(),
        "original"
    );
    let left: Vec<_> = std::fs::read_dir(victim.path())
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(left.len(), 1, "written at the link's target: {left:?}");
    assert_eq!(ctrd.ctr(&["containers", "list", "--quiet"]).stdout, b"");
}
