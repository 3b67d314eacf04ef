//! Where a user's state goes when no flag names it: a launch's git state
//! and the daemon's state directory. An account whose home does not exist
//! (service accounts; `runuser -u nobody` gives HOME=/nonexistent) gets a
//! private directory it can make; when there is none, one error names the
//! one setting that gives it one.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// No directory for the state: what was tried, and the setting to give.
#[derive(Debug, thiserror::Error)]
#[error("no directory for substrat's state: {}; set {setting} to a directory of yours", tried.join("; "))]
pub struct NoStateDir {
    pub tried: Vec<String>,
    pub setting: &'static str,
}

/// substrat's directory among the user's state: `$XDG_STATE_HOME/substrat`,
/// else `$HOME/.local/state/substrat` when HOME is a directory, else
/// `$XDG_RUNTIME_DIR/substrat`, else `$TMPDIR/substrat-UID` (`/tmp`
/// without TMPDIR), made 0700 and checked to be the user's own directory,
/// not a link. `setting` is what the error tells the user to set.
pub fn user_state_dir(setting: &'static str) -> Result<PathBuf, NoStateDir> {
    if let Some(dir) = var_dir("XDG_STATE_HOME") {
        return Ok(dir.join("substrat"));
    }
    let mut tried = Vec::new();
    match home_dir() {
        Ok(home) => return Ok(home.join(".local/state/substrat")),
        Err(why) => tried.push(why),
    }
    match var_dir("XDG_RUNTIME_DIR") {
        Some(dir) if dir.is_dir() => return Ok(dir.join("substrat")),
        Some(dir) => tried.push(format!(
            "XDG_RUNTIME_DIR ({}) is not a directory",
            dir.display()
        )),
        None => tried.push("XDG_RUNTIME_DIR is not set".into()),
    }
    let uid = rustix::process::getuid().as_raw();
    let private = std::env::temp_dir().join(format!("substrat-{uid}"));
    match private_dir(&private, uid) {
        Ok(()) => Ok(private),
        Err(why) => {
            tried.push(why);
            Err(NoStateDir { tried, setting })
        }
    }
}

/// HOME when it names a directory; else why not.
pub fn home_dir() -> Result<PathBuf, String> {
    match var_dir("HOME") {
        Some(home) if home.is_dir() => Ok(home),
        Some(home) => Err(format!("HOME ({}) is not a directory", home.display())),
        None => Err("HOME is not set".into()),
    }
}

/// An absolute path in variable `name`; an empty or relative value counts
/// as unset (the XDG rule).
fn var_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// Makes `path` (mode 0700) unless it exists, then checks it is a
/// directory of `uid`'s, not a link, closed to others: in a shared
/// directory such as /tmp anyone could have made it first.
fn private_dir(path: &Path, uid: u32) -> Result<(), String> {
    let shown = path.display();
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(format!("cannot make {shown}: {e}"));
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!("{shown} is a link"));
    }
    if !meta.is_dir() {
        return Err(format!("{shown} is not a directory"));
    }
    if meta.uid() != uid {
        return Err(format!("{shown} belongs to uid {}", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{shown} is open to others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_private_directory_is_made_once_and_nothing_else_is_taken() {
        let root = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let mine = root.path().join("mine");
        assert_eq!(private_dir(&mine, uid), Ok(()));
        assert_eq!(private_dir(&mine, uid), Ok(()), "found made");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        assert!(private_dir(&link, uid).unwrap_err().ends_with("is a link"));
        assert!(
            private_dir(&mine, uid + 1)
                .unwrap_err()
                .contains("belongs to uid")
        );
        let open = root.path().join("open");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&open)
            .unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert!(
            private_dir(&open, uid)
                .unwrap_err()
                .contains("open to others (mode 755)")
        );
    }
}
