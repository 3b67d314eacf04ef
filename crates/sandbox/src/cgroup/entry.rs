//! How a sandbox's first process enters its groups.
//!
//! Writing a pid to a v1 group's `cgroup.procs` (a whole thread group)
//! takes the kernel's global threadgroup lock for writing, which waits for
//! an RCU grace period when no other migration happened just before: 6 to
//! 19 ms on this project's hosts, the largest part of a cold launch.
//! Moving one thread does not take it. So in a v1 hierarchy the first
//! process moves itself: it writes "0" to the group's `tasks` file, through
//! a descriptor the launcher opened, while it still has one thread (a fresh
//! fork that has not started any), so moving its thread moves all of it.
//! What it starts afterwards is born inside. A v2 group (no `tasks` file),
//! or a delegated v1 group whose `tasks` is not the launcher's to write, is
//! still given the pid by the launcher.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use super::{CgroupError, SandboxCgroups};

/// The groups of one launch, ready for its first process.
#[derive(Debug, Default)]
pub struct CgroupEntry {
    /// v1 groups' `tasks` files, opened by the launcher (close-on-exec),
    /// with the group each belongs to.
    own_move: Vec<(File, PathBuf)>,
    /// v2 groups: the launcher writes the pid (`add_by_launcher`).
    by_launcher: Vec<PathBuf>,
}

impl SandboxCgroups {
    /// Opens what the first process needs to enter each group; before the
    /// fork, so that it inherits the descriptors.
    pub fn entry(&self) -> Result<CgroupEntry, CgroupError> {
        let mut entry = CgroupEntry::default();
        for group in &self.groups {
            let tasks = group.join("tasks");
            let opened = File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tasks);
            match opened {
                Ok(file) => entry.own_move.push((file, group.clone())),
                // v2 has no `tasks`; a delegated v1 group may have only
                // its `cgroup.procs` made the launcher's.
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::PermissionDenied) => {
                    entry.by_launcher.push(group.clone())
                }
                Err(source) => {
                    return Err(CgroupError::Io {
                        path: tasks,
                        source,
                    });
                }
            }
        }
        Ok(entry)
    }
}

impl CgroupEntry {
    /// In the launcher: the first process (`pid`) into the groups that take
    /// it from outside (v2).
    pub fn add_by_launcher(&self, pid: i32) -> Result<(), CgroupError> {
        for group in &self.by_launcher {
            std::fs::write(group.join("cgroup.procs"), pid.to_string()).map_err(|reason| {
                CgroupError::Move {
                    pid: pid.to_string(),
                    group: group.clone(),
                    reason,
                }
            })?;
        }
        Ok(())
    }

    /// In the first process, single-threaded, once the launcher said go:
    /// moves itself into the v1 groups and closes their files (nothing
    /// started afterwards holds them).
    pub fn join_self(&mut self) -> Result<(), CgroupError> {
        for (mut tasks, group) in self.own_move.drain(..) {
            tasks.write_all(b"0").map_err(|reason| CgroupError::Move {
                pid: "0 (itself)".into(),
                group,
                reason,
            })?;
        }
        Ok(())
    }
}
