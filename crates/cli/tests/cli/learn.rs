//! `learn` (issue 45): a command observed in a real launcher, the policy
//! learned from it checked and replayed before it is written, and secret
//! places wanted during learning refused and said, never added.

use super::*;

/// Root here: worker's cgroup limits are required and root can make them.
pub(super) fn skipped(test: &str) -> bool {
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: learn's worker sandboxes need a cgroup, made as root here");
        return true;
    }
    false
}

pub(super) fn learn(home: &Path, workspace: &Path, out: &Path, script: &str) -> Output {
    substrat_command(&[
        "learn",
        "--workspace",
        workspace.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ])
    .env("HOME", home)
    .env("LC_ALL", "C") // no message catalogs (glibc's locale.alias is a link to /etc here)
    .output()
    .unwrap()
}

/// A scratch directory outside /tmp: the plan refuses whatever lies in a
/// world-writable sticky directory (another account can swap it). The
/// target directory is one unless the checkout itself is below such a
/// directory (a clone in /tmp, as CI's may be): then a directory of root's
/// at the top (these tests run as root; below /var or /srv, check refuses
/// the read-write binds the tests expect).
pub(super) fn scratch() -> tempfile::TempDir {
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let fallback = std::path::Path::new("/substrat-learn-tests");
    let base = if below_sticky_dir(target) && std::fs::create_dir_all(fallback).is_ok() {
        fallback
    } else {
        target
    };
    tempfile::tempdir_in(base).unwrap()
}

/// Whether `path` or a directory above it is world-writable and sticky.
fn below_sticky_dir(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    path.ancestors()
        .any(|dir| std::fs::metadata(dir).is_ok_and(|m| m.mode() & 0o1002 == 0o1002))
}

/// The policy's `binds_add` array, whole.
pub(super) fn binds_add(policy: &str) -> &str {
    let start = policy.find("binds_add = [").unwrap();
    &policy[start..]
}

#[test]
fn learn_gives_a_command_what_it_read_and_replays_it() {
    let test = "learn_gives_a_command_what_it_read_and_replays_it";
    if skipped(test) {
        return;
    }
    let dir = scratch();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let out = dir.path().join("learned.toml");
    let got = learn(
        &home,
        &ws,
        &out,
        "cat /etc/os-release; ls /usr/share >/dev/null",
    );
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 0, "{stderr}");
    // Under worker the first run could not read it; the second could.
    assert!(
        stderr.contains("cat: /etc/os-release: No such file"),
        "{stderr}"
    );
    assert!(stderr.contains("learn: run 2:"), "{stderr}");
    assert!(
        stderr.contains("replay under the learned policy: exit 0"),
        "{stderr}"
    );
    let policy = std::fs::read_to_string(&out).unwrap();
    assert!(policy.contains("\nextends = \"worker\"\n"), "{policy}");
    assert_eq!(
        binds_add(&policy),
        "binds_add = [\n  # read: /etc/os-release\n  { source = \"/etc/os-release\", mode = \"ro\" },\n]\n"
    );
    // What was written passes the audit as learn ran it, and runs.
    let check = substrat(&["check", "--fail-on", "high", out.to_str().unwrap()]);
    assert_eq!(
        code(&check),
        0,
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let run = substrat_command(&[
        "run",
        "--policy",
        out.to_str().unwrap(),
        "--workspace",
        ws.to_str().unwrap(),
        "--",
        "head",
        "-c",
        "11",
        "/etc/os-release",
    ])
    .env("HOME", &home)
    .output()
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout), "PRETTY_NAME");
}

#[test]
fn learn_refuses_and_reports_secret_places_it_saw_wanted() {
    let test = "learn_refuses_and_reports_secret_places_it_saw_wanted";
    if skipped(test) {
        return;
    }
    let dir = scratch();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let key = home.join(".ssh/id_ed25519");
    std::fs::write(&key, "SECRET-KEY-TEXT\n").unwrap();
    std::fs::write(home.join(".aws/credentials"), "SECRET-AWS-TEXT\n").unwrap();
    std::fs::write(home.join(".gitconfig"), "[user]\n").unwrap();
    let out = dir.path().join("learned.toml");
    // A link in the workspace to the key: refused by where it leads.
    std::os::unix::fs::symlink(&key, ws.join("key")).unwrap();
    let script = "cat ~/.ssh/id_ed25519; cat ~/.aws/credentials; cat key; cat ~/.gitconfig; \
                  cat /etc/shadow; true";
    let got = learn(&home, &ws, &out, script);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&got.stderr),
    );
    assert_eq!(code(&got), 0, "{stderr}");
    assert!(
        !stdout.contains("SECRET") && !stderr.contains("SECRET"),
        "{stderr}"
    );
    let policy = std::fs::read_to_string(&out).unwrap();
    let home_text = home.display();
    for (path, why) in [
        (
            format!("{home_text}/.ssh/id_ed25519"),
            "credentials (~/.ssh",
        ),
        (
            format!("{home_text}/.aws/credentials"),
            "credentials (~/.aws",
        ),
        (format!("{}/key", ws.display()), "credentials (~/.ssh"),
        ("/etc/shadow".to_string(), "the host's password hashes"),
    ] {
        let line = format!("learn: wanted, not granted: {path} ({why}");
        assert!(stderr.contains(&line), "{line} missing:\n{stderr}");
        assert!(policy.contains(&format!("#   {path}: {why}")), "{policy}");
    }
    // Only the harmless file is granted.
    assert_eq!(
        binds_add(&policy),
        "binds_add = [\n  # read: ".to_string()
            + &format!("{home_text}/.gitconfig")
            + "\n  { source = \"${HOME}/.gitconfig\", mode = \"ro\" },\n]\n"
    );
}

