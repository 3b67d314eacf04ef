//! Whether a layer can be trusted by the person who reviews and applies
//! it: checked as ssh checks its keys. `apply` writes what the layer holds
//! into a workspace, so a layer someone else could have written (its
//! directory, its record of the workspace, its turns) would let them
//! choose what is written, and where.
//!
//! The rule: the layer directory and what `apply` reads from it are owned
//! by the caller and writable by nobody else; every parent directory is
//! owned by the caller or root and writable by nobody else, up to `/` or
//! to the first directory that shields what is below it: one owned by
//! root with the sticky bit (`/tmp`: nobody can rename another's entry),
//! or a private one (owned by the caller or root, no access for others).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::LayerError;

const STICKY: u32 = 0o1000;
const WRITABLE_BY_OTHERS: u32 = 0o022;
const ANY_ACCESS_BY_OTHERS: u32 = 0o077;

/// Why a path of the layer is not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// Owned by another user.
    Owner { uid: u32 },
    /// Writable by group or others.
    Mode { mode: u32 },
    /// Not the kind expected (a symlink, a device...).
    Kind { expected: &'static str },
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Untrusted::Owner { uid } => write!(f, "owned by uid {uid}, not by you"),
            Untrusted::Mode { mode } => {
                write!(f, "writable by others (mode {:04o})", mode & 0o7777)
            }
            Untrusted::Kind { expected } => write!(f, "not {expected}"),
        }
    }
}

/// The uid checks compare with: the effective one.
fn caller() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Checks the layer directory `dir` (resolved: no symlink in it) and its
/// parents.
pub(crate) fn check_layer_dir(dir: &Path) -> Result<(), LayerError> {
    check_one(dir, caller(), Expect::Dir)?;
    match dir.parent() {
        Some(parent) => check_parents(parent),
        None => Ok(()),
    }
}

/// Checks `from` and every directory above it, up to `/`, as the parents
/// of a layer: each the caller's or root's, and writable by nobody else,
/// except a root-owned sticky directory (`/tmp`), where nobody can rename
/// another's entry. No directory ends the walk early: whoever can write
/// the parent of a private directory can put another in its place.
pub(crate) fn check_parents(from: &Path) -> Result<(), LayerError> {
    let me = caller();
    for parent in from.ancestors() {
        let meta = lstat(parent)?;
        let mode = meta.mode();
        let owner = meta.uid();
        if owner != me && owner != 0 {
            return Err(untrusted(parent, Untrusted::Owner { uid: owner }));
        }
        let shielded = owner == 0 && mode & STICKY != 0;
        if mode & WRITABLE_BY_OTHERS != 0 && !shielded {
            return Err(untrusted(parent, Untrusted::Mode { mode }));
        }
    }
    Ok(())
}

/// Checks the links on the way `given` names a layer: each the caller's
/// or root's (another's link would choose which layer is acted on).
pub(crate) fn check_links(given: &Path) -> Result<(), LayerError> {
    let me = caller();
    let absolute = if given.is_absolute() {
        given.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| LayerError::io("read the current directory for", given, e))?
            .join(given)
    };
    let mut prefix = PathBuf::new();
    for part in absolute.components() {
        prefix.push(part);
        let Ok(meta) = std::fs::symlink_metadata(&prefix) else {
            continue;
        };
        if meta.file_type().is_symlink() && meta.uid() != me && meta.uid() != 0 {
            return Err(untrusted(&prefix, Untrusted::Owner { uid: meta.uid() }));
        }
    }
    Ok(())
}

/// What a path of the layer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Dir,
    File,
}

