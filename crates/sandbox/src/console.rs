//! The command's terminal, made inside the sandbox (`substrat-oci create
//! --console-socket`): init opens the sandbox's own `/dev/ptmx` once its
//! /dev is mounted, so the terminal is one of the sandbox's devpts (the
//! command's `tty` names it, `/dev/pts/0`), sends its master to the
//! engine over the console socket (SCM_RIGHTS, the terminal's name as the
//! message, as runc does) and makes the slave its stdin, stdout and
//! stderr, which the command inherits and takes as its controlling
//! terminal (`LaunchPlan::terminal`). Before Landlock and seccomp.
//! `substrat-oci exec --console-socket` makes its process's terminal the
//! same way, in the child `join` forks once inside the sandbox's
//! namespaces, as the sandbox's ids and without capabilities
//! (`join::exec_in`).

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
use rustix::pty::{OpenptFlags, openpt, ptsname, unlockpt};
use rustix::termios::{Winsize, tcsetwinsize};

use crate::inside::SetupError;

/// The engine's console socket, connected, and the terminal's size.
#[derive(Debug)]
pub struct Console {
    pub socket: OwnedFd,
    /// Rows and columns, when the configuration gives them.
    pub size: Option<(u16, u16)>,
}

/// Makes the terminal (see the module's doc); init's stdio is its slave.
pub(crate) fn take_terminal(console: &Console) -> Result<(), SetupError> {
    let io = |what: &'static str| {
        move |e: rustix::io::Errno| SetupError::Io {
            what,
            source: e.into(),
        }
    };
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(io("open the sandbox's /dev/ptmx"))?;
    unlockpt(&master).map_err(io("unlock the terminal"))?;
    let name = ptsname(&master, Vec::new()).map_err(io("name the terminal"))?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open the terminal"))?;
    if let Some((rows, cols)) = console.size {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        tcsetwinsize(&master, size).map_err(io("size the terminal"))?;
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [master.as_fd()];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(SetupError::Io {
            what: "send the terminal",
            source: std::io::Error::other("no room for the descriptor"),
        });
    }
    sendmsg(
        &console.socket,
        &[IoSlice::new(name.as_bytes())],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(io("send the terminal to the console socket"))?;
    rustix::stdio::dup2_stdin(&slave).map_err(io("make the terminal stdin"))?;
    rustix::stdio::dup2_stdout(&slave).map_err(io("make the terminal stdout"))?;
    rustix::stdio::dup2_stderr(&slave).map_err(io("make the terminal stderr"))?;
    Ok(())
}
