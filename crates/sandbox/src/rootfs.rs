//! A plan whose first mount binds a root filesystem at `/` (an OCI
//! bundle's rootfs, `substrat-oci`): every later mount goes inside a tree
//! that is not ours. Its symlinks are the image's, or what an earlier run
//! of a writable root left there, so a mount target is resolved as if that
//! tree were `/` (`/var/run -> /run` works, a link to a host path does not
//! leave the tree), the components that are missing are created one at a
//! time below the resolved parent, and the mount is made at the path the
//! resolution ended on. Before pivot_root, in init.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, open, openat2, readlink, readlinkat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};

use nix::mount::{MsFlags, mount};

use crate::mounts::MountError;
use crate::plan::{Access, LaunchPlan, MountStep};

/// Whether the plan's first mount is a root filesystem bound at `/`.
pub fn has_root_bind(plan: &LaunchPlan) -> bool {
    matches!(plan.mounts.first(), Some(MountStep::Bind { target, .. }) if target == Path::new("/"))
}

fn sys_error(what: &'static str, path: &Path) -> impl Fn(Errno) -> MountError + use<> {
    let path = path.to_path_buf();
    move |errno| MountError::Sys {
        what,
        path: path.clone(),
        errno,
    }
}

/// More links than this on the way to one target is a loop (as in path
/// resolution by the kernel).
const MAX_LINKS: usize = 40;

/// The path (in init's current tree) at which `target` (absolute, inside
/// the root filesystem mounted at `root`) is mounted onto, creating what is
/// missing: directories, and the leaf as an empty file unless `dir`.
///
/// Resolved one component at a time from the root filesystem's descriptor:
/// a link is read and its target spliced in (an absolute one from the root
/// filesystem's top, `..` never above it), so a dangling link (an image's
/// `/etc/resolv.conf -> ../run/...`) gets its target made inside the tree.
/// Each step opens beneath the last without following anything.
pub fn resolve_in_root(root: &Path, target: &Path, dir: bool) -> Result<PathBuf, MountError> {
    let missing = Missing::Create { dir };
    resolve(root, target, missing).map(|found| found.map_or_else(PathBuf::new, |(path, _)| path))
}

/// The path `target` resolves to in the root filesystem and whether it is
/// a directory; None when something on the way is missing (nothing made).
pub fn existing_in_root(root: &Path, target: &Path) -> Result<Option<(PathBuf, bool)>, MountError> {
    resolve(root, target, Missing::Skip)
}

/// What to do with a missing component.
#[derive(Clone, Copy)]
enum Missing {
    /// Make it: directories, and the leaf a file unless `dir`.
    Create { dir: bool },
    /// Stop: there is nothing there.
    Skip,
}

fn resolve(
    root: &Path,
    target: &Path,
    missing: Missing,
) -> Result<Option<(PathBuf, bool)>, MountError> {
    let root_fd = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys_error("open the root filesystem", root))?;
    let mut pending: VecDeque<OsString> = parts(target).collect();
    let mut resolved = PathBuf::new();
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let parent = open_beneath_root(&root_fd, &resolved, OFlag::O_DIRECTORY)?;
        let last = pending.is_empty();
        match fstatat(
            parent.as_fd(),
            part.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(stat)
                if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK =>
            {
                links += 1;
                if links > MAX_LINKS {
                    return Err(sys_error("resolve mount target", target)(Errno::ELOOP));
                }
                let link = PathBuf::from(
                    readlinkat(parent.as_fd(), part.as_os_str())
                        .map_err(sys_error("read a link on the way to", target))?,
                );
                if link.is_absolute() {
                    resolved = PathBuf::new();
                }
                for spliced in parts(&link).collect::<Vec<_>>().into_iter().rev() {
                    pending.push_front(spliced);
                }
            }
            Ok(_) => resolved.push(&part),
            Err(Errno::ENOENT) => match missing {
                Missing::Create { dir } => {
                    create(&parent, &part, !last || dir)
                        .map_err(sys_error("create mount point", target))?;
                    resolved.push(&part);
                }
                Missing::Skip => return Ok(None),
            },
            Err(errno) => return Err(sys_error("resolve mount target", target)(errno)),
        }
    }
    let leaf = open_beneath_root(&root_fd, &resolved, OFlag::empty())?;
    let real = readlink(&crate::mounts::fd_path(&leaf))
        .map_err(sys_error("read the resolved mount target", target))?;
    let is_dir = nix::sys::stat::fstat(&leaf)
        .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
        .map_err(sys_error("stat the resolved mount target", target))?;
    Ok(Some((PathBuf::from(real), is_dir)))
}

