//! Attacks on the host through what the command leaves behind and through
//! the sandbox's own helper processes (issue 17): set-id files, helpers'
//! memory and command lines, mounts below binds, line disciplines.

use super::*;
use crate::network::proxy_policy;

/// The probe run directly on the host, in `dir`, as the test's user.
fn unsandboxed_probe(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(dir.join("substrat-probe"));
    cmd.args(args).current_dir(dir).stdin(Stdio::null());
    outcome_of_fresh_copy(&mut cmd)
}

/// `outcome_of` for a probe copied a moment ago: its start can fail with
/// ETXTBSY while another test thread's fork still holds the copy's write
/// descriptor (until that child execs), so it is retried.
fn outcome_of_fresh_copy(cmd: &mut Command) -> String {
    let mut tries = 0;
    let out = loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix("OUTCOME ")) {
        Some(outcome) => outcome.to_string(),
        None => panic!("the probe reported nothing: {out:?}"),
    }
}

attack!(helper_processes_show_and_yield_nothing, |case| {
    // A host secret the policy filters out, and words only the launcher's
    // command line, bwrap's options or the helper's configuration hold.
    let secret = unique("substrat-helper-secret");
    let needles = [secret.as_str(), "--workspace", "--setenv", "landlock"].map(reversed);
    let peers = |policy: &str, script: Option<&str>| {
        let mut argv: Vec<&str> = match script {
            Some(script) => vec!["/bin/sh", "-c", script, "sh"],
            None => vec![],
        };
        argv.push("./substrat-probe");
        argv.push("peers");
        argv.extend(needles.iter().map(String::as_str));
        let mut cmd = case.command(policy, &argv);
        outcome_of(cmd.env("SUBSTRAT_TEST_API_TOKEN", &secret))
    };
    // The only other process is the sandbox's pid 1 (our init, or bwrap's):
    // its command line shows none of it, its environment and memory are
    // out of reach.
    let hidden = "cmdline=clean environ=EACCES mem=EACCES";
    assert_eq!(peers("worker", None), format!("value:1:{hidden}"));
    // The probe does see what an ordinary process of the command's shows:
    // a shell of its own that holds the secret in its environment.
    // (From a file: a secret in the script would show in bwrap's pid 1.)
    std::fs::write(case.path().join("secret.txt"), &secret).unwrap();
    // The probe's parent, a shell started with the secret, waits for it.
    let leaky = "SECRET=$(cat secret.txt) exec sh -c '\"$@\"; :' sh \"$@\"";
    assert_eq!(
        peers("worker", Some(leaky)),
        format!("value:2:{hidden}|cmdline=clean environ=leaks mem=writable")
    );
    // With the proxy bridge, a second helper inside the sandbox.
    let proxy = proxy_policy(&case, "bridge", "allow = [\"x.test\"]");
    assert_eq!(peers(&proxy, None), format!("value:2:{hidden}"));
});

