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

/// Makes `runtime` the daemon's (0700, its own) and records it in the
/// state directory; with none, removes a record left by an earlier run.
/// The directory resolved (no symlinks), as recorded.
pub fn prepare(
    state_dir: &Path,
    runtime: Option<&Path>,
) -> Result<Option<PathBuf>, RuntimeDirError> {
    let record = state_dir.join(RECORD);
    let Some(runtime) = runtime else {
        match std::fs::remove_file(&record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&record)(e)),
            _ => return Ok(None),
        }
    };
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
    let runtime = &runtime.canonicalize().map_err(io(runtime))?;
    let text = runtime.as_os_str().as_encoded_bytes();
    // Written whole beside the record, then renamed over it.
    let partial = state_dir.join(format!("{RECORD}.new"));
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&partial);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .map_err(io(&partial))?;
        file.write_all(text).map_err(io(&partial))?;
    }
    std::fs::rename(&partial, &record).map_err(io(&record))?;
    Ok(Some(runtime.clone()))
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
    check_private(&record, uid, false)?;
    let text = std::fs::read(&record).map_err(io(&record))?;
    let named = PathBuf::from(std::ffi::OsString::from_vec(text));
    if !named.is_absolute() || named.as_os_str().len() > 4096 {
        return Err(RuntimeDirError::Unsafe {
            path: record,
            why: "does not name an absolute directory".into(),
        });
    }
    check_private(&named, uid, true)?;
    Ok(named)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::remove_dir(&runtime).unwrap();
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
