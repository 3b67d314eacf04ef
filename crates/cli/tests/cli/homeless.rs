//! An account whose home does not exist (service accounts; `runuser -u
//! nobody` gives HOME=/nonexistent) launches and runs the daemon: state
//! goes to a private directory it can make, or one error names the setting
//! that gives it one.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const NOBODY: u32 = 65534;

/// A directory nobody owns (mode 0755), removed with the test's.
pub(crate) fn nobodys(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    dir
}

/// `substrat-sandbox ARGS` as nobody with only `env` (and a PATH).
/// setpriv execs (runuser would stay the parent, and a kill of the child
/// would leave the daemon running).
pub(crate) fn as_nobody(env: &[(&str, &Path)], args: &[&str]) -> Command {
    let mut command = Command::new("setpriv");
    command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
    command.args(["env", "-i", "PATH=/usr/bin:/bin"]);
    for (name, value) in env {
        command.arg(format!("{name}={}", value.display()));
    }
    command
        .arg(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(args);
    command
}

#[test]
fn an_account_without_a_home_launches_and_runs_the_daemon() {
    let test = "an_account_without_a_home_launches_and_runs_the_daemon";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: needs root to run as nobody");
        return;
    }
    if Path::new("/nonexistent").exists() {
        println!("SKIPPED {test}: /nonexistent exists here");
        return;
    }
    let parent = ParentGroups::make("homeless");
    parent.give_to(NOBODY);
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = nobodys(root.path(), "ws");
    let tmp = nobodys(root.path(), "tmp");
    let home = Path::new("/nonexistent");
    let cgroup = Path::new(&parent.name);
    let env = [
        ("HOME", home),
        ("TMPDIR", tmp.as_path()),
        ("SUBSTRAT_CGROUP_PARENT", cgroup),
    ];
    let ws_arg = ws.to_str().unwrap();

    // A launch: its git state in a private directory of its own making.
    let out = as_nobody(
        &env,
        &[
            "run",
            "--policy",
            "worker",
            "--workspace",
            ws_arg,
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let private = tmp.join(format!("substrat-{NOBODY}"));
    let meta = std::fs::symlink_metadata(&private).unwrap();
    assert!(meta.is_dir());
    assert_eq!((meta.uid(), meta.mode() & 0o777), (NOBODY, 0o700));
    assert!(private.join("git").is_dir(), "{}", private.display());

    // The daemon, its state there too, and a turn.
    let mut daemon = as_nobody(&env, &["daemon", "--provider", "stand-in"])
        .env("SUBSTRAT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let control = private.join("daemon/control.sock");
    let start = std::time::Instant::now();
    while !control.exists() && start.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let spawned = as_nobody(
        &env,
        &["agent", "spawn", "w", "--workspace", ws_arg, "hello"],
    )
    .output()
    .unwrap();
    let mut done = false;
    while spawned.status.success() && !done && start.elapsed().as_secs() < 60 {
        let out = as_nobody(&env, &["agent", "inspect", "w", "--json"])
            .output()
            .unwrap();
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        done = reply["activity"]["recent_turns"][0]["status"] == "done";
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(
        control.parent().unwrap().is_dir(),
        "no daemon state in {}",
        private.display()
    );
    assert!(
        spawned.status.success(),
        "{}",
        String::from_utf8_lossy(&spawned.stderr)
    );
    assert!(done, "the agent's turn did not end done");
}

/// A private directory it cannot have (another's link in its place): one
/// error, naming the one setting that gives it one; that setting works.
#[test]
fn without_a_usable_state_directory_one_error_names_the_setting() {
    let test = "without_a_usable_state_directory_one_error_names_the_setting";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: needs root to run as nobody");
        return;
    }
    if Path::new("/nonexistent").exists() {
        println!("SKIPPED {test}: /nonexistent exists here");
        return;
    }
    let parent = ParentGroups::make("homeless-err");
    parent.give_to(NOBODY);
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = nobodys(root.path(), "ws");
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::symlink(&ws, tmp.join(format!("substrat-{NOBODY}"))).unwrap();
    let cgroup = Path::new(&parent.name);
    let mut env = vec![
        ("HOME", Path::new("/nonexistent")),
        ("TMPDIR", tmp.as_path()),
        ("SUBSTRAT_CGROUP_PARENT", cgroup),
    ];
    let args = [
        "run",
        "--policy",
        "worker",
        "--workspace",
        ws.to_str().unwrap(),
        "--",
        "true",
    ];
    let out = as_nobody(&env, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("set XDG_STATE_HOME"), "{stderr}");
    // Nothing was written through the link.
    assert_eq!(std::fs::read_dir(&ws).unwrap().count(), 0);
    let state = nobodys(root.path(), "state");
    env.push(("XDG_STATE_HOME", state.as_path()));
    let out = as_nobody(&env, &args).output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(state.join("substrat/git").is_dir());
}
