//! The choice of backend and what the report says about it.

use super::*;

// ---------------------------------------------------------------- backend choice

/// In a user namespace whose `max_user_namespaces` is 0, the native backend
/// cannot start; `auto` must then try bwrap (which, not being setuid, fails
/// the same way here) and say what each backend hit. The namespace is made
/// by nobody: its root is nobody on the host, so the launcher runs the
/// sandbox as that (host root's namespace would need root's subordinate ids).
#[test]
fn auto_backend_falls_back_to_bwrap_and_reports_both() {
    if !runnable(
        Who::Nobody,
        "auto_backend_falls_back_to_bwrap_and_reports_both",
    ) {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" run --backend auto --policy worker --workspace \"$1\" --git-state \"$1/.git-state\" -- true";
    let mut unshare = Command::new("unshare");
    unshare.args(["--user", "--map-root-user", "--", "sh", "-c", script]);
    let delegation = Delegation::for_nobody(Who::Nobody, &["memory", "pids", "cpu"]);
    if let Some(delegation) = &delegation {
        unshare.env("SUBSTRAT_CGROUP_PARENT", &delegation.name);
    }
    let as_nobody: Vec<&std::ffi::OsStr> = AS_NOBODY.iter().map(std::ffi::OsStr::new).collect();
    let out = run_through(&as_nobody, &unshare)
        .arg(launcher())
        .arg(ws.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("native backend: unshare: ENOSPC"),
        "{stderr}"
    );
    assert!(stderr.contains("bwrap backend:"), "{stderr}");
}

#[test]
fn bwrap_backend_without_bwrap_says_what_is_missing() {
    let ws = tempfile::tempdir().unwrap();
    let out = Command::new(launcher())
        .env("PATH", "/nonexistent")
        .args([
            "run",
            "--backend",
            "bwrap",
            "--policy",
            "worker",
            "--workspace",
        ])
        .arg(ws.path())
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs bubblewrap on PATH"));
}

#[test]
fn report_names_the_backend_and_why() {
    for (backend, reason) in [
        ("native", "requested: native"),
        ("bwrap", "requested: bwrap"),
        ("auto", "auto: user namespaces are available"),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let report = ws.path().join("report.json");
        let out = Command::new(launcher())
            .args([
                "run",
                "--backend",
                backend,
                "--policy",
                "worker",
                "--report",
            ])
            .arg(&report)
            .arg("--workspace")
            .arg(ws.path())
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let expected = if backend == "auto" { "native" } else { backend };
        assert_eq!(report["backend"], expected);
        assert!(
            report["backend_reason"]
                .as_str()
                .unwrap()
                .starts_with(reason),
            "{report:#}"
        );
        assert_eq!(report["landlock"]["status"], "full");
        assert_eq!(report["seccomp_filters_loaded"], 2);
        assert_eq!(report["nested_userns_blocked"], true);
    }
}

attack!(socket_families_hold_under_a_default_allow_profile, |case| {
    assert_eq!(
        case.probe_with("default-allow", &["bpf"]),
        "errno:EPERM",
        "the profile's own denial"
    );
    assert_eq!(
        case.probe_with("default-allow", &["socket", "inet", "garbage"]),
        "errno:EPERM"
    );
    assert_eq!(
        case.probe_with("default-allow", &["socket", "netlink"]),
        "errno:EPERM"
    );
    assert_eq!(case.probe_with("default-allow", &["socket", "unix"]), "ok");
    let out = case.run("default-allow", &["/bin/true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warning: seccomp rules naming syscalls this system does not know were skipped: no_such_syscall_substrat"), "{stderr}");
});
