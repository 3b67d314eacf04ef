//! What the launcher opens for bwrap before it starts: every bind source
//! and protected path as a descriptor (in the staged namespace for a launch
//! by root), the helper, the seccomp programs in memfds.

use std::fs;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::hostid::SubordinateIds;
use crate::mounts::{
    MountError, MountReport, open_bind_source, open_source, protected_outcome, resolve_protected,
};
use crate::plan::{Access, LaunchPlan, MountStep};
use crate::supervise::LaunchError;

use super::argv::BwrapFds;

/// What the launcher opened for bwrap; kept alive until bwrap has started.
pub(super) struct Opened {
    pub(super) fds: BwrapFds,
    /// Owners of every descriptor in `fds` (bwrap inherits them).
    pub(super) keep: Vec<OwnedFd>,
    pub(super) mounts: MountReport,
}

/// The bind sources and protected paths of `plan`.
pub(super) fn open_mounts(plan: &LaunchPlan) -> Result<Opened, LaunchError> {
    let mut opened = Opened {
        fds: BwrapFds::default(),
        keep: Vec::new(),
        mounts: MountReport::default(),
    };
    let setup = |e: MountError| LaunchError::Setup(e.to_string());
    for step in &plan.mounts {
        let mut bind_fd = None;
        let mut protected = Vec::new();
        match step {
            MountStep::Bind {
                source, optional, ..
            } => match crate::socket_binds::open_bind_step(plan, step).map_err(setup)? {
                Some(src) => {
                    bind_fd = Some(src.fd.as_raw_fd());
                    opened.keep.push(src.fd);
                    opened.mounts.binds += 1;
                }
                None if *optional => opened
                    .mounts
                    .skipped_optional
                    .push(source.display().to_string()),
                None => {
                    return Err(setup(MountError::MissingSource {
                        path: source.clone(),
                    }));
                }
            },
            MountStep::Protect {
                source,
                target,
                relative,
                dir,
            } => {
                // A file bind has nothing below it to protect.
                if let Some(root) = open_bind_source(source, Access::Rw).map_err(setup)?
                    && root.is_dir
                {
                    let (steps, created) =
                        resolve_protected(&root.fd, source, relative, *dir).map_err(setup)?;
                    for step in steps {
                        protected.push((step.relative, step.fd.as_raw_fd(), step.leaf));
                        opened.keep.push(step.fd);
                    }
                    opened
                        .mounts
                        .protected
                        .push(protected_outcome(target, relative, created));
                }
            }
            _ => {}
        }
        opened.fds.binds.push(bind_fd);
        opened.fds.protected.push(protected);
    }
    Ok(opened)
}

/// `open_mounts` for a sandbox that runs as subordinate ids: in the staged
/// namespace (`stage`), as those ids (a protected path created there must
/// be created by an id the idmapped copy maps to its owner).
pub(super) fn open_mounts_staged(
    plan: &LaunchPlan,
    ids: &SubordinateIds,
) -> Result<(Opened, OwnedFd), LaunchError> {
    let staged = crate::stage::staged_plan(plan).map_err(|e| LaunchError::Setup(e.to_string()))?;
    let open_as_ids = || {
        keeping_parent_death_signal(|| {
            let uid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(ids.uid));
            let gid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(ids.gid));
            let opened = open_mounts(&staged);
            nix::unistd::setfsgid(gid);
            nix::unistd::setfsuid(uid);
            opened
        })
    };
    let (opened, staged_ns) = crate::stage::open_in_staged(plan, ids, open_as_ids)
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    let mut opened = opened?;
    crate::stage::report_host_paths(plan, &mut opened.mounts);
    Ok((opened, staged_ns))
}

/// Runs `f`, which changes the thread's filesystem ids, and gives the
/// launcher its parent-death signal back: the kernel clears it on any
/// change of credentials (the daemon's `--die-with-parent` would be lost,
/// and a turn would outlive a daemon killed by SIGKILL). A parent that
/// died in between is answered with the signal at once.
fn keeping_parent_death_signal<T>(f: impl FnOnce() -> T) -> T {
    let signal = nix::sys::prctl::get_pdeathsig().ok().flatten();
    let parent = nix::unistd::getppid();
    let result = f();
    if let Some(signal) = signal {
        let _ = nix::sys::prctl::set_pdeathsig(signal);
        if nix::unistd::getppid() != parent {
            let _ = nix::sys::signal::raise(signal);
        }
    }
    result
}

/// Adds what bwrap runs to `opened`: the helper and the seccomp programs.
pub(super) fn open_helper_and_filters(
    opened: &mut Opened,
    programs: &[Vec<u8>],
    helper_path: &Path,
) -> Result<(), LaunchError> {
    let setup = |e: MountError| LaunchError::Setup(e.to_string());
    let helper = open_source(helper_path).map_err(setup)?.ok_or_else(|| {
        LaunchError::Setup(format!(
            "the bwrap backend's helper {} is missing: install it beside this launcher \
             (`cargo build --release` builds both)",
            helper_path.display()
        ))
    })?;
    opened.fds.helper = helper.fd.as_raw_fd();
    opened.keep.push(helper.fd);
    for program in programs {
        let memfd = memfd_with("substrat-seccomp", program)?;
        opened.fds.seccomp.push(memfd.as_raw_fd());
        opened.keep.push(memfd);
    }
    Ok(())
}

/// A close-on-exec memfd holding `bytes`, read from its start.
pub(super) fn memfd_with(name: &str, bytes: &[u8]) -> Result<OwnedFd, LaunchError> {
    let memfd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| LaunchError::Sys("memfd_create", e))?;
    let mut file = fs::File::from(memfd);
    file.write_all(bytes)
        .and_then(|_| file.rewind())
        .map_err(|e| LaunchError::Setup(format!("memfd {name}: {e}")))?;
    Ok(OwnedFd::from(file))
}
