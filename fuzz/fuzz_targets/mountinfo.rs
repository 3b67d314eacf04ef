//! Arbitrary bytes as `/proc/self/mountinfo` (substrat-sandbox's
//! `mount_origin`, which says what a bind's source really is for
//! substrat-oci's judge). Invariants: parsing never panics and keeps only
//! lines with absolute, clean paths; the origins of a path below any
//! parsed mount are absolute, clean, end with that path's part below the
//! mount, and include the path itself when its mount shows its whole
//! filesystem and is that filesystem's only mount.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use substrat_sandbox::mount_origin::{origins, parse_mountinfo};

fn clean(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mounts = parse_mountinfo(text);
    for line in &mounts {
        assert!(clean(&line.root) && clean(&line.mount_point), "{line:?}");
        // The first line of an id is its (the kernel repeats none).
        let first = mounts.iter().find(|m| m.id == line.id).expect("its line");
        let reached = first.mount_point.join("x");
        let found = origins(&mounts, line.id, &reached);
        for origin in &found {
            assert!(clean(origin), "{origin:?}");
            assert!(origin.ends_with("x"), "{origin:?}");
        }
        let alone = mounts.iter().filter(|m| m.dev == first.dev).count() == 1;
        if alone && first.root == Path::new("/") {
            assert_eq!(found, [first.mount_point.join("x")]);
        }
        // A path outside its mount has no origin.
        if !Path::new("/").starts_with(&first.mount_point) {
            assert!(origins(&mounts, line.id, Path::new("/")).is_empty());
        }
    }
});
