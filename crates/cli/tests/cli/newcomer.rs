//! What a new user meets first (issue 20): risky workspaces refused,
//! dangerous policies named before they run, the plan explained without
//! running, every bind in the report.

use super::*;

fn run_in(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .arg("run")
        .args(args)
        .current_dir(ws)
        .env_remove("SUBSTRAT_POLICY_DIR")
        .env_remove("SUBSTRAT_SECCOMP_DIR")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_workspace_holding_keys_or_startup_files_is_refused_with_what_it_exposes() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".ssh")).unwrap();
    std::fs::write(ws.path().join(".ssh/id_ed25519"), "KEY").unwrap();
    std::fs::write(ws.path().join(".bashrc"), "echo hi").unwrap();
    let marker = ws.path().join("ran");
    let argv = ["--policy", "worker", "--", "touch", "ran"];
    let out = run_in(ws.path(), &argv);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("exposes more than a project"), "{text}");
    assert!(
        text.contains(&format!(
            "it holds credentials: {}",
            ws.path().join(".ssh").display()
        )),
        "{text}"
    );
    assert!(text.contains(".bashrc"), "{text}");
    assert!(text.contains("--allow-workspace-risk"), "{text}");
    assert!(!marker.exists(), "nothing ran");
    // Allowed for one run: it runs, with a warning naming the same.
    let mut allowed = vec!["--allow-workspace-risk"];
    allowed.extend(argv);
    let out = run_in(ws.path(), &allowed);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: workspace"),
        "{}",
        stderr(&out)
    );
    assert!(marker.exists());
    // Allowed by the policy, which `check` then reports (SBX041, medium).
    std::fs::remove_file(&marker).unwrap();
    let policy = ws.path().join("risky.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\n[filesystem]\nallow_workspace_risk = true\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    let out = run_in(ws.path(), &["--policy", policy, "--", "touch", "ran"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(marker.exists());
    let check = stdout_json(&substrat(&["check", "--format", "json", policy]));
    let rules: Vec<&str> = check["policies"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule_id"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["SBX041"], "{check}");
}

#[test]
fn root_and_home_workspaces_are_refused() {
    let home = tempfile::tempdir().unwrap();
    for (ws, reason) in [
        (Path::new("/"), "it is `/`"),
        (home.path(), "it is the home directory"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(["run", "--policy", "worker", "--workspace"])
            .arg(ws)
            .args(["--", "true"])
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert_eq!(code(&out), 2, "{ws:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(reason), "{ws:?}: {}", stderr(&out));
    }
}

#[test]
fn a_policy_with_a_high_finding_warns_in_one_line_and_explains_on_request() {
    let ws = tempfile::tempdir().unwrap();
    let policy = ws.path().join("hostnet.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\nnetwork = \"host\"\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    let out = run_in(ws.path(), &["--policy", policy, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lines: Vec<String> = stderr(&out).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("warning: policy hostnet has 1 high or critical finding(s) (SBX001"));
    let out = run_in(ws.path(), &["--explain", "--policy", policy, "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("exposure 3.0/10, 1 finding(s)"), "{text}");
    assert!(text.contains("high     SBX001 network-host"), "{text}");
    assert!(text.contains("fix: Use `network = \"none\"`"), "{text}");
    // The shipped worker policy has no high finding: it runs without a word.
    let out = run_in(ws.path(), &["--policy", "worker", "--", "true"]);
    assert_eq!((code(&out), stderr(&out)), (0, String::new()));
}

#[test]
fn dry_run_explains_every_layer_and_starts_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let policy = ws.path().join("tokens.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\n[env]\nallow = [\"DEPLOY_TOKEN\"]\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    let explain = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(args)
            .current_dir(ws.path())
            .env("DEPLOY_TOKEN", "tok-4d1f9a7c")
            .output()
            .unwrap()
    };
    let out = explain(&["run", "--dry-run", "--policy", policy, "--", "touch", "ran"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!ws.path().join("ran").exists(), "nothing ran");
    let text = String::from_utf8_lossy(&out.stdout);
    let workspace = ws.path().canonicalize().unwrap();
    for wanted in [
        "nothing is started".to_string(),
        "command: touch ran".to_string(),
        format!(
            "bind      rw   {} <- {}",
            workspace.display(),
            workspace.display()
        ),
        "bind      ro   /usr <- /usr".to_string(),
        "network: none: its own namespace with only its own loopback".to_string(),
        "landlock: required".to_string(),
        "denied: ptrace".to_string(),
        "cgroup: pids.max 512".to_string(),
        "DEPLOY_TOKEN".to_string(),
        "audit: exposure".to_string(),
    ] {
        assert!(text.contains(&wanted), "missing {wanted:?} in:\n{text}");
    }
    assert!(
        !text.contains("tok-4d1f9a7c"),
        "a value was printed:\n{text}"
    );
    // `explain` is the same, and --json is whole JSON.
    let out = explain(&["explain", "--json", "--policy", policy]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("tok-4d1f9a7c"));
    let json = stdout_json(&out);
    assert_eq!(json["argv"], serde_json::json!(["sh"]));
    let ws_bind = json["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["target"] == workspace.to_str().unwrap())
        .unwrap();
    assert_eq!(
        (&ws_bind["kind"], &ws_bind["mode"]),
        (&"bind".into(), &"rw".into())
    );
    assert!(
        json["seccomp"]["denied"]
            .as_array()
            .unwrap()
            .contains(&"bpf".into())
    );
    assert!(
        json["env"]
            .as_array()
            .unwrap()
            .contains(&"DEPLOY_TOKEN".into())
    );
    // No command and no --dry-run: a usage error, not a shell.
    let out = explain(&["run", "--policy", policy]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("no command given"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_run_report_lists_every_bind() {
    let ws = tempfile::tempdir().unwrap();
    let report = ws.path().join("report.json");
    let out = run_in(
        ws.path(),
        &[
            "--policy",
            "worker",
            "--report",
            report.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let binds = report["binds"].as_array().unwrap();
    let workspace = ws.path().canonicalize().unwrap();
    let find = |target: &str| binds.iter().find(|b| b["target"] == target).cloned();
    let ws_bind = find(workspace.to_str().unwrap()).unwrap();
    assert_eq!(ws_bind["access"], "rw");
    assert_eq!(ws_bind["skipped"], false);
    assert_eq!(find("/usr").unwrap()["access"], "ro");
    let made = binds.iter().filter(|b| b["skipped"] == false).count();
    assert_eq!(made as u64, report["mounts"]["binds"].as_u64().unwrap());
}

#[test]
fn the_command_gets_a_writable_home_of_its_own_never_the_real_one() {
    let real_home = tempfile::tempdir().unwrap();
    std::fs::write(real_home.path().join(".real-home-marker"), "host").unwrap();
    let ws = tempfile::tempdir().unwrap();
    let kept = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], script: &str| {
        Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(["run", "--policy", "worker"])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .current_dir(ws.path())
            .env("HOME", real_home.path())
            .output()
            .unwrap()
    };
    let script = "cd && pwd && ls -A && mkdir -p .cache && echo note > .cache/n && cat .cache/n";
    // One-off: an empty private home at $HOME, writable, gone afterwards.
    let out = run(&[], script);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let home = real_home.path().canonicalize().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\nnote\n", real_home.path().display())
    );
    assert!(home.join(".real-home-marker").exists());
    assert!(
        !home.join(".cache").exists(),
        "nothing reached the real home"
    );
    // --home DIR: kept from run to run.
    let kept_arg = kept.path().to_str().unwrap();
    let out = run(&["--home", kept_arg], "echo one > ~/state");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(&["--home", kept_arg], "cat ~/state");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\n");
    // A home that holds keys is refused like such a workspace.
    std::fs::create_dir(kept.path().join(".gnupg")).unwrap();
    let out = run(&["--home", kept_arg], "true");
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("it holds credentials"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_command_only_the_host_has_gets_the_bind_that_shows_it() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join(".mytool/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("mytool"), "#!/bin/sh\necho mytool ran\n").unwrap();
    std::fs::set_permissions(bin.join("mytool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let run = |policy: &str, argv: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(["run", "--policy", policy, "--"])
            .args(argv)
            .current_dir(ws.path())
            .env("HOME", home.path())
            .env("PATH", &path)
            .output()
            .unwrap()
    };
    let out = run("worker", &["mytool"]);
    assert_eq!(code(&out), 127);
    let text = stderr(&out);
    assert!(
        text.contains("`mytool` is not in the sandbox, but this host has"),
        "{text}"
    );
    assert!(
        text.contains("binds_add = [{ source = \"${HOME}/.mytool\", mode = \"ro\" }]"),
        "{text}"
    );
    assert!(text.contains("PATH = \"${HOME}/.mytool/bin:"), "{text}");
    // The command's own 127 gets no hint.
    let out = run("worker", &["sh", "-c", "exit 127"]);
    assert_eq!((code(&out), stderr(&out)), (127, String::new()));
    // What the hint says works.
    let policy = ws.path().join("tool.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\n[filesystem]\n\
         binds_add = [{ source = \"${HOME}/.mytool\", mode = \"ro\" }]\n[env]\n\
         set = { PATH = \"${HOME}/.mytool/bin:/usr/local/bin:/usr/bin:/bin\", HOME = \"${HOME}\" }\n",
    )
    .unwrap();
    let out = run(policy.to_str().unwrap(), &["mytool"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "mytool ran\n");
}

/// The daemon's turns (`--workspace-judged`): what the agent left in its
/// workspace does not end its turns, but a link put on the workspace's way
/// and a workspace that is a home are refused still.
#[test]
fn a_judged_workspace_keeps_its_place_checks() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".ssh")).unwrap();
    let link = home.path().join("link");
    std::os::unix::fs::symlink(home.path(), &link).unwrap();
    let run = |workspace: &Path| {
        Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args([
                "run",
                "--workspace-judged",
                "--policy",
                "worker",
                "--workspace",
            ])
            .arg(workspace)
            .args(["--", "true"])
            .env("HOME", home.path())
            .output()
            .unwrap()
    };
    let ws_path = ws.path().canonicalize().unwrap();
    let out = run(&ws_path);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("allowed by the daemon"),
        "{}",
        stderr(&out)
    );
    let out = run(&link);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("a link was put on its way"),
        "{}",
        stderr(&out)
    );
    let out = run(&home.path().canonicalize().unwrap());
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("it is the home directory"),
        "{}",
        stderr(&out)
    );
}

/// `--policy worker` is the name, never a file `worker` the agent left in
/// the directory the launch starts from.
#[test]
fn a_policy_name_never_loads_a_file_of_the_current_directory() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("worker"),
        "version = 1\nnetwork = \"host\"\n[filesystem]\nbinds = [{ source = \"/\", mode = \"rw\" }]\n",
    )
    .unwrap();
    let out = run_in(ws.path(), &["--policy", "worker", "--", "true"]);
    assert_eq!((code(&out), stderr(&out)), (0, String::new()));
}

#[test]
fn a_home_holding_a_repository_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let repo = home.path().join("src/.git");
    std::fs::create_dir_all(repo.join("objects")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let out = run_in(
        ws.path(),
        &[
            "--home",
            home.path().to_str().unwrap(),
            "--policy",
            "worker",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("it holds a git repository"),
        "{}",
        stderr(&out)
    );
}
