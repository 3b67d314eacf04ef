//! `check`

use super::*;

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

/// The seed's safety limits, as the broker enforces them for each role:
/// the list limit's default (5,000) and a role's own.
#[test]
fn check_shows_each_roles_tool_limits() {
    let out = substrat(&[
        "check",
        "--format",
        "json",
        "policies/worker.toml",
        "tests/broker/policies/lister.toml",
    ]);
    let report = stdout_json(&out);
    let limits: Vec<&Value> = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["tool_limits"])
        .collect();
    assert_eq!(
        limits[0],
        &serde_json::json!({"read_bytes": 262144, "list_entries": 5000, "tool_steps": 20, "tools": 40})
    );
    assert_eq!(limits[1]["list_entries"], 2);
    let text =
        String::from_utf8_lossy(&substrat(&["check", "tests/broker/policies/lister.toml"]).stdout)
            .into_owned();
    assert!(
        text.contains(
            "tool limits: read 262144 bytes, lists 2 entries, 20 tool steps a turn, 40 tools"
        ),
        "{text}"
    );
}
