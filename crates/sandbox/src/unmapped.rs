//! What an unprivileged overlay workspace cannot change. Launched by an
//! unprivileged user, the sandbox's user namespace maps that user's uid
//! and gid only (one-id maps need no helper). Through an overlay, a write
//! to a file first copies it up into the layer, keeping its owner and
//! group; overlayfs refuses a copy-up whose owner or group is not mapped
//! in the namespace (EOVERFLOW, "Value too large for defined data type").
//! So a file of a shared group the user may write on the host (or one
//! writable by all, or one of the user's own with another group) cannot be
//! changed through the overlay, nor anything made in a directory like it.
//!
//! Mapping those groups would take `newgidmap` and subordinate ranges
//! (`/etc/subgid`) naming them, which the native backend does not use
//! (yet): instead the launcher finds such entries before the launch, with
//! a bounded walk, and says so.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How many entries a scan looks at, at most (the rest are not judged).
pub const SCAN_LIMIT: usize = 20_000;

/// How many examples a scan keeps.
const EXAMPLES: usize = 3;

/// The host ids the sandbox maps, and the launcher's groups (which decide
/// what it may write on the host).
#[derive(Debug, Clone)]
pub struct LauncherIds {
    /// The one uid mapped (outside).
    pub uid: u32,
    /// The one gid mapped (outside).
    pub gid: u32,
    /// Every group the launcher has (its gid and its supplementary groups).
    pub groups: Vec<u32>,
}

impl LauncherIds {
    /// This process's own: the ids an unprivileged launch maps.
    pub fn of_this_process() -> LauncherIds {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let mut groups: Vec<u32> = nix::unistd::getgroups()
            .map(|groups| groups.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        groups.push(gid);
        LauncherIds { uid, gid, groups }
    }

    /// The launcher may change this entry on the host: its own, or
    /// writable by one of its groups or by all. (Mode bits only: an ACL
    /// granting more is not seen.)
    fn may_change(&self, meta: &std::fs::Metadata) -> bool {
        let mode = meta.mode();
        meta.uid() == self.uid
            || mode & 0o002 != 0
            || (mode & 0o020 != 0 && self.groups.contains(&meta.gid()))
    }
}

/// One entry the overlay cannot change, with its unmapped ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnmappedEntry {
    /// Relative to the workspace.
    pub path: PathBuf,
    /// Its owner, when that is not mapped.
    pub uid: Option<u32>,
    /// Its group, when that is not mapped.
    pub gid: Option<u32>,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unmapped {
    /// Entries the launcher may change on the host but the overlay cannot.
    pub found: usize,
    /// Entries looked at.
    pub scanned: usize,
    /// The whole tree was looked at (the limit was not reached).
    pub complete: bool,
    /// The first few found.
    pub examples: Vec<UnmappedEntry>,
}

/// Walks `workspace` (not following links, not entering other file
/// systems, which the overlay does not show, nor its top-level `.git`,
/// which the launch's git state stands in for), looking at `limit` entries
/// at most. Unreadable directories are passed over.
pub fn scan(workspace: &Path, ids: &LauncherIds, limit: usize) -> Unmapped {
    let mut out = Unmapped {
        complete: true,
        ..Unmapped::default()
    };
    // The top itself is not judged: the overlay's root is its upper
    // directory, the launcher's own, never copied up.
    let Ok(top) = std::fs::metadata(workspace) else {
        return out;
    };
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(workspace.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            if out.scanned >= limit {
                out.complete = false;
                return out;
            }
            let path = rel.join(entry.file_name());
            // DirEntry::metadata does not follow a link.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.file_type().is_symlink() {
                continue;
            }
            out.scanned += 1;
            judge(&path, &meta, ids, &mut out);
            let entered = meta.is_dir()
                && meta.dev() == top.dev()
                && !(rel.as_os_str().is_empty() && entry.file_name() == ".git");
            if entered {
                todo.push(path);
            }
        }
    }
    out
}