/// A path's names and `..`s, in order (`.` and the root dropped).
fn parts(path: &Path) -> impl Iterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(part) => Some(part.to_os_string()),
        Component::ParentDir => Some(OsString::from("..")),
        _ => None,
    })
}

/// Opens `relative` (made of resolved components only) beneath the root
/// filesystem, following nothing.
fn open_beneath_root(
    root_fd: &OwnedFd,
    relative: &Path,
    flags: OFlag,
) -> Result<OwnedFd, MountError> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let path = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    openat2(root_fd.as_fd(), path, how).map_err(sys_error("resolve mount target", relative))
}

/// A missing mount point: a directory, or an empty file; never through a
/// link (one put there since is refused: EEXIST).
fn create(parent: &OwnedFd, name: &OsString, dir: bool) -> nix::Result<()> {
    if dir {
        return mkdirat(
            parent.as_fd(),
            name.as_os_str(),
            Mode::from_bits_truncate(0o755),
        );
    }
    let how = OpenHow::new()
        .flags(
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        )
        .mode(Mode::from_bits_truncate(0o644));
    openat2(parent.as_fd(), name.as_os_str(), how).map(drop)
}

/// The steps only a root filesystem has: a new sysfs (read-only) or mqueue
/// at their target, masked paths, read-only paths. `devices` are the host
/// nodes opened for /dev (a masked file is covered by /dev/null).
pub(crate) fn mount_in_root(
    root: &Path,
    step: &MountStep,
    devices: &[(String, Option<crate::mounts::Source>)],
) -> Result<(), MountError> {
    let hidden = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    match step {
        MountStep::Sysfs { target } => {
            let dest = resolve_in_root(root, target, true)?;
            mount(
                Some("sysfs"),
                &dest,
                Some("sysfs"),
                hidden | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(sys_error("mount sysfs", &dest))
        }
        MountStep::Mqueue { target } => {
            let dest = resolve_in_root(root, target, true)?;
            mount(Some("mqueue"), &dest, Some("mqueue"), hidden, None::<&str>)
                .map_err(sys_error("mount mqueue", &dest))
        }
        MountStep::Empty { target } => {
            let dest = resolve_in_root(root, target, true)?;
            crate::mounts::tmpfs(&dest, 0o555, MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC)
        }
        MountStep::Mask { target } => match existing_in_root(root, target)? {
            None => Ok(()),
            Some((dest, true)) => {
                crate::mounts::tmpfs(&dest, 0o555, MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC)
            }
            Some((dest, false)) => {
                let null = devices
                    .iter()
                    .find_map(|(name, source)| {
                        (name == "null").then_some(source.as_ref()).flatten()
                    })
                    .ok_or_else(|| MountError::MissingSource {
                        path: "/dev/null".into(),
                    })?;
                crate::mounts::bind(null, &dest, Access::Ro)
            }
        },
        MountStep::ReadOnly { target } => match existing_in_root(root, target)? {
            None => Ok(()),
            Some((dest, _)) => match crate::mounts::open_source(&dest)? {
                Some(source) => crate::mounts::bind(&source, &dest, Access::Ro),
                None => Ok(()),
            },
        },
        _ => Ok(()),
    }
}
