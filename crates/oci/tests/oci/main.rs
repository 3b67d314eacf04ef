//! `substrat-oci` driven as an engine drives it: the real binary in fresh
//! processes, a bundle on disk, `create`, `state`, `start`, `kill`,
//! `delete`. This test process makes itself a child subreaper (as conmon
//! and containerd's shim do), so the launcher `create` leaves behind is
//! reparented to it and its exit code can be read.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod containerd;
mod engine_battery;
mod escape;
mod host_ns;
mod host_paths;
mod kube_play;
mod kubelet_paths;
mod launcher_io;
mod leak;
mod lifecycle;
mod podman;
mod policy;
mod sockets;
mod terminal;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use serde_json::{Value, json};

const OCI: &str = env!("CARGO_BIN_EXE_substrat-oci");

/// Root builds containers of subordinate ids; the others are skipped.
fn runnable(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        println!(
            "SKIPPED {test}: substrat-oci's tests run as root (containers as subordinate ids)"
        );
        return false;
    }
    let _ = nix::sys::prctl::set_child_subreaper(true);
    true
}

/// A bundle: a root filesystem of the host's /usr (bound read-only) and the
/// merged-/usr links, and a configuration running `script` with sh.
struct Bundle {
    dir: tempfile::TempDir,
    runtime_root: tempfile::TempDir,
}

