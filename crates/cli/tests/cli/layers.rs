//! Workspace layers (`run --workspace-mode overlay`, `workspace ...`):
//! the real launcher writes a real overlay; the host tree is checked
//! untouched, then diffed, applied, rolled back and discarded.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// A workspace with a few files, a policy (the worker's, limits
/// best-effort so no cgroup is needed) and a place for layers.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("src")).unwrap();
        std::fs::create_dir_all(ws.join("gone")).unwrap();
        std::fs::write(ws.join("src/a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(ws.join("gone/x"), "bye\n").unwrap();
        std::fs::write(ws.join("old.txt"), "moved content\n").unwrap();
        std::fs::write(ws.join("run.sh"), "echo hi\n").unwrap();
        std::fs::write(
            dir.path().join("p.toml"),
            "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
        )
        .unwrap();
        Fixture { dir }
    }

    pub(crate) fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    pub(crate) fn layer(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `run --workspace-mode overlay --keep-layer LAYER -- sh -c SCRIPT`.
    pub(crate) fn run(&self, layer: &str, backend: &str, script: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
            .args(["run", "--backend", backend, "--policy"])
            .arg(self.dir.path().join("p.toml"))
            .arg("--workspace")
            .arg(self.ws())
            .args(["--workspace-mode", "overlay", "--keep-layer"])
            .arg(self.layer(layer))
            .args(["--git-state"])
            .arg(self.dir.path().join("git"))
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    }

    pub(crate) fn workspace(&self, args: &[&str], layer: &str) -> Output {
        let mut all: Vec<&str> = vec!["workspace", args[0]];
        let layer = self.layer(layer);
        all.push(layer.to_str().unwrap());
        all.extend(&args[1..]);
        substrat(&all)
    }

    /// `workspace apply ARGS` as a person does it: `diff` first (apply
    /// writes only what a diff showed).
    pub(crate) fn apply_reviewed(&self, args: &[&str], layer: &str) -> Output {
        ok(&self.workspace(&["diff", "--json"], layer));
        let mut all = vec!["apply"];
        all.extend(args);
        self.workspace(&all, layer)
    }

    pub(crate) fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.ws().join(rel)).unwrap()
    }
}

pub(crate) fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(out), 0, "stderr: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const EDITS: &str = "echo four >> src/a.txt; echo new > new.txt; rm -r gone; \
    mv old.txt renamed.txt; ln -s src/a.txt link; chmod +x run.sh";

