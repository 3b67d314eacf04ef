//! Issue 40: a tree the agent makes deeper than PATH_MAX (4096 bytes),
//! one `mkdir` and `cd` at a time inside its sandbox, is diffed, applied
//! and discarded on the host like any other: every walk goes by
//! directory descriptors.

use super::*;
use std::io::Read;

use rustix::fs::{Mode, OFlags};

/// 25 levels of a 200-byte name: about 5,000 bytes of path.
const LEVELS: usize = 25;

fn name() -> String {
    "d".repeat(200)
}

/// Makes the deep tree with a file `f` at its end (`cd` by relative
/// names: the shell's own idea of the full path may be too long).
fn script(text: &str) -> String {
    format!(
        "n={}; i=0; while [ $i -lt {LEVELS} ]; do mkdir $n && cd -P $n || exit 9; \
         i=$((i+1)); done; echo {text} > f",
        name()
    )
}

fn run(dir: &Path, layer: &Path, script: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--backend", "native", "--policy"])
        .arg(dir.join("p.toml"))
        .arg("--workspace")
        .arg(dir.join("ws"))
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(layer)
        .args(["--git-state"])
        .arg(dir.join("git"))
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(out), 0, "stderr: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The file at the end of the deep tree below `top`, read by descriptors.
fn read_deep(top: &Path) -> String {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let mut fd = rustix::fs::open(top, flags, Mode::empty()).unwrap();
    for _ in 0..LEVELS {
        fd = rustix::fs::openat(&fd, name().as_str(), flags, Mode::empty()).unwrap();
    }
    let fd = rustix::fs::openat(&fd, "f", OFlags::RDONLY, Mode::empty()).unwrap();
    let mut text = String::new();
    std::fs::File::from(fd).read_to_string(&mut text).unwrap();
    text
}

#[test]
fn a_tree_past_path_max_is_diffed_applied_and_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    let layer = dir.path().join("l");
    let layer_arg = layer.to_str().unwrap();
    ok(&run(dir.path(), &layer, &script("deep")));
    let stat = ok(&substrat(&["workspace", "diff", layer_arg, "--stat"]));
    assert!(
        stat.contains(&format!("{} paths changed, 1 insertion(+)", LEVELS + 1)),
        "{stat}"
    );
    let patch = ok(&substrat(&["workspace", "diff", layer_arg]));
    assert!(
        patch.contains("+deep\n"),
        "{}",
        &patch[patch.len().saturating_sub(300)..]
    );
    ok(&substrat(&["workspace", "apply", layer_arg]));
    assert_eq!(read_deep(&ws), "deep\n");

    // A second turn rewrites the deep file; discarded, the host keeps the
    // first's, and the layer has no turn left.
    ok(&run(
        dir.path(),
        &layer,
        &format!("rm -r {}; {}", name(), script("again")),
    ));
    assert!(ok(&substrat(&["workspace", "diff", layer_arg])).contains("+again\n"));
    ok(&substrat(&["workspace", "discard", layer_arg]));
    assert_eq!(ok(&substrat(&["workspace", "turns", layer_arg])), "");
    assert_eq!(read_deep(&ws), "deep\n");
}
