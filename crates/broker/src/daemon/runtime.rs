//! The runtime directory (`daemon --runtime-dir`, `/run/substrat` under
//! the system unit): the control socket and the agents' sockets live
//! there instead of in the state directory, on a tmpfs that goes with the
//! daemon and in paths short enough for sun_path. The state directory
//! records where it is (`STATE/runtime-dir`, 0600), so a client that
//! names only `--state-dir` still finds the sockets; the record and the
//! directory it names are checked before use (the caller's own, not a
//! link, not writable by others), so nobody else can point a client at
//! sockets of theirs.

use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The record's name in the state directory.
pub const RECORD: &str = "runtime-dir";

/// Why the runtime directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} {why}")]
    Unsafe { path: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeDirError + '_ {
    move |source| RuntimeDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks `path` is what only this account controls: owned by `uid`, not
/// a symlink, not writable by group or others; a directory when `dir`.
pub fn check_private(path: &Path, uid: u32, dir: bool) -> Result<(), RuntimeDirError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    let unsafe_because = |why: &str| {
        Err(RuntimeDirError::Unsafe {
            path: path.to_path_buf(),
            why: why.to_string(),
        })
    };
    if meta.file_type().is_symlink() {
        return unsafe_because("is a symbolic link");
    }
    if dir != meta.is_dir() {
        return unsafe_because(if dir {
            "is not a directory"
        } else {
            "is not a file"
        });
    }
    if meta.uid() != uid {
        return unsafe_because(&format!("belongs to uid {}, not {uid}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return unsafe_because(&format!(
            "is writable by others (mode {:o})",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// The file in the runtime directory naming the state directory of the
/// daemon whose sockets are there (0600): a client checks it names its
/// own, so a record left pointing at a runtime directory another daemon
/// now holds does not lead it to that daemon.
pub const OWNER: &str = "state-dir";

/// Makes `runtime` the daemon's (0700, its own). The directory resolved
/// (no symlinks), as recorded. Nothing is recorded: the caller locks the
/// directory first (`record`).
pub fn make(runtime: &Path) -> Result<PathBuf, RuntimeDirError> {
    let uid = rustix::process::getuid().as_raw();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(runtime)
        .map_err(io(runtime))?;
    check_private(runtime, uid, true)?;
    std::fs::set_permissions(runtime, std::fs::Permissions::from_mode(0o700))
        .map_err(io(runtime))?;
    // The parents may be links (/var/run): the record names the place.
    runtime.canonicalize().map_err(io(runtime))
}

/// Records `runtime` (made by `make` and locked by this daemon) in the
/// state directory, and the state directory in it (`OWNER`); with none,
/// removes a record left by an earlier run. `state_dir` is resolved.
pub fn record(state_dir: &Path, runtime: Option<&Path>) -> Result<(), RuntimeDirError> {
    let Some(runtime) = runtime else {
        return forget(state_dir);
    };
    write_whole(runtime, OWNER, state_dir.as_os_str().as_encoded_bytes())?;
    write_whole(state_dir, RECORD, runtime.as_os_str().as_encoded_bytes())
}

/// Removes the state directory's record (a daemon that did not start
/// leaves none naming a runtime directory it does not hold).
pub fn forget(state_dir: &Path) -> Result<(), RuntimeDirError> {
    let record = state_dir.join(RECORD);
    match std::fs::remove_file(&record) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&record)(e)),
        _ => Ok(()),
    }
}

/// Removes the state directory's runtime record when dropped armed: a
/// daemon that fails to start leaves no record naming sockets it does not
/// serve.
pub(super) struct RecordGuard(pub Option<PathBuf>);

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if let Some(state_dir) = self.0.take()
            && let Err(e) = forget(&state_dir)
        {
            tracing::warn!(error = %e, "cannot remove the runtime directory's record");
        }
    }
}

/// Writes `dir/name` whole beside it (0600), then renames it over it.
fn write_whole(dir: &Path, name: &str, text: &[u8]) -> Result<(), RuntimeDirError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = dir.join(format!("{name}.new"));
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(io(&partial))?;
    file.write_all(text).map_err(io(&partial))?;
    let path = dir.join(name);
    std::fs::rename(&partial, &path).map_err(io(&path))
}

/// Reads a private file of at most 4096 bytes naming an absolute path.
fn read_path(path: &Path, uid: u32) -> Result<PathBuf, RuntimeDirError> {
    check_private(path, uid, false)?;
    let text = std::fs::read(path).map_err(io(path))?;
    let named = PathBuf::from(std::ffi::OsString::from_vec(text));
    if !named.is_absolute() || named.as_os_str().len() > 4096 {
        return Err(RuntimeDirError::Unsafe {
            path: path.to_path_buf(),
            why: "does not name an absolute directory".into(),
        });
    }
    Ok(named)
}

