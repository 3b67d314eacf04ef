//! Issue 40: an unprivileged overlay run (native backend; bwrap has no
//! overlay) maps only the user's own uid and gid, so overlayfs cannot copy
//! up a file of another group (EOVERFLOW): the launcher names such files
//! before the command starts, and a failed command's "no changes" says
//! why. The user's own files change as ever, and `--workspace-mode direct`
//! (the advice given) changes the other group's file too.

use super::*;
use std::os::unix::fs::PermissionsExt;

const NOBODY: u32 = 65534;
/// A group nobody is not in, and another user (neither need exist).
const OTHER_GID: u32 = 4040;
const OTHER_UID: u32 = 4041;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// `ws` (nobody's) holding `own` (nobody's, 0644), `shared` and a file
    /// with a newline in its name (nobody's user, group 4040, 0666),
    /// `theirs` (user 4041, nobody's group, 0666); `tmp`
    /// (nobody's, 0700) for the layer; the worker's policy, limits
    /// best-effort (no cgroup needed).
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["ws", "tmp"] {
            std::fs::create_dir(root.join(sub)).unwrap();
            std::os::unix::fs::chown(root.join(sub), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o700)).unwrap();
        for (name, uid, gid, mode) in [
            ("own", NOBODY, NOBODY, 0o644),
            ("shared", NOBODY, OTHER_GID, 0o666),
            ("odd\nname", NOBODY, OTHER_GID, 0o666),
            ("theirs", OTHER_UID, NOBODY, 0o666),
        ] {
            let path = root.join("ws").join(name);
            std::fs::write(&path, "before\n").unwrap();
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::write(
            root.join("p.toml"),
            "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
        )
        .unwrap();
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `substrat-sandbox ARGS` as nobody (setpriv, no supplementary groups).
    fn as_nobody(&self, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent"])
            .arg(format!("TMPDIR={}", self.path("tmp").display()))
            .arg(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(args)
            .output()
            .unwrap()
    }

    /// `run --workspace ws [--workspace-mode overlay --keep-layer tmp/L]
    /// -- sh -c SCRIPT` as nobody, on the native backend.
    fn run(&self, overlay: bool, script: &str) -> Output {
        let policy = self.path("p.toml");
        let ws = self.path("ws");
        let layer = self.path("tmp/L");
        let git = self.path("tmp/git");
        let mut args = vec![
            "run",
            "--backend",
            "native",
            "--policy",
            policy.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--git-state",
            git.to_str().unwrap(),
        ];
        if overlay {
            args.extend([
                "--workspace-mode",
                "overlay",
                "--keep-layer",
                layer.to_str().unwrap(),
            ]);
        }
        args.extend(["--", "sh", "-c", script]);
        self.as_nobody(&args)
    }
}

fn skipped_unless_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return false;
    }
    println!("SKIPPED {test}: needs root to make another group's file and run as nobody");
    true
}

#[test]
fn an_unprivileged_overlay_run_names_the_files_of_a_group_it_cannot_map() {
    if skipped_unless_root("an_unprivileged_overlay_run_names_the_files_of_a_group_it_cannot_map") {
        return;
    }
    let f = Fixture::new();
    let out = f.run(true, "echo x >> theirs; echo x >> shared");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    // The command's own error, then the launcher's reason, one line each.
    assert!(stderr.contains("Value too large"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("file(s) of the workspace belong to"))
        .unwrap_or_else(|| panic!("no reason line: {stderr}"));
    assert!(
        line.starts_with("substrat-sandbox run: 3 file(s)"),
        "{line}"
    );
    assert!(
        line.contains(&format!("theirs: owner {OTHER_UID}")),
        "{line}"
    );
    assert!(line.contains(&format!("group {OTHER_GID}")), "{line}");
    assert!(line.contains("shared: group"), "{line}");
    assert!(line.contains("EOVERFLOW"), "{line}");
    // The newline of the odd name escaped: the line ends as it should.
    assert!(line.ends_with("`--workspace-mode direct`"), "{line}");
    // "no changes" not bare: the status and the reason.
    assert!(
        stderr.contains("no changes (the command exited with status 2; 3 file(s)"),
        "{stderr}"
    );
    for name in ["shared", "theirs"] {
        let text = std::fs::read_to_string(f.path("ws").join(name)).unwrap();
        assert_eq!(text, "before\n", "{name}");
    }

    // nobody's own file changes through the overlay as ever.
    let out = f.run(true, "echo x >> own");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(stderr.contains("1 path(s) changed"), "{stderr}");
    let layer = f.path("tmp/L");
    let diff = f.as_nobody(&["workspace", "diff", layer.to_str().unwrap()]);
    let patch = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(code(&diff), 0, "{}", String::from_utf8_lossy(&diff.stderr));
    assert!(patch.contains("+x"), "{patch}");
    assert!(!patch.contains("shared"), "{patch}");

    // The advice holds: a direct workspace changes the other group's file.
    let out = f.run(false, "echo x >> shared");
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(f.path("ws/shared")).unwrap(),
        "before\nx\n"
    );
}

#[test]
fn an_overlay_run_without_keep_layer_runs_in_a_private_scratch_layer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--backend", "native", "--policy"])
        .arg(dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .arg("--git-state")
        .arg(dir.path().join("git"))
        .args([
            "--workspace-mode",
            "overlay",
            "--",
            "sh",
            "-c",
            "echo x > y",
        ])
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(stderr.contains("discarded (no --keep-layer)"), "{stderr}");
    assert!(!dir.path().join("ws/y").exists());
}
