//! The workspace as an overlay (`workspace_mode = overlay`): the host
//! tree is the lowest, read-only layer; earlier turns' upper directories
//! sit above it, read-only; this launch's upper takes every write. Mounted
//! by init in the sandbox's user namespace in place of the workspace's
//! read-write bind, so the host tree is never written.
//!
//! Every directory is opened (O_PATH, no symlink followed) before the
//! first mount and named to overlayfs as /proc/self/fd/N: no path in the
//! mount options can be changed meanwhile, and none needs escaping (a
//! comma or colon in a host path would split the options).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::mount::{MsFlags, mount};

use crate::mounts::{MountError, Source, make_mount_point_for};
use crate::plan::LayerDirs;

/// The layer directories of a launch, opened.
#[derive(Debug)]
pub struct OpenedLayers {
    /// Newest first.
    frozen: Vec<OwnedFd>,
    upper: OwnedFd,
    work: OwnedFd,
}

/// Opens the layer's directories: each a directory reached from the root
/// without following a symlink (the launcher made them; nothing inside the
/// sandbox ever sees them).
pub fn open_layers(dirs: &LayerDirs) -> Result<OpenedLayers, MountError> {
    let open = |path: &Path| -> Result<OwnedFd, MountError> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(nix::fcntl::AT_FDCWD, path, how).map_err(|errno| MountError::Sys {
            what: "open a workspace layer directory",
            path: path.to_path_buf(),
            errno,
        })
    };
    Ok(OpenedLayers {
        frozen: dirs
            .frozen
            .iter()
            .map(|p| open(p))
            .collect::<Result<_, _>>()?,
        upper: open(&dirs.upper)?,
        work: open(&dirs.work)?,
    })
}

/// The overlayfs options naming each layer by descriptor. `userxattr`:
/// in a user namespace overlayfs keeps its whiteout and opaque marks in
/// `user.overlay.*` (the `trusted.*` ones need host privilege).
fn options(lower: &Source, layers: &OpenedLayers) -> String {
    let fd = |fd: &OwnedFd| format!("/proc/self/fd/{}", fd.as_raw_fd());
    let lowers: Vec<String> = layers
        .frozen
        .iter()
        .map(fd)
        .chain(std::iter::once(fd(&lower.fd)))
        .collect();
    format!(
        "userxattr,lowerdir={},upperdir={},workdir={}",
        lowers.join(":"),
        fd(&layers.upper),
        fd(&layers.work)
    )
}

/// Mounts the overlay at `dest` (nosuid, nodev like every bind).
pub(crate) fn mount_overlay(
    lower: &Source,
    layers: &OpenedLayers,
    dest: &Path,
) -> Result<(), MountError> {
    make_mount_point_for(dest, true)?;
    let data = options(lower, layers);
    mount(
        Some("overlay"),
        dest,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|errno| match errno {
        nix::errno::Errno::EINVAL | nix::errno::Errno::ENODEV | nix::errno::Errno::EPERM => {
            MountError::Unsupported {
                what: "an overlayfs mount in the sandbox's user namespace (Linux 5.11 or later \
                       with overlayfs, the layer on a filesystem that supports user xattrs); \
                       use workspace mode `direct`",
                path: dest.to_path_buf(),
            }
        }
        errno => MountError::Sys {
            what: "mount the workspace overlay",
            path: dest.to_path_buf(),
            errno,
        },
    })
}
