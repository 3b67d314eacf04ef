//! `pause` and `resume`: the container's group in the freezer (the v1
//! freezer hierarchy on a hybrid host, else v2's `cgroup.freeze`), as runc
//! does. The group is the engine's `linux.cgroupsPath`, which the launcher
//! joined before anything of the container started (`engine_cgroup`): every
//! process of the container is in it or below it, the launcher too (so
//! nothing of the container runs while it is paused; an ending signal thaws
//! it first, `thaw_for_end`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use substrat_sandbox::cgroup::{Freezer, FreezerVersion};

use crate::engine_cgroup::{RECORD, hierarchies};

#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error(
        "container `{0}` has no cgroup of its own (no linux.cgroupsPath): there is nothing to freeze"
    )]
    NoGroup(String),
    #[error("container `{0}`: no cgroup hierarchy freezes here (no v1 freezer, no v2)")]
    NoFreezer(String),
    #[error("container `{id}`: {path}: {source}")]
    Io {
        id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("container `{id}`: {path} did not reach FROZEN within {secs} s; thawed again")]
    Stuck {
        id: String,
        path: PathBuf,
        secs: u64,
    },
}

/// The cgroupsPath the launcher recorded in the container's directory.
pub fn recorded_path(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(RECORD)).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("path "))?;
    let relative = Path::new(path.trim_start_matches('/'));
    let clean = relative
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    (clean && !path.is_empty()).then(|| path.to_string())
}

/// The container's freezer: its cgroupsPath in the v1 freezer hierarchy,
/// else in the v2 one (where freezing a group freezes what is below it).
pub fn freezer(dir: &Path, id: &str) -> Result<Freezer, FreezeError> {
    let path = recorded_path(dir).ok_or_else(|| FreezeError::NoGroup(id.to_string()))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let all = hierarchies(&mountinfo);
    let relative = path.trim_start_matches('/');
    let v1 = all
        .iter()
        .find(|h| !h.v2 && h.controllers.iter().any(|c| c == "freezer"));
    let (hierarchy, version) = match v1 {
        Some(h) => (h, FreezerVersion::V1),
        None => match all.iter().find(|h| h.v2) {
            Some(h) => (h, FreezerVersion::V2),
            None => return Err(FreezeError::NoFreezer(id.to_string())),
        },
    };
    Freezer {
        group: hierarchy.mount_point.join(relative),
        version,
    }
    .checked()
    .map_err(|e| FreezeError::Io {
        id: id.to_string(),
        path: e.0,
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })
}

/// How long a freeze may take before it is given up (runc retries for
/// about as long).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Freezes the container and waits until every process of it is frozen.
pub fn pause(dir: &Path, id: &str) -> Result<(), FreezeError> {
    let freezer = freezer(dir, id)?;
    let io = |source| FreezeError::Io {
        id: id.to_string(),
        path: freezer.group.clone(),
        source,
    };
    freezer.freeze().map_err(io)?;
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    loop {
        if freezer.is_frozen().map_err(io)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = freezer.thaw();
            return Err(FreezeError::Stuck {
                id: id.to_string(),
                path: freezer.group.clone(),
                secs: FREEZE_TIMEOUT.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Thaws the container.
pub fn resume(dir: &Path, id: &str) -> Result<(), FreezeError> {
    let freezer = freezer(dir, id)?;
    freezer.thaw().map_err(|source| FreezeError::Io {
        id: id.to_string(),
        path: freezer.group.clone(),
        source,
    })
}

/// Whether the container's group is frozen (or freezing) now; false when
/// it has none.
pub fn is_paused(dir: &Path) -> bool {
    let Ok(freezer) = freezer(dir, "") else {
        return false;
    };
    match freezer.version {
        // FREEZING counts: nothing of it may run any more.
        FreezerVersion::V1 => std::fs::read_to_string(freezer.group.join("freezer.state"))
            .is_ok_and(|s| s.trim() != "THAWED"),
        FreezerVersion::V2 => std::fs::read_to_string(freezer.group.join("cgroup.freeze"))
            .is_ok_and(|s| s.trim() == "1"),
    }
}

/// Before the container is ended (its launcher must run to kill it and
/// remove its groups; v1's frozen tasks do not even die of SIGKILL):
/// thawed, as runc thaws a paused container it kills.
pub fn thaw_for_end(dir: &Path) {
    if let Ok(freezer) = freezer(dir, "") {
        let _ = freezer.thaw();
    }
}
