//! cgroup v2 delegation: where a launch's groups go, and enabling a
//! controller for them when the launcher sits in the very group it
//! delegates from (systemd's delegated scopes).

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::CgroupError;

/// Where the sandbox's groups go without `--cgroup-parent`: below the
/// launcher's own group, or, when that is the leaf an earlier launch moved
/// it into (`move_to_leaf`), below the leaf's parent.
pub(super) fn own_parent(mount_point: &Path, own: &str) -> PathBuf {
    let own = Path::new(own);
    match own.file_name() {
        Some(name) if name == LEAF => mount_point.join(own.parent().unwrap_or(Path::new(""))),
        _ => mount_point.join(own),
    }
}

/// In v2 a controller must be enabled in the parent's subtree_control; and
/// a group that enables controllers for its children may hold no process
/// itself ("no internal processes"). A launcher started in a delegated
/// systemd scope (`systemd-run --scope -p Delegate=yes`) is in the very
/// group it makes the sandbox's below: the write fails with EBUSY. The
/// launcher (`launcher`, its pid) then moves itself into a leaf beside the
/// sandboxes' groups and tries again; other processes there (a shell, a
/// daemon) are not moved: the group is not this launch's to rearrange.
pub(super) fn enable_v2_controller(
    parent: &Path,
    controller: &str,
    launcher: u32,
) -> Result<(), CgroupError> {
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == controller) {
        return Ok(());
    }
    let enable = || {
        fs::write(
            parent.join("cgroup.subtree_control"),
            format!("+{controller}"),
        )
    };
    let busy = |e: &std::io::Error| e.raw_os_error() == Some(libc::EBUSY);
    let written = match enable() {
        Err(e) if busy(&e) => {
            move_to_leaf(parent, launcher)?;
            enable()
        }
        other => other,
    };
    written.map_err(|reason| {
        if busy(&reason) {
            CgroupError::Crowded {
                parent: parent.to_path_buf(),
            }
        } else {
            CgroupError::NotDelegated {
                controller: controller.to_string(),
                parent: parent.to_path_buf(),
                reason,
            }
        }
    })
}

/// The leaf that takes the launcher out of a delegated group; shared by
/// the launches there, and swept like a sandbox's group when left empty.
pub(super) const LEAF: &str = "substrat-leaf";

/// Moves the launcher (`launcher`, its pid) and its own children in the v2
/// group `parent` (the native backend's holder is forked before the groups
/// are made) into `parent/substrat-leaf`.
fn move_to_leaf(parent: &Path, launcher: u32) -> Result<(), CgroupError> {
    let leaf = parent.join(LEAF);
    match fs::create_dir(&leaf) {
        Err(reason) if reason.kind() != ErrorKind::AlreadyExists => {
            return Err(CgroupError::NoLeaf { leaf, reason });
        }
        _ => {}
    }
    let procs = fs::read_to_string(parent.join("cgroup.procs")).unwrap_or_default();
    let children = procs
        .lines()
        .filter_map(|line| line.trim().parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(launcher));
    for pid in std::iter::once(launcher).chain(children) {
        match fs::write(leaf.join("cgroup.procs"), pid.to_string()) {
            // A child gone since the list was read.
            Err(e) if pid != launcher && e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(reason) => {
                return Err(CgroupError::Move {
                    pid: pid.to_string(),
                    group: leaf,
                    reason,
                });
            }
            Ok(()) => {}
        }
    }
    Ok(())
}

/// The parent pid of `pid`, from /proc/PID/stat (the field after the
/// command name, which may itself hold spaces and parentheses).
pub(super) fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// What `settle_daemon_in_leaf` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonGroup {
    /// Moved from `group` into `group/substrat-leaf`: its launchers make
    /// their groups beside it.
    MovedToLeaf { group: PathBuf },
    /// Left where it was, and why (not v2, not alone, not delegated).
    Stays { reason: String },
}

/// A daemon alone in a cgroup v2 group it may write (a systemd service
/// with `Delegate=yes`) moves into the group's leaf, as a launcher does,
/// before it starts any: the group may then enable controllers for the
/// sandboxes' groups ("no internal processes"), which it could not while
/// the daemon sat in it. A group holding other processes (a login
/// session's) is not the daemon's to rearrange: it stays, and launches
/// there need `--cgroup-parent`. `group` is the daemon's own group's
/// directory, `pid` the daemon's. A `privileged` daemon (root) may write
/// any group, so a write that succeeds says nothing: it moves only where
/// systemd marked its group delegated (`Delegate=yes` sets
/// `trusted.delegate`), never into a unit that did not ask for it.
pub fn settle_daemon_in_leaf(
    group: &Path,
    pid: u32,
    privileged: bool,
) -> Result<DaemonGroup, CgroupError> {
    if group.file_name().is_some_and(|name| name == LEAF) {
        return Ok(DaemonGroup::Stays {
            reason: "already in the leaf".to_string(),
        });
    }
    if privileged && !marked_delegated(group) {
        return Ok(DaemonGroup::Stays {
            reason: "run as root in a group not marked delegated (no Delegate=yes)".to_string(),
        });
    }
    let procs = fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
    let others = procs
        .lines()
        .filter_map(|line| line.trim().parse::<u32>().ok())
        .filter(|&p| p != pid)
        .count();
    if others > 0 {
        return Ok(DaemonGroup::Stays {
            reason: format!("{others} other process(es) share its group"),
        });
    }
    let leaf = group.join(LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EPERM | libc::EROFS)
            ) =>
        {
            return Ok(DaemonGroup::Stays {
                reason: "its group is not delegated to it".to_string(),
            });
        }
        Err(reason) => return Err(CgroupError::NoLeaf { leaf, reason }),
    }
    fs::write(leaf.join("cgroup.procs"), pid.to_string()).map_err(|reason| CgroupError::Move {
        pid: pid.to_string(),
        group: leaf.clone(),
        reason,
    })?;
    Ok(DaemonGroup::MovedToLeaf {
        group: group.to_path_buf(),
    })
}

/// Whether systemd marked `group` delegated to the unit in it: the
/// attribute `trusted.delegate` (or `user.delegate`) is "1".
pub(super) fn marked_delegated(group: &Path) -> bool {
    let Ok(dir) = fs::File::open(group) else {
        return false;
    };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        let mut value = [0u8; 8];
        crate::sys::xattr_value(&dir, name, &mut value) == Some(1) && value[0] == b'1'
    })
}