#[test]
fn an_overlay_run_leaves_the_host_tree_and_its_diff_is_every_kind() {
    let f = Fixture::new();
    let out = f.run("l", "native", &format!("{EDITS}; cat src/a.txt"));
    assert_eq!(
        ok(&out),
        "one\ntwo\nthree\nfour\n",
        "the command sees its writes"
    );
    // The host tree is as it was.
    assert_eq!(f.read("src/a.txt"), "one\ntwo\nthree\n");
    assert!(f.ws().join("gone/x").exists() && f.ws().join("old.txt").exists());
    assert!(!f.ws().join("new.txt").exists() && !f.ws().join("link").exists());
    assert_eq!(
        std::fs::metadata(f.ws().join("run.sh")).unwrap().mode() & 0o111,
        0
    );

    let stat = without_digest(&ok(&f.workspace(&["diff", "--stat"], "l")));
    let expected = "\
D gone (directory 755)
D gone/x (file 644) +0 -1
A link (symlink to src/a.txt) +1 -0
A new.txt (file 644) +1 -0
R old.txt -> renamed.txt (file 644) +0 -0
m run.sh (mode 644 -> 755)
M src/a.txt (file 644) +1 -0
7 paths changed, 3 insertions(+), 1 deletion(-)
";
    assert_eq!(stat, expected);
    let json = stdout_json(&f.workspace(&["diff", "--json"], "l"));
    let kinds: Vec<(String, String)> = json["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("renamed.txt".into(), "renamed".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("run.sh".into(), "mode-changed".into())),
        "{kinds:?}"
    );

    // The patch is git's: `git apply` makes a copy of the host tree equal
    // to what `workspace apply` makes of the tree itself.
    let patch = ok(&f.workspace(&["diff"], "l"));
    let copy = f.dir.path().join("copy");
    assert!(
        Command::new("cp")
            .args(["-a"])
            .arg(f.ws())
            .arg(&copy)
            .status()
            .unwrap()
            .success()
    );
    let patch_file = f.dir.path().join("p.diff");
    std::fs::write(&patch_file, &patch).unwrap();
    let git = Command::new("git")
        .args(["apply", "--verbose"])
        .arg(&patch_file)
        .current_dir(&copy)
        .output()
        .unwrap();
    assert!(
        git.status.success(),
        "git apply: {}\n{patch}",
        String::from_utf8_lossy(&git.stderr)
    );

    let applied = ok(&f.apply_reviewed(&[], "l"));
    assert_eq!(applied, "applied 8 path(s)\n");
    assert_eq!(f.read("src/a.txt"), "one\ntwo\nthree\nfour\n");
    assert_eq!(f.read("renamed.txt"), "moved content\n");
    assert!(!f.ws().join("old.txt").exists() && !f.ws().join("gone").exists());
    assert_eq!(
        std::fs::read_link(f.ws().join("link")).unwrap(),
        Path::new("src/a.txt")
    );
    assert_eq!(
        std::fs::metadata(f.ws().join("run.sh")).unwrap().mode() & 0o777,
        0o755
    );
    for rel in ["src/a.txt", "renamed.txt", "new.txt", "link", "run.sh"] {
        let git_side = std::fs::symlink_metadata(copy.join(rel)).unwrap();
        let ours = std::fs::symlink_metadata(f.ws().join(rel)).unwrap();
        assert_eq!(git_side.mode(), ours.mode(), "{rel}");
    }
    // Nothing is left to apply, and the layer holds nothing.
    assert_eq!(
        without_digest(&ok(&f.workspace(&["diff", "--stat"], "l"))),
        "0 paths changed, 0 insertions(+), 0 deletions(-)\n"
    );
}

