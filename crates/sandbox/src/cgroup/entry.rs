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
//! What it starts afterwards is born inside. The files reach it by
//! inheritance when the groups are made before the fork (bwrap backend), or
//! attached to the go byte when they are made while it sets up (native).
//! A v2 group (no `tasks` file),
//! or a delegated v1 group whose `tasks` is not the launcher's to write, is
//! still given the pid by the launcher.

use std::fs::File;
use std::io::{ErrorKind, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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
    /// moves itself into the v1 groups, through the files it inherited,
    /// and closes them (nothing started afterwards holds them).
    pub fn join_self(&mut self) -> Result<(), CgroupError> {
        for (tasks, group) in self.own_move.drain(..) {
            move_self(tasks).map_err(|reason| CgroupError::Move {
                pid: "0 (itself)".into(),
                group,
                reason,
            })?;
        }
        Ok(())
    }

    /// In the launcher: the go byte to a first process forked before the
    /// groups were made, with the v1 groups' `tasks` files attached
    /// (`receive_go` on the other side). A process that cannot be sent to
    /// has already failed and says why in its own status: not an error
    /// here; more groups than a message carries is.
    pub fn send_go(&self, socket: impl AsFd, byte: u8) -> std::io::Result<()> {
        let files: Vec<BorrowedFd<'_>> = self.own_move.iter().map(|(f, _)| f.as_fd()).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_GROUPS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !files.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&files)) {
            return Err(std::io::Error::other(format!(
                "{} cgroups to enter, more than {MAX_GROUPS}",
                files.len()
            )));
        }
        let _ = rustix::net::sendmsg(
            socket,
            &[IoSlice::new(&[byte])],
            &mut control,
            SendFlags::NOSIGNAL,
        );
        Ok(())
    }
}

/// The most groups one launch makes (pids, memory, cpu, freezer: four).
const MAX_GROUPS: usize = 8;

/// The first process's side of `send_go`: the go byte and the `tasks`
/// files it moves itself through (`join_self_through`). Descriptors cut
/// short are an error, never a partial entry.
pub fn receive_go(socket: impl AsFd) -> std::io::Result<(u8, Vec<File>)> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_GROUPS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut files = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            files.extend(rights.map(File::from));
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(std::io::Error::other("the cgroups' files were cut short"));
    }
    if received.bytes != 1 {
        return Err(std::io::Error::from(ErrorKind::UnexpectedEof));
    }
    Ok((byte[0], files))
}

/// `join_self` for files received with the go byte.
pub fn join_self_through(files: Vec<File>) -> Result<(), CgroupError> {
    let count = files.len();
    for (i, tasks) in files.into_iter().enumerate() {
        move_self(tasks).map_err(|reason| CgroupError::Move {
            pid: "0 (itself)".into(),
            group: PathBuf::from(format!("group {} of {count}", i + 1)),
            reason,
        })?;
    }
    Ok(())
}

/// Moves the calling thread (the whole process, while it has one) into
/// the group whose `tasks` file this is, then closes it.
fn move_self(mut tasks: File) -> std::io::Result<()> {
    tasks.write_all(b"0")
}
