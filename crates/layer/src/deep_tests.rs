//! Trees deeper than PATH_MAX (4096 bytes): an agent can make one in its
//! sandbox (one `mkdir` at a time, each relative to the last), and the
//! layer holding it must still be diffed, applied, sized, discarded and
//! rolled back on the host.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::apply::{ApplyOptions, apply};
use crate::changes::{ChangeKind, NodeKind, changes};
use crate::store::Layer;

/// Makes `names` nested below `top`, one level at a time from the last
/// directory's descriptor; the deepest directory's descriptor.
fn nest(top: &Path, names: &[String]) -> OwnedFd {
    let mut fd = rustix::fs::open(top, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for name in names {
        rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        fd = rustix::fs::openat(
            &fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    }
    fd
}

fn write_at(dir: &OwnedFd, name: &str, text: &str) {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    std::fs::File::from(fd).write_all(text.as_bytes()).unwrap();
}

/// Reads `names/file` below `top` by descriptors.
fn read_nested(top: &Path, names: &[String], file: &str) -> String {
    let mut fd = rustix::fs::open(top, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for name in names {
        fd = rustix::fs::openat(
            &fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    }
    let fd = rustix::fs::openat(&fd, file, OFlags::RDONLY, Mode::empty()).unwrap();
    let mut text = String::new();
    std::fs::File::from(fd).read_to_string(&mut text).unwrap();
    text
}

/// Twenty levels of 250-byte names: about 5,000 bytes of path.
fn long_names() -> Vec<String> {
    (0..20)
        .map(|i| format!("{i:02}{}", "n".repeat(248)))
        .collect()
}

/// A scratch directory in memory when there is a tmpfs (thousands of
/// directories made and removed on a disk wait on its journal).
fn scratch() -> tempfile::TempDir {
    match tempfile::tempdir_in("/dev/shm") {
        Ok(dir) => dir,
        Err(_) => tempfile::tempdir().unwrap(),
    }
}

fn workspace_and_layer() -> (tempfile::TempDir, PathBuf, Layer) {
    let dir = scratch();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("kept"), "k\n").unwrap();
    let layer = Layer::open_or_create(&dir.path().join("layer"), &ws).unwrap();
    (dir, ws, layer)
}

/// A tree past PATH_MAX is scanned when its turn ends, listed, diffed,
/// sized and applied (its file's bytes right), then leaves the layer.
#[test]
fn a_tree_past_path_max_is_diffed_sized_and_applied() {
    let (_dir, ws, layer) = workspace_and_layer();
    let lock = layer.lock().unwrap();
    let turn = layer.begin_turn(&lock).unwrap();
    let names = long_names();
    let deepest = nest(&turn.upper, &names);
    write_at(&deepest, "f", "deep\n");
    drop(deepest);
    layer.finish_turn(&turn, &lock).unwrap();
    assert!(layer.size().unwrap() > 0);

    let found = changes(&layer).unwrap();
    assert_eq!(found.len(), 21);
    assert!(found.iter().all(|c| c.kind == ChangeKind::Added));
    let file = found.last().unwrap();
    assert!(file.path.as_os_str().len() > 4096);
    assert!(file.path.ends_with("f"));
    let patch = crate::diff::unified(&layer, &found).unwrap();
    assert!(patch.contains("+deep\n"), "{}", &patch[patch.len() - 200..]);
    let stat = crate::diff::stat(&layer, &found).unwrap();
    assert!(stat.contains("21 paths changed, 1 insertion(+)"), "{stat}");

    let report = apply(&layer, &lock, &found, ApplyOptions::default(), &[]).unwrap();
    assert_eq!(report.applied.len(), 21, "{report:?}");
    assert_eq!(read_nested(&ws, &names, "f"), "deep\n");
    assert!(changes(&layer).unwrap().is_empty());
}

/// A chain of 2,100 directories named `a` with a file at its end, and a
/// second turn of long names with a directory left mode 000 inside:
/// rollback removes the second turn, discard the first.
#[test]
fn a_tree_past_path_max_is_rolled_back_and_discarded() {
    let (_dir, _ws, layer) = workspace_and_layer();
    let lock = layer.lock().unwrap();
    let first = layer.begin_turn(&lock).unwrap();
    let chain: Vec<String> = (0..2100).map(|_| "a".to_string()).collect();
    write_at(&nest(&first.upper, &chain), "f", "chain\n");
    layer.finish_turn(&first, &lock).unwrap();
    let second = layer.begin_turn(&lock).unwrap();
    let deepest = nest(&second.upper, &long_names());
    rustix::fs::mkdirat(&deepest, "locked", Mode::from_raw_mode(0o755)).unwrap();
    let locked = rustix::fs::openat(
        &deepest,
        "locked",
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    write_at(&locked, "inside", "x\n");
    drop(deepest);
    layer.finish_turn(&second, &lock).unwrap();
    assert_eq!(layer.turns().unwrap(), vec![1, 2]);
    // The chain is reviewed to REVIEW_DEPTH levels, the last one listed as
    // a tree too deep (never applied): memory stays bounded.
    let all = changes(&layer).unwrap();
    assert_eq!(all.len(), crate::scan::REVIEW_DEPTH + 22);
    let deep = all
        .iter()
        .find(|c| c.path.components().count() == crate::scan::REVIEW_DEPTH)
        .unwrap();
    assert!(
        matches!(&deep.layer.as_ref().unwrap().kind, NodeKind::Special { what } if what.contains("deeper than a review goes")),
        "{deep:?}"
    );
    assert!(crate::apply::refusal(deep).is_some());
    // Unreadable to its owner, but removed all the same.
    rustix::fs::fchmod(&locked, Mode::empty()).unwrap();
    drop(locked);

    assert_eq!(layer.rollback(2, &lock).unwrap(), vec![2]);
    assert!(!second.upper.exists());
    assert_eq!(changes(&layer).unwrap().len(), crate::scan::REVIEW_DEPTH);
    assert_eq!(layer.discard(&lock).unwrap(), vec![1]);
    assert!(!first.upper.exists());
    assert_eq!(layer.size().unwrap(), 0);
}

/// Ten thousand levels, walked on a thread with an ordinary 2 MiB stack:
/// every walk is iterative, holding a bounded number of descriptors.
#[test]
fn ten_thousand_levels_fit_a_small_stack() {
    let (_dir, _ws, layer) = workspace_and_layer();
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let lock = layer.lock().unwrap();
            let turn = layer.begin_turn(&lock).unwrap();
            let chain: Vec<String> = (0..10_000).map(|_| "a".to_string()).collect();
            write_at(&nest(&turn.upper, &chain), "f", "far\n");
            layer.finish_turn(&turn, &lock).unwrap();
            assert!(layer.size().unwrap() > 0);
            assert_eq!(layer.discard(&lock).unwrap(), vec![1]);
            assert!(!turn.upper.exists());
        })
        .unwrap();
    worker.join().unwrap();
}

/// Removal never follows a link, and unlinks a whole tree whatever modes
/// the agent left on it.
#[test]
fn removal_follows_no_link() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "k\n").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("d/e")).unwrap();
    std::os::unix::fs::symlink(&outside, tree.join("d/link")).unwrap();
    rustix::fs::chmod(tree.join("d"), Mode::from_raw_mode(0o500)).unwrap();
    crate::remove::remove_tree(&tree).unwrap();
    assert!(!tree.exists());
    assert!(outside.join("keep").exists());
    // Not there: nothing to do.
    crate::remove::remove_tree(&tree).unwrap();
}

