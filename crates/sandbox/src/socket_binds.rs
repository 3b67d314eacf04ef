//! A Unix socket as a bind's source. Landlock before ABI 9 has no right
//! for connect(2) to a pathname socket: a socket in the view is reachable
//! whatever the rules say, so one comes in only where a policy says so (a
//! bind marked `socket = true`) or the launcher puts it (the broker,
//! proxy and gateway sockets). Judged on the opened source: symlinks
//! followed exactly as the launch follows them.

use std::path::{Path, PathBuf};

use nix::sys::stat::{SFlag, fstat};

use crate::mounts::{MountError, Source, fd_path, open_plan_source, sys};
use crate::plan::{LaunchPlan, MountStep, SocketUse};

/// A policy's bind whose source is a socket, not marked as one.
#[derive(Debug, thiserror::Error)]
#[error(
    "bind source {source}{via} is a Unix socket, which the command could connect to; \
     refusing. If the command should reach the service behind it, mark the bind \
     `socket = true` in the policy (filesystem.binds: {{ source = \"{source}\", target = \"{target}\", ..., socket = true }})",
    source = .path.display(),
    target = .target.display(),
    via = .resolved.as_ref().map(|r| format!(" (resolved to {})", r.display())).unwrap_or_default()
)]
pub struct SocketRefused {
    /// The bind's source as the plan has it.
    pub path: PathBuf,
    pub target: PathBuf,
    /// Where the source led, when not to itself (a link to the socket).
    pub resolved: Option<PathBuf>,
}

/// `open_plan_source` for a bind step of `plan` (none for another step),
/// refusing a socket as the source of a bind that may not be one
/// (`SocketUse::Refuse`).
pub(crate) fn open_bind_step(
    plan: &LaunchPlan,
    step: &MountStep,
) -> Result<Option<Source>, MountError> {
    let MountStep::Bind {
        source,
        target,
        access,
        socket,
        ..
    } = step
    else {
        return Ok(None);
    };
    let opened = open_plan_source(plan, source, *access)?;
    if let Some(src) = &opened
        && *socket == SocketUse::Refuse
        && is_socket(src, source)?
    {
        let resolved = std::fs::read_link(fd_path(&src.fd))
            .ok()
            .filter(|r| r != source);
        return Err(MountError::Socket(SocketRefused {
            path: source.clone(),
            target: target.clone(),
            resolved,
        }));
    }
    Ok(opened)
}

fn is_socket(src: &Source, path: &Path) -> Result<bool, MountError> {
    let st = fstat(&src.fd).map_err(sys("stat", path))?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFSOCK)
}
