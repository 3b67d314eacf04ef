//! The operator's host path grants checked as written (issue 44): an
//! `allow_host_paths` or `idmap_host_paths` entry was canonicalised at
//! each read, so whoever could write at or above it (an unprivileged user
//! pre-creating `/var/tmp/shared` as a link to `/`) made the grant `/`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Whether `path` exists, walked component by component without following
/// a link; an error (why) when a component is a link or lies in a
/// group- or world-writable directory (`others_may_change`).
pub fn check(path: &Path) -> Result<bool, String> {
    let mut at = PathBuf::from("/");
    let mut parent = std::fs::symlink_metadata(&at).map_err(|e| format!("/: {e}"))?;
    for component in path.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        let child = at.join(name);
        let meta = match std::fs::symlink_metadata(&child) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("{}: {e}", child.display())),
        };
        if meta.file_type().is_symlink() {
            return Err(format!(
                "{} holds a link ({}): a grant is taken as written, never through a link",
                path.display(),
                child.display()
            ));
        }
        if others_may_change(&parent, &meta) {
            return Err(format!(
                "{} lies in {}, which any user may change (and put a link there)",
                path.display(),
                at.display()
            ));
        }
        at = child;
        parent = meta;
    }
    Ok(true)
}

/// Whether any user may replace `child` in directory `dir`: the directory
/// is group- or world-writable without the sticky bit keeping root's
/// `child` root's (`/tmp`, `/var/tmp`, a 0777 directory). A directory of
/// one user's (a workspace in a home) is that user's alone: a link put
/// there fails `check`, and a grant matches the opened sources' real
/// paths, never what a link leads to.
fn others_may_change(dir: &std::fs::Metadata, child: &std::fs::Metadata) -> bool {
    let mode = dir.permissions().mode();
    let writable = mode & 0o022 != 0;
    let sticky = mode & 0o1000 != 0;
    writable && !(sticky && child.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attacker's grant_link.sh: nobody pre-creates a granted entry in
    /// a world-writable directory as a link to `/`.
    #[test]
    fn atk_a_link_or_a_place_others_may_change_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: the grants' directories are root's, as the node's");
            return;
        }
        let dir = tempfile::tempdir().expect("dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("real");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).expect("link");
        assert_eq!(check(&real), Ok(true));
        assert_eq!(check(&dir.path().join("nowhere")), Ok(false));
        let err = check(&link).expect_err("a link passed");
        assert!(err.contains("holds a link"), "{err}");
        let err = check(&link.join("etc")).expect_err("a link above passed");
        assert!(err.contains("holds a link"), "{err}");
        // A world-writable directory: an entry in it is anyone's to swap.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let err = check(&real).expect_err("a place in a 0777 directory passed");
        assert!(err.contains("may change"), "{err}");
        // Sticky (as /tmp): root's entry in it stays root's.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        assert_eq!(check(&real), Ok(true));
        nix::unistd::chown(&real, Some(65534.into()), None).expect("chown");
        let err = check(&real).expect_err("nobody's entry in a sticky directory passed");
        assert!(err.contains("may change"), "{err}");
    }
}