impl Bundle {
    fn new(script: &str, edit: impl FnOnce(&mut Value)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let rootfs = dir.path().join("rootfs");
        for sub in ["usr", "tmp", "etc"] {
            std::fs::create_dir_all(rootfs.join(sub)).expect("rootfs");
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            std::os::unix::fs::symlink(to, rootfs.join(link)).expect("link");
        }
        let mut config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "user": {"uid": 0, "gid": 0},
                "args": ["/bin/sh", "-c", script],
                "env": ["PATH=/usr/bin:/bin"],
                "cwd": "/"
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": "box",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
                {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["mode=1777"]}
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network"}],
                "resources": {"pids": {"limit": 64}}
            }
        });
        edit(&mut config);
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
        Bundle {
            dir,
            runtime_root: tempfile::tempdir().expect("root"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn rootfs(&self) -> PathBuf {
        self.path().join("rootfs")
    }

    fn out(&self) -> PathBuf {
        self.path().join("out")
    }

    fn oci(&self, args: &[&str]) -> Output {
        Command::new(OCI)
            .arg("--root")
            .arg(self.runtime_root.path())
            .args(args)
            .output()
            .expect("substrat-oci")
    }

    /// `create`, the container's stdout and stderr going to `out`.
    fn create(&self, id: &str, env: &[(&str, &str)]) -> Output {
        let out = std::fs::File::create(self.out()).expect("out");
        let err = out.try_clone().expect("out");
        Command::new(OCI)
            .arg("--root")
            .arg(self.runtime_root.path())
            .args(["--log-format", "json", "--log"])
            .arg(self.path().join("log.json"))
            .args(["create", "--bundle"])
            .arg(self.path())
            .arg("--pid-file")
            .arg(self.path().join("pid"))
            .arg(id)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .output()
            .expect("create")
    }

    fn state(&self, id: &str) -> Value {
        let out = self.oci(&["state", id]);
        assert!(out.status.success(), "state: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("state json")
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.out()).unwrap_or_default()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn pid_of(state: &Value) -> i32 {
    state["pid"].as_i64().expect("a pid") as i32
}

/// The launcher's exit code, as the engine's waitpid sees it.
fn wait_launcher(pid: i32) -> i32 {
    match waitpid(Pid::from_raw(pid), None) {
        Ok(WaitStatus::Exited(_, code)) => code,
        Ok(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i32,
        other => panic!("waitpid {pid}: {other:?}"),
    }
}

/// Processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

/// The container's cgroups (`substrat-ID-PID` in every hierarchy).
fn cgroups_of(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("substrat-{id}-"))
            {
                found.push(path.clone());
            }
            // Deep enough for an engine's groups (pids/libpod_parent/conmon/...).
            if path.components().count() < 9 {
                dirs.push(path);
            }
        }
    }
    found
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_container_is_created_then_started_then_stopped_then_deleted() {
    if !runnable("a_container_is_created_then_started_then_stopped_then_deleted") {
        return;
    }
    let bundle = Bundle::new("echo ran as $(id -u) on $(hostname); exit 7", |_| {});
    let created = bundle.create("life", &[]);
    assert!(created.status.success(), "create: {}", bundle.output());
    let state = bundle.state("life");
    assert_eq!(state["status"], "created");
    assert_eq!(state["id"], "life");
    assert_eq!(state["bundle"], bundle.path().to_string_lossy().as_ref());
    let pid = pid_of(&state);
    let pid_file = std::fs::read_to_string(bundle.path().join("pid")).expect("pid file");
    assert_eq!(pid_file, pid.to_string());
    assert_eq!(bundle.output(), "", "the command ran before start");

    let started = bundle.oci(&["start", "life"]);
    assert!(started.status.success(), "start: {}", text(&started.stderr));
    assert_eq!(
        wait_launcher(pid),
        7,
        "the launcher exits with the command's code"
    );
    assert_eq!(bundle.output(), "ran as 0 on box\n");
    let state = bundle.state("life");
    assert_eq!(state["status"], "stopped");
    assert!(state.get("pid").is_none());

    let again = bundle.oci(&["start", "life"]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("is stopped, not created"),
        "{}",
        text(&again.stderr)
    );
    assert!(bundle.oci(&["delete", "life"]).status.success());
    assert!(!bundle.runtime_root.path().join("life").exists());
    let gone = bundle.oci(&["state", "life"]);
    assert!(text(&gone.stderr).contains("container `life` does not exist"));
}

#[test]
fn kill_and_delete_leave_no_process_cgroup_or_mount() {
    if !runnable("kill_and_delete_leave_no_process_cgroup_or_mount") {
        return;
    }
    let marker = "substrat-oci-kill-marker";
    let bundle = Bundle::new(&format!("sleep 1000 & sleep 1000; : {marker}"), |_| {});
    assert!(
        bundle.create("killed", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("killed"));
    assert!(bundle.oci(&["start", "killed"]).status.success());
    wait_until("the container runs", || processes_with(marker).len() == 1);
    assert_eq!(bundle.state("killed")["status"], "running");
    // ps: the container's processes by host pid (sh, its two sleeps, and
    // init), the marked shell among them.
    let ps = bundle.oci(&["ps", "--format", "json", "killed"]);
    let pids: Vec<i32> = serde_json::from_slice(&ps.stdout).expect("ps json");
    assert!(pids.contains(&processes_with(marker)[0]), "{pids:?}");
    assert_eq!(pids.len(), 4, "{pids:?}");
    assert!(!pids.contains(&pid), "the launcher is not in the container");
    assert!(
        !cgroups_of("killed").is_empty(),
        "pids.limit made no cgroup"
    );

    let refused = bundle.oci(&["delete", "killed"]);
    assert!(text(&refused.stderr).contains("is running: kill it first"));
    let unknown = bundle.oci(&["kill", "killed", "SIGRTMIN"]);
    assert!(
        text(&unknown.stderr).contains("not a signal"),
        "{}",
        text(&unknown.stderr)
    );
    assert_eq!(bundle.state("killed")["status"], "running");

    assert!(bundle.oci(&["kill", "killed", "KILL"]).status.success());
    assert_eq!(
        wait_launcher(pid),
        128 + 9,
        "ended as by the signal asked for"
    );
    assert_eq!(
        processes_with(marker),
        Vec::<i32>::new(),
        "a process survived"
    );
    assert_eq!(
        cgroups_of("killed"),
        Vec::<PathBuf>::new(),
        "a cgroup survived"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mountinfo.contains(&bundle.rootfs().to_string_lossy().into_owned()));
    // What containerd's shim asks of a stopped container, and takes for
    // "already gone" only in runc's words (issue 44): `kill --all`
    // succeeds, a plain kill says "container not running".
    let all = bundle.oci(&["kill", "--all", "killed", "KILL"]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    let plain = bundle.oci(&["kill", "killed", "KILL"]);
    assert!(!plain.status.success());
    assert!(
        text(&plain.stderr).contains("container not running"),
        "{}",
        text(&plain.stderr)
    );
    assert!(bundle.oci(&["delete", "killed"]).status.success());
}

#[test]
fn a_created_container_deleted_with_force_never_runs() {
    if !runnable("a_created_container_deleted_with_force_never_runs") {
        return;
    }
    let bundle = Bundle::new("echo should-not-run", |_| {});
    assert!(
        bundle.create("never", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("never"));
    assert!(bundle.oci(&["delete", "--force", "never"]).status.success());
    assert_eq!(wait_launcher(pid), 128 + 15);
    assert_eq!(bundle.output(), "");
    assert!(cgroups_of("never").is_empty());
    assert!(!bundle.runtime_root.path().join("never").exists());
}

#[test]
fn an_unsupported_setting_is_refused_at_create_and_leaves_nothing() {
    if !runnable("an_unsupported_setting_is_refused_at_create_and_leaves_nothing") {
        return;
    }
    let bundle = Bundle::new("echo should-not-run", |config| {
        config["linux"]["sysctl"] = json!({"net.ipv4.ip_forward": "1"});
    });
    let created = bundle.create("refused", &[]);
    assert!(!created.status.success());
    assert!(
        bundle
            .output()
            .contains("linux.sysctl[net.ipv4.ip_forward]: setting sysctls is not supported"),
        "{}",
        bundle.output()
    );
    let log = std::fs::read_to_string(bundle.path().join("log.json")).expect("log");
    let line: Value = serde_json::from_str(log.lines().next().expect("a line")).expect("json");
    assert_eq!(line["level"], "error");
    assert!(
        line["msg"]
            .as_str()
            .is_some_and(|m| m.contains("linux.sysctl"))
    );
    assert!(line["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(!bundle.runtime_root.path().join("refused").exists());
    assert!(!bundle.output().contains("should-not-run"));
}

/// A root filesystem is the image's, or what an earlier run left in it:
/// its links must not lead a mount point out of it onto the host.
#[test]
fn links_in_the_root_filesystem_never_lead_mount_points_out_of_it() {
    if !runnable("links_in_the_root_filesystem_never_lead_mount_points_out_of_it") {
        return;
    }
    let host = tempfile::tempdir().expect("host dir");
    let absolute = host.path().join("escape-dev");
    let relative = host.path().join("escape-proc");
    // No tmpfs at /tmp: the links lead below /tmp, and it would cover them.
    let bundle = Bundle::new(
        "ls /dev/null && test -r /proc/self/status && echo contained",
        |config| {
            config["mounts"].as_array_mut().expect("mounts").pop();
        },
    );
    let rootfs = bundle.rootfs();
    std::os::unix::fs::symlink(&absolute, rootfs.join("dev")).expect("link");
    let climbing = format!("../../../../../../../..{}", relative.display());
    std::os::unix::fs::symlink(&climbing, rootfs.join("proc")).expect("link");
    assert!(
        bundle.create("links", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("links"));
    assert!(bundle.oci(&["start", "links"]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    assert!(
        bundle.output().ends_with("contained\n"),
        "{}",
        bundle.output()
    );
    // The links were followed, inside the root filesystem only.
    assert!(
        !absolute.exists() && !relative.exists(),
        "a mount point was made on the host"
    );
    let inside = |path: &Path| rootfs.join(path.strip_prefix("/").expect("absolute"));
    assert!(inside(&absolute).is_dir() && inside(&relative).is_dir());
    assert!(bundle.oci(&["delete", "links"]).status.success());
}

#[test]
fn the_engines_environment_ids_and_privileges_stay_outside() {
    if !runnable("the_engines_environment_ids_and_privileges_stay_outside") {
        return;
    }
    let secret = "substrat-oci-secret-4b1d";
    let script = "env; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
                  cat /proc/self/uid_map; sed 's/^/cgroup /' /proc/self/cgroup; echo oom $(cat /proc/self/oom_score_adj); grep -rl substrat-oci-secret /proc/1/environ /proc/self/environ 2>&1; true";
    let bundle = Bundle::new(script, |config| {
        config["process"]["oomScoreAdj"] = json!(300);
        config["process"]["capabilities"] = json!({"bounding": ["CAP_SYS_CHROOT"], "effective": ["CAP_SYS_CHROOT"], "permitted": ["CAP_SYS_CHROOT"]});
    });
    let created = bundle.create("env", &[("SUBSTRAT_TEST_SECRET", secret)]);
    assert!(created.status.success(), "{}", bundle.output());
    // What was made notes than asked is told to the operator's log.
    let log = std::fs::read_to_string(bundle.path().join("log.json")).expect("log");
    let told = log.lines().any(|line| {
        let line: Value = serde_json::from_str(line).expect("json");
        line["level"] == "info"
            && line["msg"] == "env: process.capabilities: the container gets none"
    });
    assert!(told, "{log}");
    let pid = pid_of(&bundle.state("env"));
    assert!(bundle.oci(&["start", "env"]).status.success());
    assert_eq!(wait_launcher(pid), 0);
    let out = bundle.output();
    assert!(out.contains("PATH=/usr/bin:/bin"), "{out}");
    assert!(
        !out.contains(secret),
        "the engine's environment reached the container:\n{out}"
    );
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    assert!(
        out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"),
        "{out}"
    );
    let map = out
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .expect("uid_map");
    let outside: u32 = map
        .split_whitespace()
        .nth(1)
        .expect("outside")
        .parse()
        .expect("id");
    assert_ne!(outside, 0, "container root is host root: {map}");
    assert!(out.contains("oom 300\n"), "{out}");
    // A cgroup namespace of its own: no host cgroup path is shown.
    let cgroups: Vec<&str> = out.lines().filter(|l| l.starts_with("cgroup ")).collect();
    assert!(
        !cgroups.is_empty() && cgroups.iter().all(|l| l.ends_with(":/")),
        "{out}"
    );
    assert!(bundle.oci(&["delete", "env"]).status.success());
}

fn ns_of(pid: &str, name: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{name}"))
        .expect("ns link")
        .to_string_lossy()
        .into_owned()
}

/// As containerd runs a pod: the pause container first, then each other
/// container joined to the network, ipc and uts namespaces of the pid the
/// runtime reported for it. That pid (the launcher's) must name the
/// container's namespaces, never the host's.
#[test]
fn a_pods_containers_share_the_first_ones_namespaces_never_the_hosts() {
    if !runnable("a_pods_containers_share_the_first_ones_namespaces_never_the_hosts") {
        return;
    }
    let pause = Bundle::new("sleep 1000", |config| config["hostname"] = json!("pod-a"));
    assert!(
        pause.create("pause", &[]).status.success(),
        "{}",
        pause.output()
    );
    let pause_pid = pid_of(&pause.state("pause"));
    assert!(pause.oci(&["start", "pause"]).status.success());
    // Everything an engine reaches through the reported pid is the
    // container's: its net, ipc, uts, mount and cgroup namespaces (those
    // of the container's own init), and its root (`podman cp`).
    let init = substrat_oci::state::first_child(pause_pid)
        .and_then(substrat_oci::state::first_child)
        .expect("the sandbox's init");
    for name in ["net", "ipc", "uts", "mnt", "cgroup"] {
        let reported = ns_of(&pause_pid.to_string(), name);
        assert_ne!(
            reported,
            ns_of("self", name),
            "the reported pid names the host's {name} namespace"
        );
        assert_eq!(reported, ns_of(&init.to_string(), name), "{name}");
    }
    std::fs::write(pause.rootfs().join("etc/only-in-the-container"), "").expect("marker");
    let root = PathBuf::from(format!("/proc/{pause_pid}/root"));
    assert!(
        root.join("etc/only-in-the-container").exists(),
        "/proc/PID/root is not the container's"
    );
    assert!(
        !root
            .join(pause.rootfs().strip_prefix("/").expect("absolute"))
            .exists()
    );
    let namespaces = json!([
        {"type": "pid"}, {"type": "mount"},
        {"type": "network", "path": format!("/proc/{pause_pid}/ns/net")},
        {"type": "ipc", "path": format!("/proc/{pause_pid}/ns/ipc")},
        {"type": "uts", "path": format!("/proc/{pause_pid}/ns/uts")}
    ]);
    let app = Bundle::new(
        "hostname; readlink /proc/self/ns/net /proc/self/ns/ipc; ls -A /sys | wc -l",
        |config| {
            config["linux"]["namespaces"] = namespaces;
            config["mounts"]
                .as_array_mut()
                .expect("mounts")
                .push(json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]}));
        },
    );
    assert!(app.create("app", &[]).status.success(), "{}", app.output());
    let app_pid = pid_of(&app.state("app"));
    assert!(app.oci(&["start", "app"]).status.success());
    assert_eq!(wait_launcher(app_pid), 0, "{}", app.output());
    let expected = format!(
        "pod-a\n{}\n{}\n0\n",
        ns_of(&pause_pid.to_string(), "net"),
        ns_of(&pause_pid.to_string(), "ipc")
    );
    // The engine's network namespace: no sysfs of its own, /sys empty.
    assert_eq!(app.output(), expected);
    assert!(pause.oci(&["kill", "pause"]).status.success());
    wait_launcher(pause_pid);
    assert!(pause.oci(&["delete", "pause"]).status.success());
    assert!(app.oci(&["delete", "app"]).status.success());
}

/// `exec`: another process in the running container, confined as its own
/// process (ids, capabilities, no_new_privs, seccomp, its cgroup and pid
/// namespaces), in the foreground and detached.
#[test]
fn exec_runs_a_process_confined_as_the_containers_own() {
    if !runnable("exec_runs_a_process_confined_as_the_containers_own") {
        return;
    }
    let marker = format!("substrat-oci-exec-marker-{}", std::process::id());
    let bundle = Bundle::new(&format!("sleep 1000; : {marker}"), |_| {});
    let _ended = Ended(bundle.runtime_root.path().to_path_buf(), "ex");
    let refused = bundle.oci(&["exec", "ex", "true"]);
    assert!(text(&refused.stderr).contains("container `ex` does not exist"));
    assert!(
        bundle.create("ex", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("ex"));
    let early = bundle.oci(&["exec", "ex", "true"]);
    assert!(
        text(&early.stderr).contains("is not running"),
        "{}",
        text(&early.stderr)
    );
    assert!(bundle.oci(&["start", "ex"]).status.success());
    wait_until("the container runs", || processes_with(&marker).len() == 1);

    let script = "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/self/uid_map; \
         sed 's/^/cgroup /' /proc/self/cgroup; echo \"sleeping $(cat /proc/[0-9]*/comm | grep -c '^sleep$')\"; \
         echo \"pid $$\"; touch /usr/x 2>&1; exit 5";
    let out = bundle.oci(&["exec", "ex", "/bin/sh", "-c", script]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("CapEff:\t0000000000000000")
            && stdout.contains("CapBnd:\t0000000000000000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NoNewPrivs:\t1") && stdout.contains("Seccomp:\t2"),
        "{stdout}"
    );
    let map = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .expect("uid_map");
    assert_ne!(
        map.split_whitespace().nth(1),
        Some("0"),
        "exec runs as host root: {map}"
    );
    let cgroups: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("cgroup "))
        .collect();
    assert!(
        !cgroups.is_empty() && cgroups.iter().all(|l| l.ends_with(":/")),
        "{stdout}"
    );
    // In the container's pid namespace: its sleep is the one in sight,
    // and the exec's own pid is one of the namespace's.
    assert!(stdout.contains("sleeping 1\n"), "{stdout}");
    let own: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.parse().ok())
        .expect("pid");
    assert!(
        own < 100,
        "the exec is not in the container's pid namespace: {own}"
    );
    assert!(stdout.contains("Read-only file system"), "{stdout}");

    // Another uid than the container's is refused: the sandbox maps one.
    let process = bundle.path().join("process.json");
    let spec = json!({"user": {"uid": 1000, "gid": 1000}, "args": ["/bin/true"], "cwd": "/"});
    std::fs::write(&process, spec.to_string()).expect("process.json");
    let other = bundle.oci(&["exec", "--process", process.to_str().expect("path"), "ex"]);
    assert!(
        text(&other.stderr).contains("process.user: uid 1000 gid 1000"),
        "{}",
        text(&other.stderr)
    );

    // Detached: the pid file names a process the engine can signal.
    let pid_file = bundle.path().join("exec.pid");
    // Its output to a file, as an engine gives it: the process keeps the
    // descriptors (pipes would stay open as long as it runs).
    let log = std::fs::File::create(bundle.path().join("exec.out")).expect("log");
    let detached = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["exec", "-d", "--pid-file"])
        .arg(&pid_file)
        .args(["ex", "sleep", "999"])
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .status()
        .expect("exec -d");
    assert!(
        detached.success(),
        "{}",
        std::fs::read_to_string(bundle.path().join("exec.out")).unwrap_or_default()
    );
    let exec_pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .parse()
        .expect("pid");
    let before: Vec<i32> =
        serde_json::from_slice(&bundle.oci(&["ps", "-f", "json", "ex"]).stdout).expect("ps");
    assert_eq!(
        before.len(),
        4,
        "init, sh, sleep and the exec's sleep: {before:?}"
    );
    nix::sys::signal::kill(Pid::from_raw(exec_pid), nix::sys::signal::Signal::SIGTERM)
        .expect("kill");
    assert_eq!(
        wait_launcher(exec_pid),
        128 + 15,
        "the exec ends by the signal passed on"
    );
    let after: Vec<i32> =
        serde_json::from_slice(&bundle.oci(&["ps", "-f", "json", "ex"]).stdout).expect("ps");
    assert_eq!(after.len(), 3, "{after:?}");

    assert!(bundle.oci(&["kill", "ex"]).status.success());
    wait_launcher(pid);
    assert!(bundle.oci(&["delete", "ex"]).status.success());
}

/// Ends a test's container however the test ends (a failed assertion
/// leaves none running).
struct Ended(PathBuf, &'static str);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = Command::new(OCI)
            .arg("--root")
            .arg(&self.0)
            .args(["delete", "--force", self.1])
            .output();
    }
}

/// Kubernetes binds the service account's token at /var/run/secrets/...,
/// and images have /var/run -> ../run: the bind follows the link inside
/// the root filesystem.
#[test]
fn a_bind_below_an_images_link_follows_it_inside() {
    if !runnable("a_bind_below_an_images_link_follows_it_inside") {
        return;
    }
    let secrets = tempfile::tempdir().expect("secrets");
    std::fs::write(secrets.path().join("token"), "t0ken\n").expect("token");
    let source = secrets.path().to_string_lossy().into_owned();
    let bundle = Bundle::new("cat /run/secrets/sa/token", |config| {
        config["mounts"].as_array_mut().expect("mounts").push(json!({
            "destination": "/var/run/secrets/sa", "type": "bind", "source": source, "options": ["rbind", "ro"]
        }));
    });
    std::fs::create_dir_all(bundle.rootfs().join("var")).expect("var");
    std::fs::create_dir_all(bundle.rootfs().join("run")).expect("run");
    std::os::unix::fs::symlink("../run", bundle.rootfs().join("var/run")).expect("link");
    assert!(
        bundle.create("sa", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("sa"));
    assert!(bundle.oci(&["start", "sa"]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    assert_eq!(bundle.output(), "t0ken\n");
    assert!(bundle.oci(&["delete", "sa"]).status.success());
}