/// Names git quotes, a lone carriage return and a mode git cannot say: the
/// patch is still one `git apply` takes whole, and means what apply does.
#[test]
fn the_patch_quotes_names_as_git_reads_them() {
    let f = Fixture::new();
    std::fs::write(f.ws().join("priv.txt"), "p\n").unwrap();
    let out = f.run(
        "l",
        "native",
        "printf 'x\\n' > café.txt; printf 'one\\rtwo\\n' > cr.txt; chmod 600 priv.txt",
    );
    ok(&out);
    let patch = ok(&f.workspace(&["diff"], "l"));
    assert!(
        patch.contains("diff --git \"a/caf\\303\\251.txt\" \"b/caf\\303\\251.txt\""),
        "{patch}"
    );
    assert!(patch.contains("# cr.txt: binary"), "{patch}");
    assert!(patch.contains("# priv.txt: mode changed"), "{patch}");
    let copy = f.dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::write(copy.join("priv.txt"), "p\n").unwrap();
    let patch_file = f.dir.path().join("p.diff");
    std::fs::write(&patch_file, &patch).unwrap();
    let git = Command::new("git")
        .args(["apply", "--verbose"])
        .arg(&patch_file)
        .current_dir(&copy)
        .output()
        .unwrap();
    assert!(
        git.status.success(),
        "{}\n{patch}",
        String::from_utf8_lossy(&git.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(copy.join("café.txt")).unwrap(),
        "x\n"
    );
}

#[test]
fn apply_skips_what_host_tools_would_act_on() {
    let f = Fixture::new();
    // On the host before the run: a setgid group directory (what is made
    // below it inherits the bit).
    std::fs::create_dir_all(f.ws().join("shared")).unwrap();
    std::fs::set_permissions(
        f.ws().join("shared"),
        std::fs::Permissions::from_mode(0o2775),
    )
    .unwrap();
    let long = "n".repeat(250);
    let out = f.run(
        "l",
        "native",
        "mkfifo pipe; ln -s /etc/passwd out; ln -s ../../x up; mkdir -p sub/.git/hooks; \
         echo evil > sub/.git/hooks/post-checkout; echo '[core]' > sub/.git/config; echo fine > fine.txt; \
         mkdir -p bare/objects bare/refs; echo 'ref: refs/heads/main' > bare/HEAD; \
         printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > bare/config; \
         mkdir wt; echo 'gitdir: /etc' > wt/.git; mkdir -p .GIT; echo x > .GIT/commondir; \
         mkdir -p ro/objects ro/refs; echo 'ref: refs/heads/main' > ro/HEAD; \
         touch ro/HEAD.substrat-quarantine; chmod 555 ro; ln -s . a; ln -s a/a/../../../etc/passwd chained; \
         mkdir -p hostbare/hooks; echo evil > hostbare/hooks/post-update; ln -s sub/.git/hooks hooks; \
         mkdir -p shared/newdir; echo ok > shared/newdir/file; echo long > LONGNAME"
            .replace("LONGNAME", &long)
            .as_str(),
    );
    ok(&out);
    // A set-id file, as a kernel that let the command make one would leave
    // it (seccomp refuses the chmod inside: the escape suite checks that).
    let upper = f.layer("l").join("turns/1/upper");
    std::fs::write(upper.join("setid"), "x").unwrap();
    std::fs::set_permissions(upper.join("setid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    // A device node, as root could leave one in the layer directory.
    let device = nix::sys::stat::mknod(
        &upper.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .is_ok();
    if !device {
        println!(
            "SKIPPED the device-node part of apply_skips_what_host_tools_would_act_on: mknod needs CAP_MKNOD"
        );
    }

    let stat = ok(&f.workspace(&["diff", "--stat"], "l"));
    // The special files are listed in JSON too (not a crash).
    let json: serde_json::Value =
        serde_json::from_str(&ok(&f.workspace(&["diff", "--json"], "l"))).unwrap();
    assert!(json["changes"].to_string().contains("a FIFO"), "{json}");
    for (path, why) in [
        ("pipe", "a FIFO"),
        ("out", "a symlink that points outside the workspace"),
        ("up", "a symlink that points outside the workspace"),
        ("chained", "a symlink that points outside the workspace"),
        ("hooks", "a symlink into git metadata"),
        ("sub/.git/config", "git metadata"),
        ("sub/.git/hooks/post-checkout", "git metadata"),
        ("setid", "set-id bits"),
        ("wt/.git", "git metadata"),
        (".GIT/commondir", "git metadata"),
    ]
    .into_iter()
    .chain(device.then_some(("null", "a device node")))
    {
        let line = stat
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(path))
            .unwrap_or_else(|| panic!("{path}: {stat}"));
        assert!(line.contains(&format!("[not applied: {why}")), "{line}");
    }
    // The host makes `hostbare` a bare repository after the run (one there
    // before would have been bound read-only whole).
    for dir in ["hostbare/objects", "hostbare/refs"] {
        std::fs::create_dir_all(f.ws().join(dir)).unwrap();
    }
    std::fs::write(f.ws().join("hostbare/HEAD"), "ref: refs/heads/main\n").unwrap();
    let out = f.apply_reviewed(&["--force"], "l");
    assert_eq!(
        code(&out),
        1,
        "skipped paths make apply exit 1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped setid: set-id bits"), "{stderr}");
    // Below a bare repository of the host's (known to apply, which lists
    // the workspace's repositories first).
    assert!(
        stderr.contains("skipped hostbare/hooks/post-update: inside a bare git repository"),
        "{stderr}"
    );
    assert_eq!(f.read("fine.txt"), "fine\n");
    // Below a setgid directory, and a name of 250 bytes: applied.
    assert_eq!(f.read("shared/newdir/file"), "ok\n");
    assert_eq!(f.read(&long), "long\n");
    // A bare repository is made of names apply takes: applied, then made
    // inert like one a direct run leaves (its HEAD renamed), and said.
    assert!(stderr.contains("made a git repository"), "{stderr}");
    assert!(!f.ws().join("bare/HEAD").exists());
    assert!(f.ws().join("bare/HEAD.substrat-quarantine").exists());
    // One whose quarantine name is taken and whose directory is read-only
    // is made inert all the same (a random name, write permission back).
    assert!(!f.ws().join("ro/HEAD").exists());
    let aside = std::fs::read_dir(f.ws().join("ro"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("HEAD.substrat-quarantine-"))
        .count();
    assert_eq!(aside, 1);
    for gone in [
        "pipe",
        "out",
        "up",
        "sub/.git",
        "setid",
        "wt/.git",
        ".GIT",
        "null",
        "chained",
        "hooks",
        "hostbare/hooks",
    ] {
        assert!(
            std::fs::symlink_metadata(f.ws().join(gone)).is_err(),
            "{gone} was applied"
        );
    }
}

#[test]
fn a_host_change_since_the_base_stops_apply_until_forced() {
    let f = Fixture::new();
    ok(&f.run("l", "native", "echo agent >> src/a.txt; echo x > other.txt"));
    // The person edits the same file meanwhile.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(f.ws().join("src/a.txt"), "person\n").unwrap();
    let out = f.apply_reviewed(&[], "l");
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("src/a.txt: changed on the host since the agent's base"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing applied"), "{stderr}");
    assert_eq!(f.read("src/a.txt"), "person\n");
    assert!(
        !f.ws().join("other.txt").exists(),
        "nothing at all was applied"
    );
    // The paths that do not conflict can be taken alone.
    assert_eq!(
        ok(&f.apply_reviewed(&["./other.txt"], "l")),
        "applied 1 path(s)\n"
    );
    assert_eq!(f.read("other.txt"), "x\n");
    // --force takes the agent's side.
    ok(&f.apply_reviewed(&["--force"], "l"));
    assert_eq!(f.read("src/a.txt"), "one\ntwo\nthree\nagent\n");
}

#[test]
fn rollback_undoes_one_turn_among_three() {
    let f = Fixture::new();
    for turn in 1..=3 {
        ok(&f.run("l", "native", &format!("echo turn{turn} >> log.txt")));
    }
    assert_eq!(ok(&f.workspace(&["turns"], "l")), "1\n2\n3\n");
    let out = f.workspace(&["rollback", "--turn", "5"], "l");
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no turn 5"));
    ok(&f.workspace(&["rollback", "--turn", "3"], "l"));
    assert_eq!(ok(&f.workspace(&["turns"], "l")), "1\n2\n");
    let seen = ok(&f.run("l", "native", "cat log.txt"));
    assert_eq!(seen, "turn1\nturn2\n");
    ok(&f.workspace(&["discard"], "l"));
    assert_eq!(ok(&f.workspace(&["turns"], "l")), "");
    assert!(!f.ws().join("log.txt").exists());
}

#[test]
fn two_layers_on_one_workspace_see_only_their_own_changes() {
    let f = Fixture::new();
    ok(&f.run("a", "native", "echo a > mine.txt; echo a >> src/a.txt"));
    ok(&f.run("b", "native", "echo b > mine.txt; rm src/a.txt"));
    assert_eq!(
        ok(&f.run("a", "native", "cat mine.txt; cat src/a.txt")),
        "a\none\ntwo\nthree\na\n"
    );
    assert_eq!(
        ok(&f.run(
            "b",
            "native",
            "cat mine.txt; test -e src/a.txt || echo gone"
        )),
        "b\ngone\n"
    );
    // a applied first; b's change to the same file is then a conflict.
    ok(&f.apply_reviewed(&[], "a"));
    let out = f.apply_reviewed(&[], "b");
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("mine.txt: changed on the host since the agent's base"),
        "{stderr}"
    );
    assert!(
        stderr.contains("src/a.txt: changed on the host since the agent's base"),
        "{stderr}"
    );
    // b now sees a's applied file through its own layer's changes only.
    assert_eq!(ok(&f.run("b", "native", "cat mine.txt")), "b\n");
}

#[test]
fn the_bwrap_backend_refuses_an_overlay_with_the_reason() {
    if !bwrap_on_path() {
        eprintln!(
            "SKIPPED the_bwrap_backend_refuses_an_overlay_with_the_reason: bwrap is not on PATH"
        );
        return;
    }
    let f = Fixture::new();
    let out = f.run("l", "bwrap", "echo x > y");
    assert_ne!(code(&out), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bubblewrap 0.8 has no overlay mount"),
        "{stderr}"
    );
    assert!(!f.ws().join("y").exists());
}

#[test]
fn a_layer_inside_the_workspace_or_for_another_workspace_is_refused() {
    let f = Fixture::new();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy"])
        .arg(f.dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(f.ws())
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(f.ws().join("layer"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is inside the workspace"));
    ok(&f.run("l", "native", "true"));
    let other = f.dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy"])
        .arg(f.dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(&other)
        .args(["--workspace-mode", "overlay", "--keep-layer"])
        .arg(f.layer("l"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("was made for workspace"));
}

#[test]
fn a_kill_during_apply_leaves_each_file_before_or_after_never_torn() {
    let f = Fixture::new();
    const FILES: usize = 1500;
    const LINKS: usize = 100;
    for i in 0..FILES {
        std::fs::write(f.ws().join(format!("f{i}")), "old\n").unwrap();
    }
    // Files that become symlinks: replaced by a rename, never deleted first.
    for i in 0..LINKS {
        std::fs::write(f.ws().join(format!("s{i}")), "old\n").unwrap();
    }
    ok(&f.run(
        "l",
        "native",
        &format!(
            "i=0; while [ $i -lt {FILES} ]; do yes $i | head -c 65536 > f$i; i=$((i+1)); done; \
             i=0; while [ $i -lt {LINKS} ]; do rm s$i; ln -s f0 s$i; i=$((i+1)); done"
        ),
    ));
    let new_content = |i: usize| format!("{i}\n").repeat(65536).into_bytes()[..65536].to_vec();
    // Reviewed (as JSON: line counts of thousands of rewritten files are
    // not what this test is about).
    ok(&f.workspace(&["diff", "--json"], "l"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["workspace", "apply"])
        .arg(f.layer("l"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once some files are in place, not all.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let applied = (0..FILES)
            .filter(|i| {
                std::fs::metadata(f.ws().join(format!("f{i}")))
                    .unwrap()
                    .len()
                    > 4
            })
            .count();
        if applied > 0 || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let (mut before, mut after) = (0, 0);
    for i in 0..FILES {
        let bytes = std::fs::read(f.ws().join(format!("f{i}"))).unwrap();
        if bytes == b"old\n" {
            before += 1;
        } else {
            assert_eq!(bytes, new_content(i), "f{i} is torn");
            after += 1;
        }
    }
    for i in 0..LINKS {
        let path = f.ws().join(format!("s{i}"));
        match std::fs::read_link(&path) {
            Ok(target) => assert_eq!(target, Path::new("f0")),
            Err(_) => assert_eq!(std::fs::read(&path).unwrap(), b"old\n", "s{i}"),
        }
    }
    assert!(
        after > 0 && before > 0,
        "the kill landed mid-apply: {after} applied, {before} not"
    );
    // Only whole files: any other name is the instant between link and rename.
    for entry in std::fs::read_dir(f.ws()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            name.starts_with('f')
                || name.starts_with('s')
                || ["src", "gone", "old.txt", "run.sh"].contains(&name.as_str())
                || name.contains(".substrat-apply-"),
            "unexpected {name}"
        );
    }
    // A second apply finishes the job (applied files are no change now).
    ok(&f.apply_reviewed(&[], "l"));
    for i in 0..FILES {
        assert_eq!(
            std::fs::read(f.ws().join(format!("f{i}"))).unwrap(),
            new_content(i)
        );
    }
    for i in 0..LINKS {
        assert_eq!(
            std::fs::read_link(f.ws().join(format!("s{i}"))).unwrap(),
            Path::new("f0")
        );
    }
}

#[test]
fn a_layer_quota_fails_writes_with_enospc_and_keeps_what_fit() {
    let f = Fixture::new();
    std::fs::write(
        f.dir.path().join("p.toml"),
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n\
         [filesystem]\nworkspace_mode = \"overlay\"\nlayer_quota = \"64KiB\"\n",
    )
    .unwrap();
    // --workspace-mode is the policy's: run without the flag.
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy"])
        .arg(f.dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(f.ws())
        .arg("--keep-layer")
        .arg(f.layer("l"))
        .args(["--", "sh", "-c"])
        .arg(
            "echo small > small.txt; rm run.sh; mkdir -p d/e; mkfifo d/e/p; \
             head -c 100000 /dev/zero > big 2> $HOME/err; echo big=$?; grep -c 'No space left on device' $HOME/err; \
             truncate -s 1G sparse; echo elsewhere > $HOME/x && cat $HOME/x",
        )
        .output()
        .unwrap();
    let stdout = ok(&out);
    assert_eq!(
        stdout, "big=1\n1\nelsewhere\n",
        "ENOSPC in the layer, the home unaffected"
    );
    // What fit was kept: the file, the deletion, the FIFO; the big file up
    // to the quota.
    let stat = ok(&f.workspace(&["diff", "--stat"], "l"));
    for line in [
        "A small.txt",
        "D run.sh",
        "A d/e/p (a FIFO)",
        "A big (file 644)",
    ] {
        assert!(stat.contains(line), "{line}: {stat}");
    }
    let big = f.layer("l").join("turns/1/upper/big");
    let kept = std::fs::metadata(&big).unwrap().len();
    assert!(kept > 0 && kept <= 64 * 1024, "{kept}");
    // A sparse file costs the quota nothing, and stays sparse when kept:
    // the host's disk is not filled with its zeros.
    let sparse = std::fs::metadata(f.layer("l").join("turns/1/upper/sparse")).unwrap();
    assert_eq!(sparse.len(), 1 << 30);
    assert!(sparse.blocks() * 512 <= 64 * 1024, "{}", sparse.blocks());
    // The next turn has what is left of the quota: none, but a page.
    let out = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--policy"])
        .arg(f.dir.path().join("p.toml"))
        .arg("--workspace")
        .arg(f.ws())
        .arg("--keep-layer")
        .arg(f.layer("l"))
        .args([
            "--",
            "sh",
            "-c",
            "head -c 20000 /dev/zero > more 2>/dev/null; echo $?; cat small.txt",
        ])
        .output()
        .unwrap();
    assert_eq!(ok(&out), "1\nsmall\n");
    assert!(
        !f.ws().join("small.txt").exists(),
        "the host tree is untouched"
    );
}

#[test]
fn the_agent_commits_in_its_own_git_dir_and_diff_shows_the_range() {
    let f = Fixture::new();
    git_in(&f.ws(), &["init", "-q"]);
    git_in(&f.ws(), &["add", "-A"]);
    git_in(&f.ws(), &["commit", "-qm", "base"]);
    let base = git_in(&f.ws(), &["rev-parse", "HEAD"]);
    ok(&f.run(
        "l",
        "native",
        "echo four >> src/a.txt && git -c user.name=a -c user.email=a@a commit -qam agent-work",
    ));
    let diff = stdout_json(&f.workspace(&["diff", "--json"], "l"));
    assert_eq!(diff["commits"]["base"], base, "{diff}");
    let head = diff["commits"]["head"].as_str().unwrap().to_string();
    assert_ne!(head, base);
    let paths: Vec<&str> = diff["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["src/a.txt"],
        "the commit is in the agent's git dir, not the layer"
    );
    // The host takes the commit with git fetch (nothing of the agent's runs).
    let repo = diff["commits"]["repo"].as_str().unwrap().to_string();
    git_in(&f.ws(), &["fetch", "-q", &repo, "HEAD"]);
    assert_eq!(
        git_in(
            &f.ws(),
            &["log", "--format=%s", &format!("{base}..FETCH_HEAD")]
        ),
        "agent-work"
    );
    let patch = without_digest(&ok(&f.workspace(&["diff"], "l")));
    assert!(
        patch.starts_with(&format!("# commits: {base}..{head} in {repo}")),
        "{patch}"
    );
}

/// `diff` output without its digest line (checked in layer_review).
fn without_digest(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("digest ") && !l.starts_with("# digest "))
        .map(|l| format!("{l}\n"))
        .collect()
}
