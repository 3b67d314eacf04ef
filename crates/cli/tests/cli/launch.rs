//! `run` and `substrat-run`

use super::*;

/// `substrat-run` is `substrat-sandbox run` in a small binary: the same
/// command gives the same output and the same report on both backends.
#[test]
fn substrat_run_is_the_same_launcher() {
    let backends = backends_for("substrat_run_is_the_same_launcher");
    let ws = tempfile::tempdir().unwrap();
    // The protected paths exist, so neither run reports creating them.
    std::fs::create_dir_all(ws.path().join(".cursor")).unwrap();
    std::fs::create_dir_all(ws.path().join(".git/hooks")).unwrap();
    std::fs::write(ws.path().join(".git/config"), "").unwrap();
    for backend in backends {
        let reports: Vec<(String, Value)> = [
            (env!("CARGO_BIN_EXE_substrat-run"), vec![]),
            (env!("CARGO_BIN_EXE_substrat-sandbox"), vec!["run"]),
        ]
        .into_iter()
        .map(|(program, first)| {
            let report = ws.path().join("report.json");
            let out = Command::new(program)
                .args(first)
                .args([
                    "--policy",
                    "worker",
                    "--backend",
                    backend,
                    "--agent-id",
                    "same",
                ])
                .arg("--workspace")
                .arg(ws.path())
                .arg("--report")
                .arg(&report)
                .args(["--", "sh", "-c", "echo inside; exit 3"])
                .output()
                .unwrap();
            assert_eq!(code(&out), 3, "{}", String::from_utf8_lossy(&out.stderr));
            let report = std::fs::read_to_string(&report).unwrap();
            (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                without_launch_ids(serde_json::from_str(&report).unwrap()),
            )
        })
        .collect();
        assert_eq!(reports[0].0, "inside\n");
        assert_eq!(reports[0].1["backend"], backend);
        assert_eq!(reports[0], reports[1], "backend {backend}");
    }
}

/// A run report without what differs from launch to launch: the host ids
/// (each launch by root claims its own) and the cgroups' names (the
/// launcher's pid is in them).
fn without_launch_ids(mut report: Value) -> Value {
    if let Some(map) = report.as_object_mut() {
        for key in ["uid_map", "gid_map", "host_ids"] {
            map.remove(key);
        }
    }
    if let Some(limits) = report["cgroup"].as_object_mut() {
        for limit in limits.values_mut() {
            if let Some(limit) = limit.as_object_mut() {
                limit.remove("group");
            }
        }
    }
    report
}