#[test]
fn learn_offers_no_policy_to_a_command_flooding_the_observer() {
    let test = "learn_offers_no_policy_to_a_command_flooding_the_observer";
    if skipped(test) {
        return;
    }
    let dir = scratch();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let out = dir.path().join("learned.toml");
    let got = substrat_command(&[
        "learn",
        "--workspace",
        ws.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        "import os\nfor i in range(70000):\n    try: os.stat(f'/nonexistent/{i}')\n    except OSError: pass\n",
    ])
    .env("HOME", &home)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 2, "{stderr}");
    // The flood was seen (every one of its calls), then refused.
    assert!(stderr.contains("65536 paths"), "{stderr}");
    assert!(
        stderr.contains(
            "the command used more than 65536 paths or 8388608 bytes of names: the record is \
             incomplete, no policy is offered"
        ),
        "{stderr}"
    );
    assert!(!out.exists());
}

#[test]
fn learn_never_binds_a_name_with_a_control_character() {
    let test = "learn_never_binds_a_name_with_a_control_character";
    if skipped(test) {
        return;
    }
    let dir = scratch();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    // A name that would end a comment and grant the home if written raw.
    let name = "a\n  { source = \"${HOME}\", mode = \"rw\" },\n#x";
    std::fs::write(home.join(name), "x").unwrap();
    std::fs::write(home.join(".gitignore_global"), "x").unwrap();
    let out = dir.path().join("learned.toml");
    let script = r#"
import os
for name in ["a\n  { source = \"${HOME}\", mode = \"rw\" },\n#x", ".gitignore_global"]:
    try: open(os.path.join(os.environ["HOME"], name)).read()
    except OSError: pass
"#;
    let got = substrat_command(&[
        "learn",
        "--workspace",
        ws.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        script,
    ])
    .env("HOME", &home)
    .env("LC_ALL", "C")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 0, "{stderr}");
    let policy = std::fs::read_to_string(&out).unwrap();
    let refused = format!(
        "#   {}/a\\n  {{ source = \"${{HOME}}\", mode = \"rw\" }},\\n#x: a name a policy cannot hold as written",
        home.display()
    );
    assert!(policy.contains(&refused), "{policy}");
    let parsed: toml::Value = toml::from_str(&policy).unwrap();
    // Of the home, only the plain file (known-safe) (python's own links into /etc aside).
    let in_home: Vec<&str> = parsed["filesystem"]["binds_add"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["source"].as_str())
        .filter(|s| s.starts_with("${HOME}"))
        .collect();
    assert_eq!(in_home, ["${HOME}/.gitignore_global"], "{policy}");
}

#[test]
fn learn_gives_git_the_users_config_it_read() {
    let test = "learn_gives_git_the_users_config_it_read";
    if skipped(test) {
        return;
    }
    let dir = scratch();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(home.join(".gitconfig"), "[log]\n\tdecorate = short\n").unwrap();
    git_in(&ws, &["init", "-q", "."]);
    git_in(&ws, &["commit", "-q", "--allow-empty", "-m", "first"]);
    let out = dir.path().join("learned.toml");
    let got = learn(&home, &ws, &out, "git log --oneline");
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 0, "{stderr}");
    // Read under the learned policy, the config decorates the log.
    assert!(stderr.contains("(HEAD -> "), "{stderr}");
    let policy = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        binds_add(&policy),
        format!(
            "binds_add = [\n  # read, looked up: {}/.gitconfig\n  {{ source = \"${{HOME}}/.gitconfig\", mode = \"ro\" }},\n]\n",
            home.display()
        )
    );
}
