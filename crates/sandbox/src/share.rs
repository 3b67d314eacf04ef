//! The launcher in its sandbox's namespaces while the sandbox runs
//! (`RunOptions::share_namespaces`, `substrat-oci`): an engine takes the
//! pid the runtime reports for the container's and reaches the container
//! through it (a pod's other containers joined to its `/proc/PID/ns/net`,
//! ipc and uts; `podman cp` through its mount namespace and
//! `/proc/PID/root`), so every namespace those name must be the sandbox's.
//! The launcher goes back to its own mount and cgroup namespaces before it
//! cleans up on the host. Its pid and user namespaces stay the host's:
//! joining those would change only its children, or take its privileges.

use std::os::fd::OwnedFd;

use nix::fcntl::{OFlag, open};
use nix::sched::{CloneFlags, setns};
use nix::sys::stat::Mode;
use nix::unistd::Pid;

/// What the launcher needs to come back: its own mount and cgroup
/// namespaces and working directory.
#[derive(Debug)]
pub(crate) struct Shared {
    mount: OwnedFd,
    cgroup: OwnedFd,
    cwd: OwnedFd,
}

fn open_ns(pid: &str, name: &str) -> nix::Result<OwnedFd> {
    let path = format!("/proc/{pid}/ns/{name}");
    open(
        path.as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Joins the namespaces of the sandbox whose holder is `holder` and init
/// `init` (the cgroup namespace is init's own); None when one could not be
/// joined (the caller ends the sandbox: its pid would name the host's).
pub(crate) fn enter(holder: Pid, init: Pid) -> Option<Shared> {
    let shared = Shared {
        mount: open_ns("self", "mnt").ok()?,
        cgroup: open_ns("self", "cgroup").ok()?,
        cwd: open(
            ".",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?,
    };
    let (holder, init) = (holder.to_string(), init.to_string());
    let joins = [
        (&holder, "net", CloneFlags::CLONE_NEWNET),
        (&holder, "ipc", CloneFlags::CLONE_NEWIPC),
        (&holder, "uts", CloneFlags::CLONE_NEWUTS),
        (&init, "cgroup", CloneFlags::CLONE_NEWCGROUP),
        // Last: it moves the root and working directory into the sandbox.
        (&holder, "mnt", CloneFlags::CLONE_NEWNS),
    ];
    for (pid, name, flag) in joins {
        let fd = open_ns(pid, name).ok()?;
        if setns(fd, flag).is_err() {
            leave(shared);
            return None;
        }
    }
    Some(shared)
}

/// Back to the launcher's own mount and cgroup namespaces and directory.
pub(crate) fn leave(shared: Shared) {
    let _ = setns(shared.mount, CloneFlags::CLONE_NEWNS);
    let _ = setns(shared.cgroup, CloneFlags::CLONE_NEWCGROUP);
    let _ = nix::unistd::fchdir(&shared.cwd);
}

/// The first child of `pid` (the holder's is the sandbox's init).
pub(crate) fn first_child(pid: Pid) -> Option<Pid> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Pid::from_raw)
}
