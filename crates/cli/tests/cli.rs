//! The substrat-sandbox binary, run as users run it: fresh processes, real
//! files, exit codes and outputs compared.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn substrat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(args)
        .current_dir(repo())
        .env_remove("SUBSTRAT_POLICY_DIR")
        .env_remove("SUBSTRAT_SECCOMP_DIR")
        .output()
        .unwrap()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn version_and_help() {
    let out = substrat(&["--version"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("substrat-sandbox {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&substrat(&["--help"]).stdout).into_owned();
    assert!(
        help.contains("check --host") && help.contains("docs/policy.md"),
        "{help}"
    );
    let help = String::from_utf8_lossy(&substrat(&["check", "--help"]).stdout).into_owned();
    assert!(
        help.contains("--fail-on") && help.contains("Exit status"),
        "{help}"
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(code(&substrat(&["check"])), 2);
    assert_eq!(
        code(&substrat(&["check", "--format", "yaml", "policies"])),
        2
    );
    assert_eq!(
        code(&substrat(&["check", "--fail-on", "severe", "policies"])),
        2
    );
    let out = substrat(&["check", "no/such/policy.toml"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
}

#[test]
fn shipped_policies_pass_fail_on_high() {
    let out = substrat(&["check", "--fail-on", "high", "--format", "json", "policies"]);
    let report = stdout_json(&out);
    assert_eq!(code(&out), 0, "{report:#}");
    let names: Vec<&str> = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reviewer", "strict", "upstream", "worker"]);
    // Built-in names work too and agree with the files.
    let builtin = stdout_json(&substrat(&["check", "--format", "json", "worker"]));
    assert_eq!(
        builtin["policies"][0]["findings"],
        report["policies"][3]["findings"]
    );
}

#[test]
fn host_network_and_writable_home_fail_fail_on_high() {
    let out = substrat(&[
        "check",
        "--fail-on",
        "high",
        "--format",
        "json",
        "tests/policies/good/host-network-writable-home.toml",
    ]);
    assert_eq!(code(&out), 1);
    let report = stdout_json(&out);
    let findings = report["policies"][0]["findings"].as_array().unwrap();
    let find = |id: &str| {
        findings
            .iter()
            .find(|f| f["rule_id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {findings:#?}"))
    };
    assert_eq!(find("SBX001")["line"], 5);
    assert_eq!(find("SBX003")["line"], 10);
    assert_eq!(find("SBX003")["severity"], "high");
    assert!(report["policies"][0]["score"].as_f64().unwrap() >= 5.0);
    // Below the threshold: the same policy passes --fail-on critical.
    assert_eq!(
        code(&substrat(&[
            "check",
            "--fail-on",
            "critical",
            "tests/policies/good/host-network-writable-home.toml"
        ])),
        0
    );
    // Without --fail-on the audit only reports.
    assert_eq!(
        code(&substrat(&[
            "check",
            "tests/policies/good/host-network-writable-home.toml"
        ])),
        0
    );
}

#[test]
fn tool_cap_above_40_parses_and_is_reported() {
    let out = substrat(&[
        "check",
        "--fail-on",
        "medium",
        "--format",
        "json",
        "tests/policies/good/tool-cap-above-40.toml",
    ]);
    assert_eq!(code(&out), 1);
    let report = stdout_json(&out);
    let f = &report["policies"][0]["findings"][0];
    assert_eq!(
        (f["rule_id"].as_str(), f["line"].as_u64()),
        (Some("SBX026"), Some(6))
    );
}

#[test]
fn malformed_policies_give_their_documented_error() {
    let dir = repo().join("tests/policies/bad");
    let expected: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("expected.toml")).unwrap()).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml") && !p.ends_with("expected.toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "at least 10 kinds of malformed policy");
    for file in files {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let want = expected
            .get(stem)
            .and_then(|v| v.as_table())
            .unwrap_or_else(|| panic!("{stem} has no entry in expected.toml"));
        let out = substrat(&["check", "--format", "json", file.to_str().unwrap()]);
        assert_eq!(code(&out), 2, "{stem}: exit code");
        let report = stdout_json(&out);
        let errors = report["errors"].as_array().unwrap();
        assert_eq!(errors.len(), 1, "{stem}: {errors:#?}");
        let err = &errors[0];
        let want_file = want
            .get("file")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .unwrap_or(format!("{stem}.toml"));
        let got_file = Path::new(err["location"]["file"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let got = (
            err["kind"].as_str().unwrap(),
            err["key_path"].as_str().unwrap(),
            err["location"]["line"].as_i64().unwrap(),
            err["location"]["column"].as_i64().unwrap(),
            got_file.as_str(),
        );
        let wanted = (
            want["kind"].as_str().unwrap(),
            want["key"].as_str().unwrap(),
            want["line"].as_integer().unwrap(),
            want["column"].as_integer().unwrap(),
            want_file.as_str(),
        );
        assert_eq!(got, wanted, "{stem}: {err:#}");
        // The same error in text on stderr: file:line:col, kind and key path.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = format!(":{}:{}: error[{}]", wanted.2, wanted.3, wanted.0);
        assert!(
            stderr.contains(&line) && stderr.contains(wanted.1),
            "{stem}: stderr {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stem}: {stderr}");
    }
}

#[test]
fn several_errors_in_one_policy_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        "version = 1\n[filesystem]\nbinds = [{ source = \"rel\", mode = \"ro\" }]\n[mcp]\ntool_steps_per_turn = 0\ninbox_depth = 0\n",
    )
    .unwrap();
    let out = substrat(&["check", "--format", "json", file.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let keys: Vec<String> = stdout_json(&out)["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key_path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        keys,
        [
            "filesystem.binds[0].source",
            "mcp.tool_steps_per_turn",
            "mcp.inbox_depth"
        ]
    );
}

#[test]
fn findings_in_inherited_keys_point_at_the_parent_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.toml"),
        "version = 1\nextends = \"worker\"\nlandlock = \"off\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("child.toml"),
        "version = 1\nextends = \"base\"\n\n[namespaces]\nnested_userns = true\n",
    )
    .unwrap();
    let out = substrat(&[
        "check",
        "--format",
        "json",
        dir.path().join("child.toml").to_str().unwrap(),
    ]);
    let report = stdout_json(&out);
    let findings = report["policies"][0]["findings"].as_array().unwrap();
    let at = |id: &str| {
        let f = findings.iter().find(|f| f["rule_id"] == id).unwrap();
        (
            Path::new(f["file"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string(),
            f["line"].as_u64().unwrap(),
        )
    };
    assert_eq!(at("SBX016"), ("base.toml".to_string(), 3));
    assert_eq!(at("SBX018"), ("child.toml".to_string(), 5));
    let chain = report["policies"][0]["chain"].as_array().unwrap();
    assert_eq!(chain.len(), 3);
    assert_eq!(chain[2], "builtin:policies/worker.toml");
}

#[test]
fn text_report_is_an_aligned_table_without_color_when_piped() {
    let out = substrat(&[
        "check",
        "tests/policies/good/host-network-writable-home.toml",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains('\x1b'), "no color codes when not a terminal");
    let header = text.lines().find(|l| l.contains("SEVERITY")).unwrap();
    let column = header.find("FINDING").unwrap();
    for line in text.lines().filter(|l| l.contains("SBX0")) {
        let message = &line[column..];
        assert!(!message.starts_with(' '), "misaligned: {line}");
    }
    assert!(text.contains("exposure "));
}

#[test]
fn host_report_names_what_this_machine_enforces() {
    let out = substrat(&["check", "--host", "--format", "json", "worker"]);
    let report = stdout_json(&out);
    let facts = &report["host"]["facts"];
    // Facts this test can verify independently of the probe.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(facts["kernel_release"], release.trim());
    let seccomp = Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
    assert_eq!(facts["seccomp_filter"], seccomp);
    let bwrap = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .any(|d| d.join("bwrap").is_file());
    assert_eq!(facts["bwrap"].is_object(), bwrap);
    // The user namespace probe really ran: it either succeeded or says why not.
    let userns = &facts["userns_for_invoker"];
    assert!(
        userns["result"] == "yes"
            || userns["reason"]
                .as_str()
                .is_some_and(|r| r.contains("unshare")),
        "{userns}"
    );
    assert!(facts["landlock_abi"].as_u64().is_some());
    // cargo builds the bwrap backend's helper beside the command.
    assert_eq!(facts["bwrap_helper"]["result"], "yes", "{facts}");
    // As root: what launches by root run as, and whether the usual places
    // of a workspace can be idmapped; probed only as root.
    let root = &facts["root_launches"];
    if !nix::unistd::geteuid().is_root() {
        assert!(root.is_null(), "{root}");
        return;
    }
    let has_range = |file: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("root:") || l.starts_with("0:"))
    };
    let slots = root["subordinate_slots"].as_u64().unwrap();
    assert_eq!(
        slots > 0,
        has_range("/etc/subuid") && has_range("/etc/subgid"),
        "{root}"
    );
    let probed: Vec<&str> = root["idmap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert!(probed.contains(&"/usr"), "{root}");
    // A path whose filesystem is known to refuse an idmap says so.
    let proc_probe = substrat(&["__probe-idmap", "/proc"]);
    assert_eq!(code(&proc_probe), 1);
    assert!(
        String::from_utf8_lossy(&proc_probe.stdout).contains("cannot be idmapped"),
        "{proc_probe:?}"
    );
}

/// `check --host` says when the bwrap backend's helper is not beside the
/// command (every bwrap launch would be refused).
#[test]
fn host_report_names_a_missing_bwrap_helper() {
    let dir = tempfile::tempdir().unwrap();
    let lonely = dir.path().join("substrat-sandbox");
    std::fs::copy(env!("CARGO_BIN_EXE_substrat-sandbox"), &lonely).unwrap();
    let out = output_of_copied(Command::new(&lonely).args(["check", "--host", "--format", "json"]));
    let report = stdout_json(&out);
    let helper = &report["host"]["facts"]["bwrap_helper"];
    // The command finds its directory through /proc/self/exe: symlinks resolved.
    let dir_seen = dir.path().canonicalize().unwrap();
    let missing = format!("{} is missing", dir_seen.join("substrat-init").display());
    assert_eq!(helper["result"], "no", "{helper}");
    assert_eq!(helper["reason"], missing.as_str());
    let rules: Vec<&str> = report["host"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["rule_id"].as_str())
        .collect();
    assert_eq!(rules.contains(&"HST007"), bwrap_on_path(), "{rules:?}");
}

fn bwrap_on_path() -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("bwrap").is_file())
}

/// `substrat-run` is `substrat-sandbox run` in a small binary: the same
/// command gives the same output and the same report on both backends.
#[test]
fn substrat_run_is_the_same_launcher() {
    let mut backends = vec!["native"];
    if bwrap_on_path() {
        backends.push("bwrap");
    } else {
        eprintln!("SKIPPED substrat_run_is_the_same_launcher[bwrap]: bubblewrap is not on PATH");
    }
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

/// Runs a freshly copied program. Another test thread's fork can still
/// hold the copy's write descriptor for a moment (until its exec closes
/// it), and exec then fails with ETXTBSY: retry that, nothing else.
fn output_of_copied(cmd: &mut Command) -> std::process::Output {
    for _ in 0..200 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
    panic!("{cmd:?}: text file busy for 2 s");
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
