//! Containers' records under the runtime's root directory: one directory
//! per container with `state.json` (what `create` made) and, until the
//! container is started, `exec.fifo` (the gate its command waits on).
//!
//! A container's pid is its launcher's (the process that built the sandbox
//! and waits for it; its exit code is the command's), recorded with its
//! start time so a reused pid is never taken for it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The runtime-spec version `state` reports.
pub const OCI_VERSION: &str = "1.2.0";

/// The root directory when `--root` is not given.
pub const DEFAULT_ROOT: &str = "/run/substrat-oci";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "container id `{0}` is not valid: 1 to 1024 characters of letters, digits, `_`, `-`, `.`, not starting with `.`"
    )]
    BadId(String),
    #[error("container `{0}` does not exist")]
    NotFound(String),
    #[error("container `{0}` exists already")]
    Exists(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the record of container `{id}` is damaged: {message}")]
    Damaged { id: String, message: String },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError + use<> {
    let path = path.to_path_buf();
    move |source| StateError::Io { what, path, source }
}

/// What `create` records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    pub bundle: PathBuf,
    pub pid: i32,
    /// Field 22 of /proc/PID/stat when the container was created.
    pub pid_start: u64,
    /// Seconds since the epoch.
    pub created: u64,
    pub annotations: BTreeMap<String, String>,
    /// Where the runtime differs from what the configuration asked.
    pub notes: Vec<String>,
    /// The substrat policies on top of the configuration at `create`: an
    /// `exec` gets the same, or is refused.
    #[serde(default)]
    pub policies: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Created,
    Running,
    /// Running, its group frozen (`pause`).
    Paused,
    Stopped,
}

/// A container's directory under `root`, once its id is known to be one.
pub fn container_dir(root: &Path, id: &str) -> Result<PathBuf, StateError> {
    let valid = !id.is_empty()
        && id.len() <= 1024
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if !valid {
        return Err(StateError::BadId(id.to_string()));
    }
    Ok(root.join(id))
}

pub fn fifo_path(dir: &Path) -> PathBuf {
    dir.join("exec.fifo")
}

/// Makes the container's directory with its first record in it and the
/// start gate, or none of it: all is made in a directory of this process's
/// (`.creating-PID`, a name no id has) renamed into place without
/// replacing (so a `create` killed midway never leaves an id's directory
/// without a record, which would hold the id forever). The root is made
/// private to its owner; what a killed `create` left there is removed.
pub fn make_dir(root: &Path, id: &str, record: &Record) -> Result<PathBuf, StateError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = container_dir(root, id)?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(io("create", root))?;
    remove_abandoned(root);
    let temp = root.join(format!("{CREATING}{}", std::process::id()));
    // One of a dead `create` whose pid this process has now.
    let _ = fs::remove_dir_all(&temp);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&temp)
        .map_err(io("create", &temp))?;
    let made = save(&temp, record).and_then(|()| {
        nix::unistd::mkfifo(
            &fifo_path(&temp),
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .map_err(|e| StateError::Io {
            what: "make the start gate",
            path: fifo_path(&temp),
            source: e.into(),
        })?;
        let cwd = nix::fcntl::AT_FDCWD;
        match nix::fcntl::renameat2(
            cwd,
            &temp,
            cwd,
            &dir,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        ) {
            Err(nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY) => {
                Err(StateError::Exists(id.to_string()))
            }
            other => other.map_err(|e| StateError::Io {
                what: "rename into place",
                path: dir.clone(),
                source: e.into(),
            }),
        }
    });
    if made.is_err() {
        let _ = fs::remove_dir_all(&temp);
    }
    made.map(|()| dir)
}

/// The prefix of a directory `make_dir` fills before it is renamed.
const CREATING: &str = ".creating-";

/// Removes the directories of `create`s that died before their rename.
fn remove_abandoned(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(CREATING))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(pid) = pid
            && process_start(pid).is_none_or(|(_, zombie)| zombie)
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes the record (atomically: a reader sees the old one or the new).
pub fn save(dir: &Path, record: &Record) -> Result<(), StateError> {
    let path = dir.join("state.json");
    let partial = dir.join("state.json.partial");
    let text = serde_json::to_vec_pretty(record).map_err(|e| StateError::Damaged {
        id: record.id.clone(),
        message: e.to_string(),
    })?;
    fs::write(&partial, text).map_err(io("write", &partial))?;
    fs::rename(&partial, &path).map_err(io("rename", &path))
}

pub fn load(root: &Path, id: &str) -> Result<(PathBuf, Record), StateError> {
    let dir = container_dir(root, id)?;
    let path = dir.join("state.json");
    let text = match fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StateError::NotFound(id.to_string()));
        }
        other => other.map_err(io("read", &path))?,
    };
    let record = serde_json::from_slice(&text).map_err(|e| StateError::Damaged {
        id: id.to_string(),
        message: e.to_string(),
    })?;
    Ok((dir, record))
}

/// Field 22 (start time) of /proc/PID/stat and whether the process is a
/// zombie; None when there is no such process.
pub fn process_start(pid: i32) -> Option<(u64, bool)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    Some((fields.get(19)?.parse().ok()?, zombie))
}

/// Whether the record's launcher is still the live process it was.
pub fn alive(record: &Record) -> bool {
    matches!(process_start(record.pid), Some((start, false)) if start == record.pid_start)
}

/// The first child of `pid` (the launcher's is the sandbox's holder, the
/// holder's is the sandbox's init).
pub fn first_child(pid: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn status(dir: &Path, record: &Record) -> Status {
    if !alive(record) {
        Status::Stopped
    } else if fifo_path(dir).exists() {
        Status::Created
    } else if crate::freeze::is_paused(dir) {
        Status::Paused
    } else {
        Status::Running
    }
}

/// The runtime-spec's state object.
pub fn oci_state(record: &Record, status: Status) -> serde_json::Value {
    let mut state = serde_json::json!({
        "ociVersion": OCI_VERSION,
        "id": record.id,
        "status": status,
        "bundle": record.bundle,
        "annotations": record.annotations,
    });
    if status != Status::Stopped {
        state["pid"] = record.pid.into();
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_names_never_paths() {
        let root = Path::new("/run/x");
        assert_eq!(
            container_dir(root, "abc-1.2_3").ok(),
            Some(root.join("abc-1.2_3"))
        );
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a\0b",
            "a b",
            &"x".repeat(1025),
        ] {
            assert!(container_dir(root, bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_live_process_has_a_start_time_and_a_stopped_record_no_pid() {
        let me = std::process::id() as i32;
        let (start, zombie) = process_start(me).unwrap_or_default();
        assert!(start > 0 && !zombie);
        let record = Record {
            id: "c".into(),
            bundle: "/b".into(),
            pid: me,
            pid_start: start + 1,
            created: 0,
            annotations: BTreeMap::new(),
            notes: Vec::new(),
            policies: Vec::new(),
        };
        assert!(!alive(&record), "another start time is another process");
        let state = oci_state(&record, Status::Stopped);
        assert_eq!(state["status"], "stopped");
        assert!(state.get("pid").is_none());
        assert_eq!(oci_state(&record, Status::Running)["pid"], me);
    }
}
