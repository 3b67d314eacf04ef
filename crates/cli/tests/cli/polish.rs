//! Small things a new user trips over (issue 20): names found in
//! --policy-dir, every error at once, completions and man pages, stale
//! proxy directories.

use super::*;

#[test]
fn a_policy_name_is_found_in_the_policy_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mine.toml"),
        "version = 1\nextends = \"worker\"\n[env]\nset = { PATH = \"/usr/bin:/bin\", HOME = \"${HOME}\", MARK = \"mine\" }\n",
    )
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let policy_dir = dir.path().to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy", "mine", "--policy-dir", policy_dir, "--"])
        .args(["sh", "-c", "echo $MARK"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "mine\n");
    let report = stdout_json(&substrat(&[
        "check",
        "--format",
        "json",
        "--policy-dir",
        policy_dir,
        "mine",
    ]));
    assert_eq!(report["policies"][0]["name"], "mine", "{report}");
    // A name found nowhere says where it looked.
    let out = substrat(&[
        "run",
        "--policy",
        "nosuch",
        "--policy-dir",
        policy_dir,
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 2);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("no nosuch.toml in a --policy-dir"), "{text}");
    assert!(text.contains(policy_dir), "{text}");
}

#[test]
fn check_reports_every_error_of_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "version = 1\nnetwork = \"bogus\"\n[filesystem]\nbinds = [{ source = \"/opt\" }]\n[rlimits]\nnofile = \"many\"\n",
    )
    .unwrap();
    let out = substrat(&["check", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let text = String::from_utf8_lossy(&out.stderr);
    let file = bad.display();
    for wanted in [
        format!("{file}:2:1: error[wrong-type] at `network`"),
        format!("{file}:4:"),
        "at `filesystem.binds[0]`: missing field `mode`".to_string(),
        format!("{file}:6:1: error[wrong-type] at `rlimits.nofile`"),
    ] {
        assert!(text.contains(&wanted), "missing {wanted:?} in:\n{text}");
    }
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("1 not loadable (3 errors)"), "{summary}");
}

#[test]
fn completions_and_man_pages_come_from_the_cli() {
    for (shell, wanted) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef substrat-sandbox"),
        ("fish", "complete -c substrat-sandbox"),
    ] {
        let out = substrat(&["completions", shell]);
        assert_eq!(code(&out), 0);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(wanted), "{shell}: {text}");
        assert!(
            text.contains("explain") && text.contains("dry-run"),
            "{shell}"
        );
    }
    let out = substrat(&["man"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(".ie") || text.contains(".TH substrat-sandbox"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = substrat(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(code(&out), 0);
    assert!(dir.path().join("substrat-sandbox-run.1").is_file());
}

#[test]
fn a_killed_launchs_proxy_directory_is_removed_by_the_next_launch() {
    let temp = std::env::temp_dir();
    // A pid that is gone: a child that has been reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = temp.join(format!("substrat-proxy-{dead}-5eed"));
    let alive = temp.join(format!("substrat-proxy-{}-11fe", std::process::id()));
    for dir in [&stale, &alive] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("proxy.sock"), "").unwrap();
    }
    let ws = tempfile::tempdir().unwrap();
    let policy = ws.path().join("proxied.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\nallow = [\"example.test\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy", policy.to_str().unwrap(), "--", "true"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stale.exists(), "the dead launcher's directory is gone");
    assert!(alive.exists(), "a live process's directory stays");
    std::fs::remove_dir_all(&alive).unwrap();
}