/// The content digest reads what a file holds, not what it claims: a
/// terabyte of holes costs nothing, and zeros written or left as holes
/// digest the same.
#[test]
fn a_sparse_terabyte_digests_at_once_and_holes_equal_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let digest_of = |name: &str| {
        let path = dir.path().join(name);
        crate::host::digest(std::fs::File::open(&path).unwrap(), &path).unwrap()
    };
    let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
    sparse.set_len(1 << 40).unwrap();
    // Reading it whole would take hours: this returns at once.
    let huge = digest_of("sparse");

    let mut holes = std::fs::File::create(dir.path().join("holes")).unwrap();
    holes.set_len(300_000).unwrap();
    use std::io::{Seek, SeekFrom};
    holes.seek(SeekFrom::Start(200_000)).unwrap();
    holes.write_all(b"data").unwrap();
    let mut written = vec![0u8; 300_000];
    written[200_000..200_004].copy_from_slice(b"data");
    std::fs::write(dir.path().join("written"), &written).unwrap();
    assert_eq!(digest_of("holes"), digest_of("written"));
    written[5] = 1;
    std::fs::write(dir.path().join("other"), &written).unwrap();
    assert_ne!(digest_of("other"), digest_of("written"));
    assert_ne!(huge, digest_of("written"));
}
