//! The namespaces of the host a native sandbox joins by path (an
//! engine's or a pod's network, ipc and uts), never the host's own.

use std::os::fd::OwnedFd;

use nix::sched::CloneFlags;

use crate::plan::LaunchPlan;
use crate::supervise::Status;

/// Joins the plan's namespaces of the host (an engine's or a pod's), each
/// opened by path. One that is the launcher's own (the host's, for an
/// engine's launcher) or pid 1's is refused: joining it would leave the
/// container in the host's network (a bundle naming `/proc/1/ns/net`).
pub(crate) fn join_namespaces(plan: &LaunchPlan) -> Result<(), Status> {
    use crate::plan::JoinedKind;
    for joined in &plan.joined {
        let (flag, name) = match joined.kind {
            JoinedKind::Net => (CloneFlags::CLONE_NEWNET, "net"),
            JoinedKind::Ipc => (CloneFlags::CLONE_NEWIPC, "ipc"),
            JoinedKind::Uts => (CloneFlags::CLONE_NEWUTS, "uts"),
        };
        let failed = |e: String| {
            Status::Failed(format!(
                "cannot join the {:?} namespace at {}: {e}",
                joined.kind,
                joined.path.display()
            ))
        };
        // Not O_NOFOLLOW: engines name /proc/PID/ns/net, a magic link.
        let how = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(&joined.path, how, nix::sys::stat::Mode::empty())
            .map_err(|e| failed(e.to_string()))?;
        if let Some(whose) = host_namespace(&fd, name).map_err(|e| failed(e.to_string()))? {
            return Err(failed(format!(
                "it is {whose} {name} namespace (the host's): refused, the container \
                 would share it"
            )));
        }
        nix::sched::setns(fd, flag).map_err(|e| failed(e.to_string()))?;
    }
    Ok(())
}

/// Whose namespace `fd` is when it is this process's own (`/proc/self/ns`)
/// or pid 1's: the same device and inode. Pid 1's is skipped when it
/// cannot be read.
fn host_namespace(fd: &OwnedFd, name: &str) -> nix::Result<Option<&'static str>> {
    let opened = nix::sys::stat::fstat(fd)?;
    let own = nix::sys::stat::stat(format!("/proc/self/ns/{name}").as_str())?;
    let same =
        |st: &nix::sys::stat::FileStat| st.st_dev == opened.st_dev && st.st_ino == opened.st_ino;
    if same(&own) {
        return Ok(Some("the launcher's own"));
    }
    match nix::sys::stat::stat(format!("/proc/1/ns/{name}").as_str()) {
        Ok(init) if same(&init) => Ok(Some("pid 1's")),
        _ => Ok(None),
    }
}