attack!(set_id_bits_never_reach_the_host, |case| {
    // Outside a sandbox the probe's calls do set the bits (as any user, on
    // a file of its own): the attack is real.
    let outside = tempfile::tempdir().unwrap();
    std::fs::copy(probe_bin(), outside.path().join("substrat-probe")).unwrap();
    let every_call = "chmod=ok,fchmod=ok,fchmodat=ok,fchmodat2=ok,open=ok,openat=ok,creat=ok,\
                      mknod=ok,mknodat=ok,openat2=ok";
    assert_eq!(
        unsandboxed_probe(outside.path(), &["set-id-modes"]),
        format!("value:{every_call}")
    );
    let found = unsandboxed_probe(outside.path(), &["set-id-files", "."]);
    assert!(found.contains("./setid-chmod:104755"), "{found}");
    // Inside, every one is refused, for set-user-id and set-group-id alike.
    let refused = "value:chmod=EPERM,fchmod=EPERM,fchmodat=EPERM,fchmodat2=EPERM,open=EPERM,\
                   openat=EPERM,creat=EPERM,mknod=EPERM,mknodat=EPERM,openat2=ENOSYS";
    assert_eq!(case.probe(&["set-id-modes"]), refused);
    assert_eq!(case.probe(&["set-id-modes", "gid"]), refused);
    // The same calls without the bits work: the filter looks at the bits.
    let allowed = "value:chmod=ok,fchmod=ok,fchmodat=ok,fchmodat2=ok,open=ok,openat=ok,creat=ok,\
                   mknod=ok,mknodat=ok,openat2=ENOSYS";
    assert_eq!(case.probe(&["set-id-modes", "none"]), allowed);
    // Under a profile that allows by default too, io_uring included (its
    // open requests carry a mode seccomp cannot see).
    assert_eq!(case.probe_with("default-allow", &["set-id-modes"]), refused);
    assert_eq!(
        case.probe_with("default-allow", &["io-uring-setup"]),
        "errno:ENOSYS"
    );
    // The files the chmod-like calls worked on were there, without the bits.
    use std::os::unix::fs::MetadataExt;
    let chmodded = std::fs::metadata(case.path().join("setid-chmod")).unwrap();
    assert_eq!(chmodded.mode() & 0o7777, 0o755);
    // A tool copying a set-id program keeps working, without the bit.
    let setuid_program = ["/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount"]
        .into_iter()
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.mode() & 0o4000 != 0))
        .expect("no set-user-id program in /usr/bin to copy");
    // (As root cp's chmod is refused; as nobody its chown to root fails
    // first, and cp then leaves the bits off itself.)
    case.run("worker", &["cp", "-a", setuid_program, "copied"]);
    let copied = std::fs::metadata(case.path().join("copied")).unwrap();
    assert_eq!(copied.mode() & 0o6000, 0, "{:o}", copied.mode());
    // Nothing in the workspace carries either bit, seen from the host.
    assert_eq!(
        unsandboxed_probe(case.path(), &["set-id-files", "."]),
        "value:none"
    );
    // And inside, the workspace is mounted nosuid and nodev.
    assert_eq!(case.probe(&["mount-flags", "."]), "value:rw,nosuid,nodev");
});

attack!(line_discipline_change_denied, |case| {
    let pty = nix::pty::openpty(None, None).unwrap();
    let on_pty = |cmd: &mut Command| {
        let tty = std::fs::File::from(pty.slave.try_clone().unwrap());
        outcome_of_fresh_copy(cmd.stdin(Stdio::from(tty)))
    };
    // The call works on the host's terminal (N_TTY, always loaded)...
    let mut direct = Command::new(case.path().join("substrat-probe"));
    assert_eq!(on_pty(direct.arg("tiocsetd")), "ok");
    // ...and is refused inside.
    let mut inside = case.command("worker", &["./substrat-probe", "tiocsetd"]);
    assert_eq!(on_pty(&mut inside), "errno:EPERM");
});

/// A tmpfs mounted by the test on the host; unmounted when dropped.
struct HostMount(PathBuf);

