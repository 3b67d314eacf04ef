//! Issue 40: where `--keep-layer` may be (judged after resolving `..` and
//! links, from the directory the command is given in), and what a launch
//! that fails leaves of its layer.

use super::*;

/// A workspace `ws`, a link `link -> ws` beside it, and the worker's policy
/// (limits best-effort, so no cgroup is needed).
fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws/sub")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("ws"), dir.path().join("link")).unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    dir
}

/// `run --workspace-mode overlay --keep-layer LAYER -- ARGS`, started in
/// the workspace (its default).
fn run_in_ws(dir: &Path, layer: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .current_dir(dir.join("ws"))
        .args(["run", "--policy"])
        .arg(dir.join("p.toml"))
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(layer)
        .arg("--git-state")
        .arg(dir.join("git"))
        .arg("--")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_relative_keep_layer_outside_the_workspace_is_accepted() {
    let dir = fixture();
    let out = run_in_ws(dir.path(), Path::new("../L"), &["sh", "-c", "echo x > y"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(dir.path().join("L/layer.json").is_file(), "{stderr}");
    assert!(!dir.path().join("ws/y").exists());
    assert!(stderr.contains("1 path(s) changed"), "{stderr}");
}

#[test]
fn a_keep_layer_that_resolves_inside_the_workspace_is_refused() {
    let dir = fixture();
    let through_link = dir.path().join("link/L1");
    let through_dots = Path::new("sub/../L2");
    let through_both = dir.path().join("link/sub/../L3");
    for layer in [through_link.as_path(), through_dots, through_both.as_path()] {
        let out = run_in_ws(dir.path(), layer, &["true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{}: {stderr}", layer.display());
        assert!(stderr.contains("is inside the workspace"), "{stderr}");
    }
    for name in ["L1", "L2", "L3"] {
        assert!(!dir.path().join("ws").join(name).exists(), "{name} made");
    }
}

#[test]
fn a_command_not_found_leaves_no_layer_and_no_no_changes_line() {
    let dir = fixture();
    let out = run_in_ws(
        dir.path(),
        &dir.path().join("new/L"),
        &["no-such-command-40"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 127, "{stderr}");
    assert!(!stderr.contains("no changes"), "{stderr}");
    assert!(!dir.path().join("new").exists(), "{stderr}");
    // An empty directory given is left empty.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    std::fs::set_permissions(
        dir.path().join("empty"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = run_in_ws(
        dir.path(),
        &dir.path().join("empty"),
        &["no-such-command-40"],
    );
    assert_eq!(code(&out), 127);
    let left: Vec<_> = std::fs::read_dir(dir.path().join("empty"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_failed_launch_over_an_existing_layer_leaves_it_as_it_was() {
    let dir = fixture();
    let layer = dir.path().join("L");
    let out = run_in_ws(dir.path(), &layer, &["sh", "-c", "echo x > y"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let before = tree(&layer);
    let out = run_in_ws(dir.path(), &layer, &["no-such-command-40"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 127, "{stderr}");
    // Not a turn: nothing said of the layer (it held 1 path before).
    assert!(!stderr.contains("workspace layer"), "{stderr}");
    assert_eq!(tree(&layer), before);
}

#[test]
fn a_sandbox_refused_before_its_launch_leaves_no_layer() {
    let dir = fixture();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n\
         [namespaces]\npid = false\n",
    )
    .unwrap();
    let out = run_in_ws(dir.path(), &dir.path().join("L"), &["true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code(&out), 0, "{stderr}");
    assert!(stderr.contains("needs the pid namespace"), "{stderr}");
    assert!(!dir.path().join("L").exists(), "{stderr}");
}

/// Every path below `dir` with its size, sorted.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut all = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            }
            all.push((e.path(), if meta.is_dir() { 0 } else { meta.len() }));
        }
    }
    all.sort();
    all
}