/// Where the sockets of the daemon of `state_dir` are: the runtime
/// directory its record names, checked; else the state directory itself.
pub fn resolve(state_dir: &Path) -> Result<PathBuf, RuntimeDirError> {
    let record = state_dir.join(RECORD);
    match std::fs::symlink_metadata(&record) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(state_dir.to_path_buf()),
        Err(e) => return Err(io(&record)(e)),
        Ok(_) => {}
    }
    let uid = rustix::process::getuid().as_raw();
    check_private(state_dir, uid, true)?;
    let named = read_path(&record, uid)?;
    check_private(&named, uid, true)?;
    // The daemon there must be this state directory's.
    let owner = named.join(OWNER);
    if matches!(std::fs::symlink_metadata(&owner), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    {
        return Err(older_daemon(state_dir, &named));
    }
    let serves = read_path(&owner, uid)?;
    let ours = state_dir.canonicalize().map_err(io(state_dir))?;
    if serves != ours {
        return Err(RuntimeDirError::Unsafe {
            path: named,
            why: format!(
                "holds the sockets of the daemon of another state directory ({}); start this one's daemon",
                serves.display()
            ),
        });
    }
    Ok(named)
}

/// A runtime directory without its `OWNER` record: its daemon was started
/// by a build before the record, so nothing says which state directory it
/// serves (a record left by another state directory's daemon leads here
/// too). Not used; the operator is told how to make it say.
fn older_daemon(state_dir: &Path, runtime: &Path) -> RuntimeDirError {
    RuntimeDirError::Unsafe {
        path: runtime.to_path_buf(),
        why: format!(
            "has no `{OWNER}` record: its daemon was started by an earlier build, which does not say \
             which state directory it serves; restart the daemon of {state} (`systemctl restart \
             substrat-sandbox`, or `systemctl --user restart substrat-sandbox`, or stop it and start \
             `substrat-sandbox daemon --state-dir {state} --runtime-dir {runtime}` again)",
            state = state_dir.display(),
            runtime = runtime.display(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(state: &Path, runtime: Option<&Path>) -> Result<(), RuntimeDirError> {
        let runtime = runtime.map(make).transpose()?;
        record(&state.canonicalize().unwrap(), runtime.as_deref())
    }

    #[test]
    fn a_runtime_dir_serving_another_state_dir_is_refused() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let runtime = run.path().join("substrat");
        prepare(second.path(), Some(&runtime)).unwrap();
        assert_eq!(
            resolve(second.path()).unwrap(),
            runtime.canonicalize().unwrap()
        );
        // The first state directory's daemon takes the runtime directory:
        // the second's record, left behind, now leads to that daemon.
        prepare(first.path(), Some(&runtime)).unwrap();
        let refused = resolve(second.path()).unwrap_err().to_string();
        assert!(
            refused.contains("of another state directory")
                && refused.contains(&first.path().canonicalize().unwrap().display().to_string()),
            "{refused}"
        );
        assert!(resolve(first.path()).is_ok());
        // A runtime directory naming no state directory (its daemon from
        // a build before the record): not used, and the error says what
        // to do.
        std::fs::remove_file(runtime.join(OWNER)).unwrap();
        let refused = resolve(first.path()).unwrap_err().to_string();
        assert!(
            refused.contains("started by an earlier build")
                && refused.contains("restart the daemon of")
                && refused.contains(&format!(
                    "--runtime-dir {}",
                    runtime.canonicalize().unwrap().display()
                )),
            "{refused}"
        );
    }

    #[test]
    fn a_recorded_runtime_dir_is_found_only_when_it_is_private() {
        let state = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let runtime = run.path().join("substrat");
        assert_eq!(resolve(state.path()).unwrap(), state.path(), "no record");
        prepare(state.path(), Some(&runtime)).unwrap();
        assert_eq!(
            resolve(state.path()).unwrap(),
            runtime.canonicalize().unwrap()
        );
        let mode = std::fs::metadata(&runtime).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Others may write it: not used.
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = resolve(state.path()).unwrap_err().to_string();
        assert!(
            refused.contains("writable by others (mode 777)"),
            "{refused}"
        );
        // A link in its place: not followed.
        std::fs::remove_dir_all(&runtime).unwrap();
        std::os::unix::fs::symlink(run.path(), &runtime).unwrap();
        let refused = resolve(state.path()).unwrap_err().to_string();
        assert!(refused.contains("is a symbolic link"), "{refused}");
        // A record others may write: not read.
        std::fs::remove_file(&runtime).unwrap();
        prepare(state.path(), Some(&runtime)).unwrap();
        let record = state.path().join(RECORD);
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(resolve(state.path()).is_err());
        // A relative path recorded: refused.
        std::fs::write(&record, "relative/dir").unwrap();
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o600)).unwrap();
        let refused = resolve(state.path()).unwrap_err().to_string();
        assert!(refused.contains("absolute"), "{refused}");
        // A daemon without one removes the record.
        prepare(state.path(), None).unwrap();
        assert_eq!(resolve(state.path()).unwrap(), state.path());
    }
}
