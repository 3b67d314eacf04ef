//! Issue 40: `workspace apply` keeps the modes the agent set, within what
//! the owner's umask allows; set-id bits never pass.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// An overlay run that sets modes, over a workspace `ws`, kept in `L`.
fn agent_set_modes() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/run.sh"), "echo hi\n").unwrap();
    std::fs::set_permissions(
        dir.path().join("ws/run.sh"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    let script = "chmod 775 run.sh; echo g > shared.txt; chmod 666 shared.txt; \
        mkdir d; chmod 777 d";
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy"])
        .arg(dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(dir.path().join("L"))
        .arg("--git-state")
        .arg(dir.path().join("git"))
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // The sandbox refuses set-id modes (EPERM): planted in the layer as
    // its owner could (apply must not trust what a layer holds).
    let planted = dir.path().join("L/turns/1/upper/d/setuid");
    std::fs::write(&planted, "s\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();
    dir
}

/// `workspace diff --stat L`, then `workspace apply L`, under `umask`.
fn apply_with_umask(dir: &Path, umask: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask {umask}; \"$0\" workspace diff --stat \"$1\" >/dev/null && exec \"$0\" workspace apply \"$1\""
        ))
        .arg(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .arg(dir.join("L"))
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn apply_keeps_the_agents_modes_within_the_owners_umask() {
    for (umask, file, shared, d) in [("022", 0o755, 0o644, 0o755), ("002", 0o775, 0o664, 0o775)] {
        let dir = agent_set_modes();
        let out = apply_with_umask(dir.path(), umask);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The set-id file is skipped (exit 1), the rest applied.
        assert_eq!(code(&out), 1, "{stderr}");
        assert!(stderr.contains("set-id bits"), "{stderr}");
        let ws = dir.path().join("ws");
        assert_eq!(mode(&ws.join("run.sh")), file, "umask {umask}");
        assert_eq!(mode(&ws.join("shared.txt")), shared, "umask {umask}");
        assert_eq!(mode(&ws.join("d")), d, "umask {umask}");
        assert!(!ws.join("d/setuid").exists());
    }
}
