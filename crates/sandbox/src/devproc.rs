//! The sandbox's /dev and /proc: a tmpfs with the host's harmless device
//! nodes bound in, a private devpts instance, /dev/shm and the usual
//! links; a new procfs for the pid namespace (or the host's, read-only,
//! without one). Made by `mounts::build_root` after the policy's mounts,
//! so a policy cannot hide them.

use std::path::Path;

use nix::mount::{MsFlags, mount};

use crate::mounts::{MountError, Source, bind, fd_path, io, make_mount_point, sys, tmpfs};
use crate::plan::Access;

pub(crate) fn build_dev(
    dev: &Path,
    devices: &[(String, Option<Source>)],
    max_ptys: u32,
) -> Result<(), MountError> {
    tmpfs(dev, 0o755, MsFlags::MS_NOEXEC)?;
    for (name, source) in devices {
        if let Some(source) = source {
            let dest = dev.join(name);
            make_mount_point(&dest, false)?;
            mount(
                Some(&fd_path(&source.fd)),
                &dest,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(sys("bind device", &dest))?;
        }
    }
    let pts = dev.join("pts");
    make_mount_point(&pts, true)?;
    // A private devpts instance: the sandbox sees only its own ptys, and
    // opens at most `max_ptys` of the host's pool (ENOSPC past it).
    let options = format!("newinstance,ptmxmode=0666,mode=620,max={max_ptys}");
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .map_err(sys("mount devpts", &pts))?;
    tmpfs(&dev.join("shm"), 0o1777, MsFlags::MS_NOEXEC)?;
    let links = [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ];
    for (name, to) in links {
        std::os::unix::fs::symlink(to, dev.join(name))
            .map_err(|e| io(e, "symlink", &dev.join(name)))?;
    }
    Ok(())
}

/// A new procfs for the new pid namespace; without one (pid = false) the
/// host's /proc is bound read-only instead.
pub(crate) fn mount_proc(dest: &Path, host_proc: Option<&Source>) -> Result<(), MountError> {
    match host_proc {
        Some(source) => bind(source, dest, Access::Ro),
        None => {
            make_mount_point(dest, true)?;
            mount(
                Some("proc"),
                dest,
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(sys("mount proc", dest))
        }
    }
}