/// Checks one path of the layer (never following a symlink): its kind,
/// owned by the caller, writable by nobody else. An absent path is fine
/// (the caller makes it, or reads nothing).
pub(crate) fn check_one(path: &Path, me: u32, expect: Expect) -> Result<(), LayerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LayerError::io("stat", path, e)),
    };
    let (right_kind, expected) = match expect {
        Expect::Dir => (meta.is_dir(), "a directory"),
        Expect::File => (meta.is_file(), "a regular file"),
    };
    if !right_kind {
        return Err(untrusted(path, Untrusted::Kind { expected }));
    }
    if meta.uid() != me {
        return Err(untrusted(path, Untrusted::Owner { uid: meta.uid() }));
    }
    if meta.mode() & WRITABLE_BY_OTHERS != 0 {
        return Err(untrusted(path, Untrusted::Mode { mode: meta.mode() }));
    }
    Ok(())
}

/// Checks the files of the layer `apply` reads (its record, its turns),
/// and the layer directory with its parents.
pub(crate) fn check_layer(dir: &Path) -> Result<(), LayerError> {
    check_layer_dir(dir)?;
    let me = caller();
    for (name, expect) in crate::store::RECORDS {
        check_one(&dir.join(name), me, *expect)?;
    }
    let turns = dir.join("turns");
    check_one(&turns, me, Expect::Dir)?;
    let entries = match std::fs::read_dir(&turns) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LayerError::io("read", &turns, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| LayerError::io("read", &turns, e))?;
        check_one(&entry.path(), me, Expect::Dir)?;
    }
    Ok(())
}

/// An empty directory given for a new layer: the caller's, private.
pub(crate) fn check_new_layer_dir(dir: &Path) -> Result<(), LayerError> {
    let meta = lstat(dir)?;
    if meta.uid() != caller() {
        return Err(untrusted(dir, Untrusted::Owner { uid: meta.uid() }));
    }
    if meta.mode() & ANY_ACCESS_BY_OTHERS != 0 {
        return Err(LayerError::Untrusted {
            path: dir.to_path_buf(),
            why: format!(
                "open to others (mode {:04o}); a new layer directory must be 0700 (`chmod 700`)",
                meta.mode() & 0o7777
            ),
        });
    }
    Ok(())
}

fn lstat(path: &Path) -> Result<std::fs::Metadata, LayerError> {
    std::fs::symlink_metadata(path).map_err(|e| LayerError::io("stat", path, e))
}

fn untrusted(path: &Path, why: Untrusted) -> LayerError {
    LayerError::Untrusted {
        path: PathBuf::from(path),
        why: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_layer_under_tmp_is_trusted_and_loose_modes_are_not() {
        let top = tempfile::tempdir().unwrap();
        let layer = top.path().join("layer");
        std::fs::create_dir(&layer).unwrap();
        chmod(&layer, 0o700);
        check_layer(&layer).unwrap();

        chmod(&layer, 0o770);
        let err = check_layer(&layer).unwrap_err().to_string();
        assert!(err.contains("writable by others (mode 0770)"), "{err}");
        chmod(&layer, 0o700);

        // A parent others can write (not sticky, not root's): refused.
        chmod(top.path(), 0o777);
        let err = check_layer(&layer).unwrap_err().to_string();
        assert!(err.contains(&top.path().display().to_string()), "{err}");
        assert!(err.contains("mode 0777"), "{err}");
        chmod(top.path(), 0o700);

        // A record of the layer others can write: refused.
        let record = layer.join("layer.json");
        std::fs::write(&record, "{}").unwrap();
        chmod(&record, 0o666);
        let err = check_layer(&layer).unwrap_err().to_string();
        assert!(err.contains("layer.json") && err.contains("0666"), "{err}");
        std::fs::remove_file(&record).unwrap();

        // A symlink where a turn should be: refused.
        std::fs::create_dir(layer.join("turns")).unwrap();
        std::os::unix::fs::symlink("/", layer.join("turns").join("1")).unwrap();
        let err = check_layer(&layer).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }

    #[test]
    fn a_new_layer_directory_must_be_private() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("new");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        let err = check_new_layer_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("must be 0700"), "{err}");
        chmod(&dir, 0o700);
        check_new_layer_dir(&dir).unwrap();
    }
}
