//! Resources and lifetime: pids and memory limits, the tree's death with
//! the command and the launcher, exit codes and bad input.

use super::*;

// ---------------------------------------------------------------- resources and lifetime

attack!(fork_bomb_stopped_by_pids_limit, |case| {
    let outcome = case.probe_with("limits", &["fork-bomb"]);
    let count: u64 = outcome.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        outcome.starts_with("value:EAGAIN:") && count < 64,
        "{outcome}"
    );
    // The host still forks.
    assert!(Command::new("true").status().unwrap().success());
});

attack!(double_fork_survivor_dies_with_the_command, |case| {
    let marker = unique("substrat-survivor");
    assert_eq!(
        case.probe(&["survivor", &reversed(&marker)]),
        "value:spawned"
    );
    wait_until("the survivor to be gone", Duration::from_secs(5), || {
        host_processes_with(&marker).is_empty()
    });
});

attack!(launcher_death_kills_the_tree, |case| {
    let marker = unique("substrat-orphan");
    let script = format!(
        "./substrat-probe survivor {}; exec ./substrat-probe sleep 60",
        reversed(&marker)
    );
    let mut launcher = case
        .command("worker", &["/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the survivor to start", Duration::from_secs(10), || {
        !host_processes_with(&marker).is_empty()
    });
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until(
        "the tree to die with the launcher",
        Duration::from_secs(5),
        || host_processes_with(&marker).is_empty(),
    );
});

attack!(sigterm_to_launcher_ends_the_tree, |case| {
    let marker = unique("substrat-sigterm");
    let script = format!(
        "./substrat-probe survivor {}; exec ./substrat-probe sleep 60",
        reversed(&marker)
    );
    let launcher = case
        .command("worker", &["/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the survivor to start", Duration::from_secs(10), || {
        !host_processes_with(&marker).is_empty()
    });
    // setpriv execs the launcher, so the child's pid is the launcher's either way.
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = launcher.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(128 + 15));
    wait_until("the tree to be gone", Duration::from_secs(5), || {
        host_processes_with(&marker).is_empty()
    });
});

// ---------------------------------------------------------------- exit codes and bad input

attack!(exit_codes_pass_through, |case| {
    assert_eq!(
        case.run("worker", &["/bin/sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    assert_eq!(
        case.run("worker", &["/bin/sh", "-c", "kill -TERM $$"])
            .status
            .code(),
        Some(128 + 15)
    );
    let out = case.run("worker", &["no-such-command-substrat"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no-such-command-substrat: command not found")
    );
});

attack!(missing_required_bind_source_refused, |case| {
    let out = case.run("missing-bind", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/substrat-required does not exist"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("OUTCOME"));
});

#[test]
fn missing_workspace_refused() {
    let out = Command::new(launcher())
        .args([
            "run",
            "--policy",
            "worker",
            "--workspace",
            "/nonexistent/substrat-ws",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/substrat-ws does not exist")
    );
}

attack!(memory_hog_stopped_by_memory_limit, |case| {
    // The report goes into the workspace, which the launcher (root or nobody) may write.
    let report = case.path().join("report.json");
    let args = ["--report".as_ref(), report.as_os_str()];
    let mut cmd = case.command_with("limits", &args, &["./substrat-probe", "memory-hog", "1024"]);
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "the hog is killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("allocated"));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        report["cgroup"]["memory_max"]["status"], "applied",
        "{report:#}"
    );
    assert_eq!(report["exit_code"], 137);
    // The host is unaffected: it still allocates and forks.
    assert!(Command::new("true").status().unwrap().success());
});
