//! `update`, `pause`/`resume`, signals delivered into the container, and
//! what a runtime killed midway (SIGKILL during `create` or `start`)
//! leaves: each through the binary as an engine calls it, then through
//! podman.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::{
    Bundle, OCI, cgroups_of, pid_of, processes_with, runnable, text, wait_launcher, wait_until,
};

/// A bundle whose container has a group of its own below `parent`, as
/// engines give one (`linux.cgroupsPath`).
fn grouped(
    script: &str,
    parent: &str,
    id: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Bundle {
    let path = format!("/{parent}/{id}");
    Bundle::new(script, |c| {
        c["linux"]["cgroupsPath"] = json!(path);
        edit(c);
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn lines(bundle: &Bundle) -> usize {
    bundle.output().lines().count()
}

#[test]
fn update_applies_limits_within_the_policies_and_refuses_wider_ones() {
    if !runnable("update_applies_limits_within_the_policies_and_refuses_wider_ones") {
        return;
    }
    let ws = tempfile::tempdir().expect("workspace");
    let bundle = grouped("sleep 1000", "substrat-ocilife-upd", "upd", |c| {
        c["annotations"] = json!({"io.substrat.policy": "strict"});
        c["process"]["cwd"] = json!("/work");
        c["mounts"].as_array_mut().expect("mounts").push(json!({"destination": "/work", "type": "bind", "source": ws.path().display().to_string(), "options": ["rbind", "rw"]}));
    });
    assert!(
        bundle.create("upd", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("upd"));
    assert!(bundle.oci(&["start", "upd"]).status.success());
    // strict's limits made the sandbox's own groups: the update goes there.
    let group = |controller: &str| {
        PathBuf::from(format!(
            "/sys/fs/cgroup/{controller}/substrat-ocilife-upd/upd/substrat-upd-{pid}"
        ))
    };
    assert_eq!(read(&group("pids").join("pids.max")), "64");

    let out = bundle.oci(&["update", "--pids-limit", "100", "upd"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(read(&group("pids").join("pids.max")), "100");

    let mut stdin_update = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["update", "--resources", "-", "upd"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("update");
    {
        use std::io::Write;
        let mut stdin = stdin_update.stdin.take().expect("stdin");
        stdin
            .write_all(br#"{"memory":{"limit":67108864},"cpu":{"quota":50000,"period":100000}}"#)
            .expect("write");
    }
    let out = stdin_update.wait_with_output().expect("update");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        read(&group("memory").join("memory.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(read(&group("cpu").join("cpu.cfs_quota_us")), "50000");

    // Wider than strict (pids_max 128, memory_max 1 GiB, cpu_max 1.0):
    // refused by name, and nothing written.
    for (args, limit) in [
        (vec!["--pids-limit", "1000"], "pids_max"),
        (vec!["--pids-limit", "-1"], "pids_max"),
        (vec!["--memory", "2g"], "memory_max"),
        (vec!["--cpu-quota", "150000"], "cpu_max"),
        (vec!["--memory", "-1"], "memory_max"),
        // The period alone widens the current quota (50000/1000 = 50 CPUs).
        (vec!["--cpu-period", "1000"], "cpu_max"),
        (vec!["--cpu-period", "1000", "--cpu-quota", "500"], "least"),
        (vec!["--cpu-period", "2000000"], "1000..1000000"),
    ] {
        let mut all = vec!["update"];
        all.extend(&args);
        all.push("upd");
        let out = bundle.oci(&all);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} was applied");
        assert!(
            (err.contains("policy `strict`") || !limit.contains('_')) && err.contains(limit),
            "{args:?}: {err}"
        );
        assert_eq!(read(&group("cpu").join("cpu.cfs_period_us")), "100000");
    }
    // A period within the policy keeps the current quota (50000/200000 =
    // 0.25 CPUs); 0 leaves a limit as it is (runc).
    let out = bundle.oci(&[
        "update",
        "--cpu-period",
        "200000",
        "--pids-limit",
        "0",
        "upd",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(read(&group("cpu").join("cpu.cfs_period_us")), "200000");
    assert_eq!(read(&group("cpu").join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read(&group("pids").join("pids.max")), "100");
    assert_eq!(
        read(&group("memory").join("memory.limit_in_bytes")),
        "67108864"
    );
    let cpuset = bundle.oci(&["update", "--cpuset-cpus", "0", "upd"]);
    assert!(text(&cpuset.stderr).contains("--cpuset-cpus: not supported"));

    assert!(bundle.oci(&["kill", "upd", "KILL"]).status.success());
    assert_eq!(wait_launcher(pid), 137);
    assert!(bundle.oci(&["delete", "upd"]).status.success());
    assert!(cgroups_of("upd").is_empty());
    let stopped = bundle.oci(&["update", "--pids-limit", "10", "upd"]);
    assert!(!stopped.status.success());
}

#[test]
fn an_update_during_create_is_judged_against_the_policies() {
    if !runnable("an_update_during_create_is_judged_against_the_policies") {
        return;
    }
    let ws = tempfile::tempdir().expect("workspace");
    let bundle = grouped("sleep 1000", "substrat-ocilife-win", "win", |c| {
        c["annotations"] = json!({"io.substrat.policy": "strict"});
        c["process"]["cwd"] = json!("/work");
        c["mounts"].as_array_mut().expect("mounts").push(json!({"destination": "/work", "type": "bind", "source": ws.path().display().to_string(), "options": ["rbind", "rw"]}));
    });
    // `create` stops itself once the sandbox is built (a slow runtime): the
    // record has a live pid, the container says `created`.
    let mut create = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["create", "--bundle"])
        .arg(bundle.path())
        .arg("win")
        .env("SUBSTRAT_OCI_TEST_DIE_AT", "stop:create-ready")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("create");
    let stat = format!("/proc/{}/stat", create.id());
    wait_until("create stopped", || {
        std::fs::read_to_string(&stat)
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('T')))
    });
    assert_eq!(bundle.state("win")["status"], "created");
    let out = bundle.oci(&["update", "--pids-limit", "100000", "win"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "applied during create: {err}");
    assert!(
        err.contains("policy `strict`") && err.contains("pids_max"),
        "{err}"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(create.id() as i32),
        nix::sys::signal::Signal::SIGCONT,
    );
    assert!(create.wait().expect("create").success());
    let pid = pid_of(&bundle.state("win"));
    let pids_max =
        format!("/sys/fs/cgroup/pids/substrat-ocilife-win/win/substrat-win-{pid}/pids.max");
    assert_eq!(read(Path::new(&pids_max)), "64");
    assert!(bundle.oci(&["delete", "--force", "win"]).status.success());
    assert!(cgroups_of("win").is_empty());
}

#[test]
fn pause_freezes_every_process_and_a_paused_container_still_ends() {
    if !runnable("pause_freezes_every_process_and_a_paused_container_still_ends") {
        return;
    }
    let marker = "substrat-oci-pause-marker";
    let script = format!(
        "(while :; do sleep 0.02; done; : {marker}) & while :; do echo tick; sleep 0.02; done"
    );
    let ungrouped = Bundle::new(&script, |_| {});
    assert!(ungrouped.create("loose", &[]).status.success());
    let refused = ungrouped.oci(&["pause", "loose"]);
    assert!(
        text(&refused.stderr).contains("no cgroup of its own"),
        "{}",
        text(&refused.stderr)
    );
    assert!(
        ungrouped
            .oci(&["delete", "--force", "loose"])
            .status
            .success()
    );

    let bundle = grouped(&script, "substrat-ocilife-pause", "frozen", |_| {});
    assert!(
        bundle.create("frozen", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("frozen"));
    assert!(bundle.oci(&["start", "frozen"]).status.success());
    wait_until("the counter ticks", || lines(&bundle) > 3);
    let out = bundle.oci(&["pause", "frozen"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(bundle.state("frozen")["status"], "paused");
    assert_eq!(
        read(Path::new(
            "/sys/fs/cgroup/freezer/substrat-ocilife-pause/frozen/freezer.state"
        )),
        "FROZEN"
    );
    let before = lines(&bundle);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(lines(&bundle), before, "the counter advanced while paused");
    // Every process: the background loop is frozen too.
    for p in processes_with(marker) {
        let stat = read(&PathBuf::from(format!("/proc/{p}/stat")));
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().chars().next());
        assert_eq!(state, Some(Some('D')), "{p} is not frozen: {stat}");
    }
    assert!(text(&bundle.oci(&["pause", "frozen"]).stderr).contains("paused already"));

    assert!(bundle.oci(&["resume", "frozen"]).status.success());
    assert_eq!(bundle.state("frozen")["status"], "running");
    wait_until("the counter ticks again", || lines(&bundle) > before + 3);

    // Ended while paused: thawed first, nothing left.
    assert!(bundle.oci(&["pause", "frozen"]).status.success());
    assert!(bundle.oci(&["kill", "frozen", "TERM"]).status.success());
    assert_eq!(wait_launcher(pid), 143);
    assert!(processes_with(marker).is_empty(), "a process survived");
    assert!(bundle.oci(&["delete", "frozen"]).status.success());
    assert!(!Path::new("/sys/fs/cgroup/freezer/substrat-ocilife-pause/frozen").exists());
    assert!(cgroups_of("frozen").is_empty());
}

#[test]
fn signals_other_than_ending_ones_reach_the_containers_process() {
    if !runnable("signals_other_than_ending_ones_reach_the_containers_process") {
        return;
    }
    let script = "trap 'echo got-usr1' USR1; trap 'echo got-hup' HUP; while :; do sleep 0.02; done";
    let bundle = Bundle::new(script, |_| {});
    assert!(
        bundle.create("sig", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("sig"));
    let early = bundle.oci(&["kill", "sig", "USR1"]);
    assert!(
        text(&early.stderr).contains("not running yet"),
        "{}",
        text(&early.stderr)
    );
    assert!(bundle.oci(&["start", "sig"]).status.success());
    std::thread::sleep(Duration::from_millis(100));
    for (signal, said) in [
        ("SIGUSR1", "got-usr1"),
        ("HUP", "got-hup"),
        ("10", "got-usr1\ngot-hup\ngot-usr1"),
    ] {
        let out = bundle.oci(&["kill", "sig", signal]);
        assert!(out.status.success(), "{signal}: {}", text(&out.stderr));
        wait_until(said, || bundle.output().contains(said));
        assert_eq!(bundle.state("sig")["status"], "running");
    }
    let bad = bundle.oci(&["kill", "sig", "SIGNOPE"]);
    assert!(
        text(&bad.stderr).contains("not a signal"),
        "{}",
        text(&bad.stderr)
    );
    // Not trapped: USR2 ends the shell, and so the container, by itself.
    assert!(bundle.oci(&["kill", "sig", "USR2"]).status.success());
    assert_eq!(wait_launcher(pid), 128 + 12);
    assert!(bundle.oci(&["delete", "sig"]).status.success());
}

/// Waits for the runtime's record of `id` to say stopped.
fn wait_stopped(bundle: &Bundle, id: &str) {
    wait_until("the container is stopped", || {
        let out = bundle.oci(&["state", id]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|s| s["status"] == "stopped")
    });
}

#[test]
fn a_runtime_killed_during_create_or_start_leaves_nothing_delete_cannot_remove() {
    if !runnable("a_runtime_killed_during_create_or_start_leaves_nothing_delete_cannot_remove") {
        return;
    }
    let marker = "substrat-oci-halfmade-marker";
    // create-forked: the launcher runs, nothing of create's named it yet.
    for point in ["create-forked", "create-spawned", "create-ready"] {
        let id = format!("half-{point}");
        let bundle = grouped(
            &format!("echo should-not-run; : {marker}"),
            "substrat-ocilife-half",
            &id,
            |_| {},
        );
        let created = bundle.create(&id, &[("SUBSTRAT_OCI_TEST_DIE_AT", point)]);
        assert_eq!(
            created.status.code(),
            None,
            "{point}: create was not killed"
        );
        wait_stopped(&bundle, &id);
        let launched = bundle.path().display().to_string();
        wait_until("no launcher is left", || {
            processes_with(&launched).is_empty()
        });
        assert!(
            processes_with(marker).is_empty(),
            "{point}: a process was left"
        );
        // Neither a second create nor kill hangs or goes through.
        let again = bundle.create(&id, &[]);
        assert!(!again.status.success());
        assert!(text(&bundle.oci(&["kill", &id, "KILL"]).stderr).contains("container not running"));
        let deleted = bundle.oci(&["delete", &id]);
        assert!(
            deleted.status.success(),
            "{point}: {}",
            text(&deleted.stderr)
        );
        assert!(!bundle.runtime_root.path().join(&id).exists());
        assert!(cgroups_of(&id).is_empty(), "{point}: a cgroup was left");
        for h in ["pids", "freezer", "memory"] {
            let group = PathBuf::from(format!("/sys/fs/cgroup/{h}/substrat-ocilife-half/{id}"));
            assert!(!group.exists(), "{point}: {} was left", group.display());
        }
        assert!(
            !bundle.output().contains("should-not-run"),
            "{point}: it ran"
        );
        // The id is free again.
        assert!(
            bundle.create(&id, &[]).status.success(),
            "{}",
            bundle.output()
        );
        assert!(bundle.oci(&["delete", "--force", &id]).status.success());
    }

    let bundle = Bundle::new("echo should-not-run", |_| {});
    assert!(bundle.create("half-start", &[]).status.success());
    let pid = pid_of(&bundle.state("half-start"));
    let started = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["start", "half-start"])
        .env("SUBSTRAT_OCI_TEST_DIE_AT", "start")
        .output()
        .expect("start");
    assert_eq!(started.status.code(), None, "start was not killed");
    // Its end of the gate closed with nothing written: init gives up.
    assert_eq!(wait_launcher(pid), 126);
    assert_eq!(bundle.state("half-start")["status"], "stopped");
    assert!(!bundle.output().contains("should-not-run"));
    assert!(bundle.oci(&["delete", "half-start"]).status.success());
}

#[test]
fn a_create_killed_after_its_directory_never_holds_the_id() {
    if !runnable("a_create_killed_after_its_directory_never_holds_the_id") {
        return;
    }
    let bundle = Bundle::new("exit 0", |_| {});
    let root = bundle.runtime_root.path();
    // Killed once the id's directory is there: it has its record.
    let created = bundle.create("dir", &[("SUBSTRAT_OCI_TEST_DIE_AT", "create-dir")]);
    assert_eq!(created.status.code(), None, "create was not killed");
    assert!(root.join("dir/state.json").exists());
    assert_eq!(bundle.state("dir")["status"], "stopped");
    assert!(bundle.oci(&["delete", "dir"]).status.success());
    // What an older create left (a directory, no record), and one killed
    // before its rename (`.creating-PID`, its pid gone): neither holds
    // the id; delete --force removes the first, create the second.
    std::fs::create_dir(root.join("dir")).expect("mkdir");
    let abandoned = root.join(".creating-2147483646");
    std::fs::create_dir(&abandoned).expect("mkdir");
    assert!(bundle.oci(&["delete", "--force", "dir"]).status.success());
    assert!(!root.join("dir").exists(), "delete --force left it");
    let again = bundle.create("dir", &[]);
    assert!(again.status.success(), "{}", bundle.output());
    assert!(!abandoned.exists(), "create left {}", abandoned.display());
    assert!(bundle.oci(&["delete", "--force", "dir"]).status.success());
}

/// Whether process `pid` is stopped (state T).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('T')))
}

#[test]
fn a_launcher_ended_while_it_joins_the_engines_groups_leaves_none() {
    if !runnable("a_launcher_ended_while_it_joins_the_engines_groups_leaves_none") {
        return;
    }
    let bundle = grouped("sleep 1000", "substrat-ocilife-join", "join", |_| {});
    // The launcher stops once it made and joined the groups, before it
    // recorded them; SIGTERM (the watcher's, kill's) comes then.
    let mut create = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["create", "--bundle"])
        .arg(bundle.path())
        .arg("join")
        .env("SUBSTRAT_OCI_TEST_DIE_AT", "stop:launch-joined")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("create");
    let mut launcher = 0;
    wait_until("the launcher stopped", || {
        launcher = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", create.id()))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| stopped(*p))
            .unwrap_or(0);
        launcher > 0
    });
    let group = Path::new("/sys/fs/cgroup/pids/substrat-ocilife-join/join");
    assert!(group.is_dir(), "the launcher made no group");
    let signal = |pid: u32, s| {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
    };
    // `create` dies (its watcher sends SIGTERM), then the launcher runs on.
    let _ = create.kill();
    let _ = create.wait();
    signal(launcher, nix::sys::signal::Signal::SIGTERM);
    signal(launcher, nix::sys::signal::Signal::SIGCONT);
    wait_stopped(&bundle, "join");
    assert!(bundle.oci(&["delete", "--force", "join"]).status.success());
    for h in ["pids", "memory", "cpu", "freezer"] {
        let level = PathBuf::from(format!("/sys/fs/cgroup/{h}/substrat-ocilife-join/join"));
        assert!(!level.exists(), "{} was left", level.display());
    }
}

/// Field 22 of /proc/PID/stat.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(") ").expect("stat");
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .expect("start time")
}

/// Runs a create watcher for `id` and closes its pipe after `said`.
fn watcher(root: &Path, id: &str, said: &str) {
    use std::io::Write;
    let mut watch = Command::new(OCI)
        .arg("--root")
        .arg(root)
        .args(["create-watch", id])
        .stdin(Stdio::piped())
        .spawn()
        .expect("watcher");
    let mut pipe = watch.stdin.take().expect("stdin");
    pipe.write_all(said.as_bytes()).expect("write");
    drop(pipe);
    assert!(watch.wait().expect("watcher").success());
}

#[test]
fn a_create_watcher_ends_only_the_launcher_its_create_named() {
    if !runnable("a_create_watcher_ends_only_the_launcher_its_create_named") {
        return;
    }
    let root = tempfile::tempdir().expect("root");
    // The id's record now names another container's launcher (`create`
    // of the same id again, while this watcher was slow).
    let mut next = Command::new("sleep").arg("100").spawn().expect("sleep");
    std::fs::create_dir(root.path().join("same")).expect("mkdir");
    let record = json!({"id": "same", "bundle": "/b", "pid": next.id(),
        "pid_start": start_time(next.id()), "created": 0, "annotations": {},
        "notes": [], "policies": []});
    std::fs::write(root.path().join("same/state.json"), record.to_string()).expect("record");
    // Its create died before its launcher ran: nothing named, nothing ended.
    watcher(root.path(), "same", "");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        next.try_wait().expect("wait").is_none(),
        "the next container's launcher was ended"
    );
    // Its create named its launcher and died: that one is ended.
    let mut own = Command::new("sleep").arg("100").spawn().expect("sleep");
    let line = format!("launcher {} {}\n", own.id(), start_time(own.id()));
    watcher(root.path(), "same", &line);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(own.wait().expect("wait").signal(), Some(15));
    assert!(next.try_wait().expect("wait").is_none());
    // SAVED after it: nothing ended.
    let mut kept = Command::new("sleep").arg("100").spawn().expect("sleep");
    let line = format!("launcher {} {}\nsaved\n", kept.id(), start_time(kept.id()));
    watcher(root.path(), "same", &line);
    std::thread::sleep(Duration::from_millis(100));
    assert!(kept.try_wait().expect("wait").is_none());
    for mut child in [next, kept] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn an_exec_killed_midway_leaves_no_process_in_the_container() {
    if !runnable("an_exec_killed_midway_leaves_no_process_in_the_container") {
        return;
    }
    let marker = "substrat-oci-exec-killed";
    let bundle = Bundle::new("sleep 1000", |_| {});
    assert!(
        bundle.create("exk", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let pid = pid_of(&bundle.state("exk"));
    assert!(bundle.oci(&["start", "exk"]).status.success());
    let mut exec = Command::new(OCI)
        .arg("--root")
        .arg(bundle.runtime_root.path())
        .args(["exec", "exk", "/bin/sh", "-c"])
        .arg(format!("sleep 1000; : {marker}"))
        .spawn()
        .expect("exec");
    wait_until("the exec runs", || !processes_with(marker).is_empty());
    exec.kill().expect("SIGKILL");
    let _ = exec.wait();
    wait_until("the exec's process is gone", || {
        processes_with(marker).is_empty()
    });
    assert_eq!(bundle.state("exk")["status"], "running");
    let again = bundle.oci(&["exec", "exk", "/bin/true"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(bundle.oci(&["delete", "--force", "exk"]).status.success());
    assert_eq!(wait_launcher(pid), 143);
}

fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .arg("--runtime")
        .arg(OCI)
        .args(args)
        .output()
        .expect("podman")
}

/// The file `name` of the container's group `libpod-ID` in a hierarchy.
fn podman_group_file(hierarchy: &str, id: &str, name: &str) -> Option<PathBuf> {
    let mut dirs = vec![PathBuf::from("/sys/fs/cgroup").join(hierarchy)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name().to_string_lossy() == format!("libpod-{id}") {
                return Some(entry.path().join(name));
            }
            dirs.push(entry.path());
        }
    }
    None
}

#[test]
fn podman_pauses_updates_and_signals_a_container() {
    let Some(image) = super::podman::image("podman_pauses_updates_and_signals_a_container") else {
        return;
    };
    let marker = "substrat-oci-podman-life";
    let script =
        format!("trap 'echo got-usr1' USR1; while :; do echo tick; sleep 0.02; done; : {marker}");
    let out = podman(&[
        "run",
        "-d",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        image,
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    struct Removed(String);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = podman(&["rm", "-f", &self.0]);
        }
    }
    let _removed = Removed(id.clone());
    let ticks = || text(&podman(&["logs", &id]).stdout).matches("tick").count();
    wait_until("the container ticks", || ticks() > 3);

    let usr1 = podman(&["kill", "-s", "USR1", &id]);
    assert!(usr1.status.success(), "{}", text(&usr1.stderr));
    wait_until("USR1 is trapped", || {
        text(&podman(&["logs", &id]).stdout).contains("got-usr1")
    });

    assert!(podman(&["pause", &id]).status.success());
    let status = podman(&["inspect", "--format", "{{.State.Status}}", &id]);
    assert_eq!(text(&status.stdout).trim(), "paused");
    let before = ticks();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ticks(), before, "the counter advanced while paused");
    assert!(podman(&["unpause", &id]).status.success());
    wait_until("the counter ticks again", || ticks() > before + 3);

    let updated = podman(&["update", "--memory", "64m", "--cpu-quota", "50000", &id]);
    assert!(updated.status.success(), "{}", text(&updated.stderr));
    let file = |h: &str, name: &str| {
        podman_group_file(h, &id, name).unwrap_or_else(|| panic!("no {h} group of {id}"))
    };
    assert_eq!(read(&file("memory", "memory.limit_in_bytes")), "67108864");
    assert_eq!(read(&file("cpu", "cpu.cfs_quota_us")), "50000");

    // Removed while paused: nothing left.
    assert!(podman(&["pause", &id]).status.success());
    let removed = podman(&["rm", "-f", &id]);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(processes_with(marker).is_empty(), "a process survived");
    assert!(cgroups_of(&id).is_empty(), "a cgroup survived");
    assert!(podman_group_file("freezer", &id, "freezer.state").is_none());
}
