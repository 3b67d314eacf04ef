//! How a sandbox's first process enters its groups.
//!
//! Writing a pid to a v1 group's `cgroup.procs` (a whole thread group)
//! takes the kernel's global threadgroup lock for writing, which waits for
//! an RCU grace period when no other migration happened just before: 6 to
//! 19 ms on this project's hosts, the largest part of a cold launch.
//! A thread moving itself (writing "0" to `tasks`) does not take it
//! (kernels from 5.5, and 5.4 stable; older ones take it, slower but as
//! correct). So in a v1 hierarchy the first
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
pub(crate) struct CgroupEntry {
    /// v1 groups' `tasks` files, opened by the launcher (close-on-exec).
    own_move: Vec<File>,
    /// v2 groups, and v1 ones whose `tasks` is not ours to write: the
    /// launcher writes the pid (`add_by_launcher`).
    by_launcher: Vec<PathBuf>,
}

impl SandboxCgroups {
    /// Opens what the first process needs to enter each group (it inherits
    /// the files when this runs before its fork, else they go with the go
    /// byte: `send_go`).
    pub(crate) fn entry(&self) -> Result<CgroupEntry, CgroupError> {
        let mut entry = CgroupEntry::default();
        for group in &self.groups {
            let tasks = group.join("tasks");
            let opened = File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tasks);
            match opened {
                Ok(file) => entry.own_move.push(file),
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
    /// it from outside (`by_launcher`).
    pub(crate) fn add_by_launcher(&self, pid: i32) -> Result<(), CgroupError> {
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

    /// The v1 groups' `tasks` files, for a first process that inherited
    /// them (`join_self_through`).
    pub(crate) fn take_files(&mut self) -> Vec<File> {
        std::mem::take(&mut self.own_move)
    }

    /// In the launcher: the go byte to a first process forked before the
    /// groups were made, with the v1 groups' `tasks` files attached
    /// (`receive_go` on the other side). A process that is gone already
    /// (EPIPE, ECONNRESET) says why in its own status: not an error here.
    pub(crate) fn send_go(&self, socket: impl AsFd, byte: u8) -> Result<(), CgroupError> {
        let files: Vec<BorrowedFd<'_>> = self.own_move.iter().map(|f| f.as_fd()).collect();
        // What `receive_go` has room for.
        if files.len() > MAX_GROUPS {
            return Err(CgroupError::TooManyToEnter(files.len()));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_GROUPS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !files.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&files)) {
            return Err(CgroupError::TooManyToEnter(files.len()));
        }
        let sent = rustix::net::sendmsg(
            socket,
            &[IoSlice::new(&[byte])],
            &mut control,
            SendFlags::NOSIGNAL,
        );
        match sent {
            Ok(_) => Ok(()),
            Err(e) if e == rustix::io::Errno::PIPE || e == rustix::io::Errno::CONNRESET => Ok(()),
            Err(e) => Err(CgroupError::Go(e.into())),
        }
    }
}

/// The most groups one launch makes (pids, memory, cpu, freezer: four).
const MAX_GROUPS: usize = 8;

/// The first process's side of `send_go`: the go byte and the `tasks`
/// files it moves itself through (`join_self_through`). Descriptors cut
/// short (too many, or not installed) are an error, never a partial entry.
pub(crate) fn receive_go(socket: impl AsFd) -> Result<(u8, Vec<File>), CgroupError> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_GROUPS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| CgroupError::Go(e.into()))?;
    let mut files = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            files.extend(rights.map(File::from));
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(CgroupError::EntryCut);
    }
    if received.bytes != 1 {
        return Err(CgroupError::Go(ErrorKind::UnexpectedEof.into()));
    }
    Ok((byte[0], files))
}

/// In the first process, single-threaded, once the launcher said go:
/// moves itself into the v1 groups through their `tasks` files (received
/// with the go byte, or inherited) and closes them, so nothing started
/// afterwards holds them.
pub(crate) fn join_self_through(files: Vec<File>) -> Result<(), CgroupError> {
    let count = files.len();
    for (i, tasks) in files.into_iter().enumerate() {
        move_self(tasks).map_err(|reason| CgroupError::MoveSelf {
            index: i + 1,
            count,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    fn entry_of(files: usize) -> CgroupEntry {
        let own_move = (0..files)
            .map(|_| File::options().write(true).open("/dev/null").unwrap())
            .collect();
        CgroupEntry {
            own_move,
            by_launcher: Vec::new(),
        }
    }

    #[test]
    fn the_go_byte_brings_every_file() {
        let (launcher, holder) = pair();
        entry_of(4).send_go(&launcher, 0x47).unwrap();
        let (byte, files) = receive_go(&holder).unwrap();
        assert_eq!((byte, files.len()), (0x47, 4));
    }

    #[test]
    fn more_groups_than_a_go_carries_are_refused_before_sending() {
        let (launcher, holder) = pair();
        let err = entry_of(MAX_GROUPS + 1).send_go(&launcher, 1).unwrap_err();
        assert!(matches!(err, CgroupError::TooManyToEnter(9)), "{err}");
        drop(launcher);
        // Nothing was sent: the holder sees the end, not a go.
        let err = receive_go(&holder).unwrap_err();
        assert!(
            matches!(err, CgroupError::Go(ref e) if e.kind() == ErrorKind::UnexpectedEof),
            "{err}"
        );
    }

    #[test]
    fn files_cut_short_are_refused_whole() {
        // More descriptors than the receiver has room for: the kernel
        // closes the rest and says so (MSG_CTRUNC).
        let (launcher, holder) = pair();
        let files: Vec<File> = (0..MAX_GROUPS + 8)
            .map(|_| File::options().write(true).open("/dev/null").unwrap())
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_GROUPS + 8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(
            &launcher,
            &[IoSlice::new(&[1])],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        assert!(matches!(receive_go(&holder), Err(CgroupError::EntryCut)));
    }

    #[test]
    fn a_holder_already_gone_is_not_the_launchers_error() {
        let (launcher, holder) = pair();
        drop(holder);
        entry_of(2).send_go(&launcher, 1).unwrap();
    }
}