/// Counts `meta` when its owner or group is not mapped and the launcher
/// may change it on the host.
fn judge(path: &Path, meta: &std::fs::Metadata, ids: &LauncherIds, out: &mut Unmapped) {
    let uid = (meta.uid() != ids.uid).then_some(meta.uid());
    let gid = (meta.gid() != ids.gid).then_some(meta.gid());
    if (uid.is_none() && gid.is_none()) || !ids.may_change(meta) {
        return;
    }
    out.found += 1;
    if out.examples.len() < EXAMPLES {
        out.examples.push(UnmappedEntry {
            path: path.to_path_buf(),
            uid,
            gid,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids_of_file(path: &Path) -> (u32, u32) {
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid())
    }

    fn fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        for name in ["x", "a/y", "a/b/z", ".git/config"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        dir
    }

    #[test]
    fn a_tree_of_the_launchers_own_ids_has_nothing_to_report() {
        let dir = fixture();
        let (uid, gid) = ids_of_file(dir.path());
        let ids = LauncherIds {
            uid,
            gid,
            groups: vec![gid],
        };
        let found = scan(dir.path(), &ids, SCAN_LIMIT);
        assert_eq!(found.found, 0, "{found:?}");
        assert!(found.complete);
        // x, a, a/y, a/b, a/b/z, .git (not entered).
        assert_eq!(found.scanned, 6, "{found:?}");
    }

    #[test]
    fn entries_of_another_group_the_launcher_owns_are_found() {
        let dir = fixture();
        let (uid, gid) = ids_of_file(dir.path());
        // The files' group seen as another's: every entry is the
        // launcher's own (so changeable) with an unmapped group.
        let ids = LauncherIds {
            uid,
            gid: gid.wrapping_add(1),
            groups: vec![gid.wrapping_add(1)],
        };
        let found = scan(dir.path(), &ids, SCAN_LIMIT);
        // x, a, a/y, a/b, a/b/z, .git.
        assert_eq!(found.found, 6, "{found:?}");
        assert_eq!(found.examples.len(), EXAMPLES);
        assert!(found.examples.iter().all(|e| e.uid.is_none()));
        assert!(found.examples.iter().all(|e| e.gid == Some(gid)));
    }

    #[test]
    fn entries_another_owns_and_the_launcher_cannot_write_are_not_counted() {
        let dir = fixture();
        let (uid, gid) = ids_of_file(dir.path());
        let other = LauncherIds {
            uid: uid.wrapping_add(1),
            gid: gid.wrapping_add(1),
            groups: vec![gid.wrapping_add(1)],
        };
        // Created 0644/0755 (umask 022): not writable by group or all.
        let found = scan(dir.path(), &other, SCAN_LIMIT);
        assert_eq!(found.found, 0, "{found:?}");
        // Writable by all: counted.
        use std::os::unix::fs::PermissionsExt;
        let x = dir.path().join("x");
        std::fs::set_permissions(&x, std::fs::Permissions::from_mode(0o666)).unwrap();
        let found = scan(dir.path(), &other, SCAN_LIMIT);
        assert_eq!(found.found, 1, "{found:?}");
        assert_eq!(found.examples[0].path, Path::new("x"));
        assert_eq!(found.examples[0].uid, Some(uid));
    }

    #[test]
    fn a_scan_stops_at_its_limit_and_says_so() {
        let dir = fixture();
        let (uid, gid) = ids_of_file(dir.path());
        let ids = LauncherIds {
            uid,
            gid: gid.wrapping_add(1),
            groups: vec![],
        };
        let found = scan(dir.path(), &ids, 2);
        assert!(!found.complete);
        assert_eq!(found.scanned, 2);
        assert_eq!(found.found, 2, "{found:?}");
    }

    #[test]
    fn a_missing_workspace_finds_nothing() {
        let ids = LauncherIds::of_this_process();
        let found = scan(Path::new("/nonexistent/substrat-40"), &ids, SCAN_LIMIT);
        assert_eq!(
            found,
            Unmapped {
                complete: true,
                ..Unmapped::default()
            }
        );
    }
}