/// The bwrap backend's helper is a binary of its own; without it beside
/// the launcher, the launch is refused before anything runs, naming it.
#[test]
fn bwrap_backend_without_its_helper_is_refused() {
    if !bwrap_on_path() {
        eprintln!("SKIPPED bwrap_backend_without_its_helper_is_refused: bubblewrap is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lonely = dir.path().join("substrat-run");
    std::fs::copy(env!("CARGO_BIN_EXE_substrat-run"), &lonely).unwrap();
    let marker = dir.path().join("ran");
    // Exit 2 and stderr of a launch that would touch the marker.
    let refused = || {
        let out = output_of_copied(
            Command::new(&lonely)
                .args(["--policy", "worker", "--backend", "bwrap"])
                .arg("--workspace")
                .arg(dir.path())
                .args(["--", "touch"])
                .arg(&marker),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(code(&out), 2, "{stderr}");
        assert!(!marker.exists(), "the command ran without a usable helper");
        stderr
    };
    let stderr = refused();
    assert!(
        stderr.starts_with("substrat-run: ")
            && stderr.contains("substrat-init")
            && stderr.contains("missing"),
        "{stderr}"
    );
    // A helper that is not an executable file is refused the same way.
    std::fs::write(dir.path().join("substrat-init"), "not a program").unwrap();
    let stderr = refused();
    assert!(stderr.contains("is not an executable file"), "{stderr}");
}

/// A view without the C library: the native backend needs nothing of it,
/// but the bwrap backend's helper (dynamically linked) cannot start there.
/// The launch is refused up front with the reason, not bwrap's bare ENOENT.
#[test]
fn bwrap_backend_refuses_a_view_its_helper_cannot_start_in() {
    if !bwrap_on_path() {
        eprintln!(
            "SKIPPED bwrap_backend_refuses_a_view_its_helper_cannot_start_in: bubblewrap is not on PATH"
        );
        return;
    }
    let helper = Path::new(env!("CARGO_BIN_EXE_substrat-run")).with_file_name("substrat-init");
    if substrat_sandbox::interp::program_interpreter(&helper)
        .unwrap()
        .is_none()
    {
        eprintln!(
            "SKIPPED bwrap_backend_refuses_a_view_its_helper_cannot_start_in: substrat-init is statically linked"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("bare.toml");
    std::fs::write(
        &policy,
        "version = 1\nnetwork = \"none\"\n[filesystem]\nbinds = [{ source = \"${WORKSPACE}\", mode = \"rw\" }]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-run"))
        .args(["--backend", "bwrap", "--policy"])
        .arg(&policy)
        .arg("--workspace")
        .arg(dir.path())
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("is dynamically linked and needs /") && stderr.contains("native backend"),
        "{stderr}"
    );
}

/// A launcher killed with SIGKILL leaves its (empty) groups, and the daemon
/// launches an agent's turns under one name: the next launch of that name
/// must still get its limits, and the leftover goes.
#[test]
fn a_leftover_group_of_the_same_name_does_not_cost_the_limits() {
    let ws = tempfile::tempdir().unwrap();
    let id = format!("leftover-{}", std::process::id());
    let launch = || {
        let report = ws.path().join("report.json");
        let out = Command::new(env!("CARGO_BIN_EXE_substrat-run"))
            .args([
                "--policy",
                "worker",
                "--backend",
                "native",
                "--agent-id",
                &id,
            ])
            .arg("--workspace")
            .arg(ws.path())
            .arg("--report")
            .arg(&report)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
        report["cgroup"]["pids_max"].clone()
    };
    let first = launch();
    if first["status"] != "applied" {
        eprintln!(
            "SKIPPED a_leftover_group_of_the_same_name_does_not_cost_the_limits: no pids cgroup here ({first})"
        );
        return;
    }
    // What a SIGKILLed launcher leaves: its empty group, still there, as
    // an old one (a minute is the age from which groups count as left).
    let group = PathBuf::from(first["group"].as_str().unwrap());
    assert!(!group.exists(), "the first launch removed its group");
    std::fs::create_dir(&group).unwrap();
    let touched = Command::new("touch")
        .args(["-d", "2 minutes ago"])
        .arg(&group)
        .status()
        .unwrap();
    assert!(touched.success());
    // The next launch of the same agent makes a group of its own (the
    // name holds the launcher's pid) and sweeps the leftover.
    let second = launch();
    assert_eq!(second["status"], "applied", "{second}");
    assert_ne!(second["group"], first["group"]);
    assert!(!group.exists(), "the leftover group was swept");
    // `..` in --cgroup-parent is refused before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-run"))
        .args(["--policy", "worker", "--cgroup-parent", "a/../../b"])
        .arg("--workspace")
        .arg(ws.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("`..` is not allowed"));
}

/// The workspace's own `.git`, inside another writable bind of the policy,
/// is the host's repository from before the run: left where it is, not
/// renamed aside as if the command had made it (`check --prove` found it).
#[test]
fn the_workspace_repository_inside_a_writable_tree_is_left_in_place() {
    let parent = tempfile::tempdir().unwrap();
    let ws = parent.path().join("ws");
    std::fs::create_dir_all(ws.join(".git/objects")).unwrap();
    std::fs::create_dir_all(ws.join(".git/refs")).unwrap();
    std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let policy = parent.path().join("parent.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = [{{ source = \"{}\", target = \"/parent\", mode = \"rw\" }}]\n",
            parent.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy", policy.to_str().unwrap(), "--git-state"])
        .arg(parent.path().join("state"))
        .args(["--", "sh", "-c", "echo inside > .git/config"])
        .current_dir(&ws)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(!stderr.contains("quarantine"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(!parent.path().join("ws/.git.substrat-quarantine").exists());
}

/// A mount point inside a tree the agent writes (its home) that is a link:
/// the launch is refused (mount points in writable binds are made without
/// following links) and nothing is made where the link points.
#[test]
fn a_link_on_the_way_to_a_mount_point_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempfile::tempdir().unwrap();
    let home = top.path().join("home");
    let ws = home.join("proj");
    std::fs::create_dir_all(&ws).unwrap();
    // The agent's own home, where it left `proj` as a link to elsewhere
    // (a directory anyone may write, so only the refusal keeps it empty).
    let agent_home = top.path().join("agent-home");
    std::fs::create_dir(&agent_home).unwrap();
    let elsewhere = top.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("made"), agent_home.join("proj")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy", "worker", "--workspace-judged", "--home"])
        .arg(&agent_home)
        .arg("--workspace")
        .arg(ws.canonicalize().unwrap())
        .args(["--backend", "native", "--", "true"])
        .env("HOME", home.canonicalize().unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("is a symlink or leads through one"),
        "{stderr}"
    );
    assert!(!elsewhere.join("made").exists(), "made through the link");
}

/// The filter is loaded with SECCOMP_FILTER_FLAG_SPEC_ALLOW unless the
/// policy says `speculative_store_bypass = "mitigate"`: seen in the
/// command's own /proc status, where the kernel mitigates through seccomp.
#[test]
fn the_speculation_mitigation_follows_the_policy() {
    let test = "the_speculation_mitigation_follows_the_policy";
    let mode = std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/spec_store_bypass")
        .unwrap_or_default();
    if !mode.contains("seccomp") {
        println!(
            "SKIPPED {test}: this kernel does not mitigate Speculative Store Bypass through seccomp here ({})",
            mode.trim()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let status = |knob: &str| {
        let policy = dir.path().join(format!("{knob}.toml"));
        std::fs::write(
            &policy,
            format!("version = 1\nextends = \"worker\"\n[seccomp]\nspeculative_store_bypass = \"{knob}\"\n"),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args([
                "run",
                "--backend",
                "native",
                "--policy",
                policy.to_str().unwrap(),
            ])
            .arg("--workspace")
            .arg(&ws)
            .args([
                "--",
                "grep",
                "Speculation_Store_Bypass",
                "/proc/self/status",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        status("mitigate").contains("force mitigated"),
        "{}",
        status("mitigate")
    );
    assert!(
        !status("allow").contains("force mitigated"),
        "{}",
        status("allow")
    );
}

/// `--die-with-parent` (the daemon's turns): when the parent dies by
/// SIGKILL the launcher and its sandbox end too, on both backends. The
/// bwrap backend launched by root once lost the request: changing the
/// filesystem ids to open the binds clears a process's parent-death signal.
#[test]
fn a_launch_dies_with_its_parent() {
    let backends = backends_for("a_launch_dies_with_its_parent");
    for backend in backends {
        let ws = tempfile::tempdir().unwrap();
        // The parent: a shell that starts the launcher naming itself, says
        // the launcher's pid, and waits.
        // The sandbox's command, findable by its argument from the host.
        let naps = format!("3000.{}", std::process::id() * 10 + backend.len() as u32);
        let script = format!(
            "\"$0\" --policy worker --backend {backend} --tty never --workspace \"$1\" \
             --die-with-parent $$ -- sh -c 'echo started >&2; exec sleep {naps}' & echo $!; wait"
        );
        let mut parent = Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_substrat-run")])
            .arg(ws.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(parent.stdout.take().unwrap());
        let mut stderr = std::io::BufReader::new(parent.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        let launcher: i32 = line.trim().parse().unwrap();
        // The sandbox's command runs: the launcher is past its setup.
        let mut said = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut said).unwrap();
        assert_eq!(said.trim(), "started", "{backend}");
        let sleeping = || {
            std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .any(|c| c == format!("sleep\0{naps}\0").as_bytes())
        };
        let seen_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !sleeping() {
            assert!(
                std::time::Instant::now() < seen_by,
                "{backend}: no sleep {naps} seen"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        parent.kill().unwrap();
        parent.wait().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while Path::new(&format!("/proc/{launcher}")).exists() {
            // A zombie is gone as far as the sandbox goes (init reaps it).
            let stat =
                std::fs::read_to_string(format!("/proc/{launcher}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: the launcher {launcher} outlived its parent"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // And the sandbox with it.
        while sleeping() {
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: the sandbox's command outlived the launcher's parent"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Every process of a sandbox under the worker policy is in the groups its
/// launcher made, in each hierarchy that holds a limit, and none stayed in
/// the launcher's: the first process enters v1 groups by itself (moving its
/// one thread), so this checks the move really happened before anything
/// else started, on both backends.
#[test]
fn every_process_of_a_sandbox_is_in_its_cgroups() {
    let test = "every_process_of_a_sandbox_is_in_its_cgroups";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: only root gets cgroups without a delegated parent here");
        return;
    }
    let backends = backends_for(test);
    let ws = tempfile::tempdir().unwrap();
    for backend in backends {
        let mut launcher = Command::new(env!("CARGO_BIN_EXE_substrat-run"))
            .args(["--policy", "worker", "--backend", backend])
            .arg("--workspace")
            .arg(ws.path())
            // A child of the command too: started after the move, as
            // everything the agent starts is.
            .args(["--", "sh", "-c", "sleep 60 & echo up; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut up = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(launcher.stdout.take().unwrap()),
            &mut up,
        )
        .unwrap();
        assert_eq!(up, "up\n", "{backend}");
        let launcher_pid = launcher.id() as i32;
        let groups = |pid: i32| limited_groups(&format!("/proc/{pid}/cgroup"));
        let own = groups(launcher_pid);
        assert!(!own.is_empty(), "{backend}: no pids or memory hierarchy");
        let sandbox = descendants(launcher_pid);
        // The holder or bwrap, init, the shell, sleep: at least four.
        assert!(sandbox.len() >= 4, "{backend}: {sandbox:?}");
        let first = groups(sandbox[0]);
        for pid in &sandbox {
            let theirs = groups(*pid);
            assert_eq!(theirs, first, "{backend}: pid {pid} is in other groups");
            for ((hierarchy, path), (_, launchers)) in theirs.iter().zip(&own) {
                assert_ne!(
                    path, launchers,
                    "{backend}: pid {pid} stayed in {hierarchy}"
                );
                assert!(path.contains("/substrat-"), "{backend}: {hierarchy} {path}");
            }
        }
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(launcher_pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        assert_eq!(launcher.wait().unwrap().code(), Some(128 + 15), "{backend}");
    }
}

/// A process's groups in the hierarchies of the worker policy's limits
/// (v1 pids and memory; the v2 one where those are not v1), in order.
fn limited_groups(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let v1: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "pids" || c == "memory")
                .then(|| (controllers.to_string(), path.to_string()))
        })
        .collect();
    if !v1.is_empty() {
        return v1;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("0::"))
        .map(|path| ("v2".to_string(), path.to_string()))
        .collect()
}

/// Every process below `pid`, parents before their children.
fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        for child in child_pids(parent).iter().filter_map(|c| c.parse().ok()) {
            found.push(child);
            queue.push(child);
        }
    }
    found
}