impl HostMount {
    fn tmpfs(at: &Path) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=1777,size=1m", "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs at {}", at.display());
        HostMount(at.to_path_buf())
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

attack!(mounts_below_binds_are_read_only_nosuid_nodev, |case| {
    if !is_root() {
        println!(
            "SKIPPED mounts_below_binds_are_read_only_nosuid_nodev: mounting the test's host tmpfs needs root"
        );
        return;
    }
    // A read-only bind whose source has a writable filesystem below it,
    // and a workspace holding one.
    let source = tempfile::Builder::new()
        .prefix("substrat-ro-source-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _below_source = HostMount::tmpfs(&source.path().join("sub"));
    let _below_workspace = HostMount::tmpfs(&case.path().join("mnt"));
    let policy = case.path().join("ro-source.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\nextends = \"worker\"\n[filesystem]\nbinds = [\n  \
             {{ source = \"/usr\", mode = \"ro\" }},\n  \
             {{ source = \"/lib64\", mode = \"ro\", optional = true }},\n  \
             {{ source = \"/bin\", mode = \"ro\", optional = true }},\n  \
             {{ source = \"/lib\", mode = \"ro\", optional = true }},\n  \
             {{ source = \"{}\", mode = \"ro\" }},\n  \
             {{ source = \"${{WORKSPACE}}\", mode = \"rw\" }},\n]\n",
            source.path().display()
        ),
    )
    .unwrap();
    let policy = policy.display().to_string();
    let sub = source.path().join("sub");
    let sub = sub.to_str().unwrap();
    // The attack is real: the host's filesystem below the source is writable.
    std::fs::write(source.path().join("sub/host-wrote"), "x").unwrap();
    assert_eq!(
        case.probe_with(&policy, &["write", &format!("{sub}/pwned")]),
        "errno:EROFS"
    );
    assert!(!source.path().join("sub/pwned").exists());
    assert_eq!(
        case.probe_with(&policy, &["mount-flags", sub]),
        "value:ro,nosuid,nodev"
    );
    // Below the workspace: writable, but nosuid and nodev like the rest.
    assert_eq!(case.probe_with(&policy, &["write", "mnt/file"]), "ok");
    assert_eq!(
        case.probe_with(&policy, &["mount-flags", "mnt"]),
        "value:rw,nosuid,nodev"
    );
});

attack!(unenforceable_limits_stop_or_stand_in, |case| {
    // A parent group that does not exist: no limit can be applied, whoever
    // launches (as nobody without a delegation it is the same).
    let nowhere = [
        "--cgroup-parent".as_ref(),
        "substrat-no-such-group".as_ref(),
    ];
    // Required (the shipped worker): nothing runs, exit 2, with the fix.
    let out = case
        .command_with("worker", &nowhere, &["/bin/sh", "-c", "echo ran > ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "the policy requires its cgroup limits",
        "pids_max (",
        "memory_max (",
        "cpu_max (",
        "--cgroup-parent GROUP",
        "enforcement = \"best-effort\"",
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
    assert!(!case.path().join("ran").exists(), "the command ran");
    // The same launch works where the group exists: the refusal was the
    // limits', not the command's.
    let out = case
        .command("worker", &["/bin/sh", "-c", "echo ran > ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Best effort: the launch goes on with a warning, and RLIMIT_DATA
    // stands in for memory_max (the hog's allocation fails: abort).
    let policy = case.path().join("best-effort.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\n[cgroup]\npids_max = 64\nmemory_max = \"128MiB\"\n\
         enforcement = \"best-effort\"\n",
    )
    .unwrap();
    let report = case.path().join("report.json");
    let mut args = nowhere.to_vec();
    args.extend(["--report".as_ref(), report.as_os_str()]);
    let out = case
        .command_with(
            policy.to_str().unwrap(),
            &args,
            &["./substrat-probe", "memory-hog", "1024"],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 6), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("allocated"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: cgroup.memory_max not applied"),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["cgroup"]["memory_max"]["status"], "not-applied");
    let data = report["rlimits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "data")
        .unwrap_or_else(|| panic!("no RLIMIT_DATA stand-in: {report:#}"));
    assert_eq!(data["value"], 128 << 20);
    assert_eq!(data["applied"], true);
});

/// The workspace's entries, sorted (names only).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

attack!(the_workspace_keeps_only_what_the_command_wrote, |case| {
    // The sandbox needs `.cursor/` (protected) and `.git/` (the agent's git
    // dir) as mount points; neither is left behind.
    assert_eq!(case.probe(&["write", "out.txt"]), "ok");
    assert_eq!(entries(case.path()), ["out.txt", "substrat-probe"]);
    // A launcher killed with SIGKILL cannot remove them...
    let mut launcher = case
        .command(
            "worker",
            &[
                "/bin/sh",
                "-c",
                "touch started; exec ./substrat-probe sleep 60",
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the command to start", Duration::from_secs(10), || {
        case.path().join("started").exists()
    });
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    assert!(case.path().join(".cursor").is_dir() && case.path().join(".git").is_dir());
    // ...the next launch does, when it ends.
    assert_eq!(case.probe(&["write", "out.txt"]), "ok");
    assert_eq!(
        entries(case.path()),
        ["out.txt", "started", "substrat-probe"]
    );
});

/// A child process killed and reaped when dropped (a failed assertion
/// must not leave a sandbox waiting forever).
pub(super) struct KillOnDrop(pub(super) Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

attack!(a_mount_point_another_sandbox_uses_stays, |case| {
    // Sandbox A makes `.cursor/` and waits for a go; sandbox B, on the same
    // workspace, starts and ends meanwhile. A's `.cursor/` must still be a
    // read-only mount point when A goes on.
    let script = "touch a-started; while [ ! -e go ]; do sleep 0.05; done; \
                  exec ./substrat-probe write .cursor/planted";
    let mut a = KillOnDrop(Some(
        case.command("worker", &["/bin/sh", "-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    wait_until("sandbox A to start", Duration::from_secs(10), || {
        case.path().join("a-started").exists()
    });
    // B runs beside A, on the same git state too.
    assert_eq!(case.probe(&["write", "b.txt"]), "ok");
    assert!(
        case.path().join(".cursor").is_dir(),
        "B removed A's mount point"
    );
    std::fs::write(case.path().join("go"), "").unwrap();
    let out = a.0.take().unwrap().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("OUTCOME errno:EROFS"), "{out:?}");
    assert!(!case.path().join(".cursor").exists(), "left behind");
});

/// Pure cgroup v2 with a group delegated as systemd's `Delegate=yes` does
/// (the group and its cgroup.procs, cgroup.subtree_control and
/// cgroup.threads made the user's): the launcher, started as nobody inside
/// that group with no `--cgroup-parent`, makes the sandbox's groups below
/// it, moving itself into a leaf first (a group that enables controllers
/// for its children may hold no process), and the worker policy's
/// required limits hold. Hybrid hosts keep pids, memory and cpu in v1:
/// skipped there, by name (the leaf itself is tested on the real v2
/// hierarchy with the controller it has, in the sandbox crate).
#[test]
fn limits_hold_in_a_delegated_cgroup_v2_group() {
    let test = "limits_hold_in_a_delegated_cgroup_v2_group";
    if !is_root() {
        println!("SKIPPED {test}: not root, cannot delegate a group to nobody");
        return;
    }
    let root = Path::new("/sys/fs/cgroup");
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let needed = ["pids", "memory", "cpu"];
    if !needed
        .iter()
        .all(|c| available.split_whitespace().any(|a| a == *c))
    {
        println!(
            "SKIPPED {test}: /sys/fs/cgroup is not a cgroup v2 hierarchy with pids, memory and \
             cpu (controllers there: `{}`)",
            available.trim()
        );
        return;
    }
    for controller in needed {
        std::fs::write(
            root.join("cgroup.subtree_control"),
            format!("+{controller}"),
        )
        .unwrap();
    }
    let group = root.join(unique("substrat-escape-delegated"));
    std::fs::create_dir(&group).unwrap();
    for file in [
        "",
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.threads",
    ] {
        std::os::unix::fs::chown(group.join(file), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let ws = tempfile::tempdir().unwrap();
    let git_state = tempfile::tempdir().unwrap();
    for dir in [ws.path(), git_state.path()] {
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let report = ws.path().join("report.json");
    // Into the group first (as a scope's command is), then nobody.
    let script = "echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"";
    let out = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(&group)
        .args(AS_NOBODY)
        .arg(launcher())
        .args([
            "run",
            "--backend",
            "native",
            "--policy",
            "worker",
            "--workspace",
        ])
        .arg(ws.path())
        .arg("--git-state")
        .arg(git_state.path())
        .arg("--report")
        .arg(&report)
        .args(["--", "true"])
        .current_dir("/")
        .output()
        .unwrap();
    let report = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_dir(group.join("substrat-leaf"));
    let _ = std::fs::remove_dir(&group);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    for limit in ["pids_max", "memory_max", "cpu_max"] {
        let outcome = &report["cgroup"][limit];
        assert_eq!(outcome["status"], "applied", "{limit}: {outcome}");
        let made = outcome["group"].as_str().unwrap_or_default();
        assert!(
            made.starts_with(group.to_str().unwrap()),
            "{limit}: {outcome}"
        );
    }
}
