//! A launch with a layer quota: the overlay's upper directory is a tmpfs
//! of the quota's size, mounted by the holder over the turn's directory in
//! the sandbox's own mount namespace (the host never sees it), so writes
//! beyond the quota fail with ENOSPC inside and nothing else notices. When
//! the command has ended, the holder copies what it wrote into the turn's
//! upper directory on the host, as overlayfs left it: files, directories
//! with their opaque marks, symlinks, FIFOs and whiteouts.
//!
//! The copy reads a tree the command wrote: every step is relative to a
//! directory descriptor and follows no symlink; sockets are not kept (no
//! content to keep); hard links become separate files.

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::mounts::MountError;
use crate::plan::LayerDirs;

const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// The tmpfs upper of a launch and the host directory its writes go to.
#[derive(Debug)]
pub struct QuotaUpper {
    host_upper: OwnedFd,
    tmpfs_upper: OwnedFd,
}

fn sys<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> MountError + 'a {
    move |errno| MountError::Sys {
        what,
        path: path.to_path_buf(),
        errno: nix::errno::Errno::from_raw(errno.raw_os_error()),
    }
}

/// In the holder, in the sandbox's new mount namespace (made private here
/// first, so nothing propagates to the host's): the host's upper opened,
/// then a tmpfs of `quota` bytes over the turn's directory, holding the
/// `upper` and `work` that init will open by the same paths.
pub(crate) fn mount_quota_upper(dirs: &LayerDirs, quota: u64) -> Result<QuotaUpper, MountError> {
    let open_dir = |path: &Path| {
        rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            rustix::fs::ResolveFlags::NO_SYMLINKS,
        )
        .map_err(sys("open the layer directory", path))
    };
    let host_upper = open_dir(&dirs.upper)?;
    let turn = dirs.upper.parent().unwrap_or(&dirs.upper);
    crate::mounts::make_private().map_err(|errno| MountError::Sys {
        what: "make the mount namespace private",
        path: "/".into(),
        errno,
    })?;
    // tmpfs reads `size=0` as no limit: a quota used up still gets the
    // smallest tmpfs, one page. Inodes cost memory outside `size`: one per
    // 256 bytes of quota.
    let quota = quota.max(4096);
    let inodes = (quota / 256).clamp(1024, 1 << 20);
    let data = format!("size={quota},nr_inodes={inodes},mode=700");
    nix::mount::mount(
        Some("tmpfs"),
        turn,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|errno| MountError::Sys {
        what: "mount the layer's tmpfs",
        path: turn.to_path_buf(),
        errno,
    })?;
    for dir in [&dirs.upper, &dirs.work] {
        fs::create_dir(dir).map_err(|e| MountError::Sys {
            what: "make the layer's tmpfs directories",
            path: dir.clone(),
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
    }
    let tmpfs_upper = open_dir(&dirs.upper)?;
    Ok(QuotaUpper {
        host_upper,
        tmpfs_upper,
    })
}

impl QuotaUpper {
    /// After the sandbox has ended: the tmpfs upper copied into the host's.
    pub(crate) fn keep(&self) -> Result<(), String> {
        copy_dir(
            self.tmpfs_upper.as_fd(),
            self.host_upper.as_fd(),
            Path::new(""),
        )
    }
}

fn copy_dir(from: BorrowedFd<'_>, to: BorrowedFd<'_>, at: &Path) -> Result<(), String> {
    let err = |e: Errno| format!("list {}: {e}", at.display());
    let listing = rustix::fs::openat(
        from,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)?;
    let mut dir = rustix::fs::Dir::new(listing).map_err(err)?;
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(err)?;
        let name = entry.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        copy_entry(from, to, &name, at)?;
    }
    Ok(())
}

/// One entry of `from` made again in `to`, as the kind it is.
fn copy_entry(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    name: &CStr,
    at: &Path,
) -> Result<(), String> {
    let shown = at.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let err = |what: &'static str| {
        let shown = shown.clone();
        move |e: Errno| format!("{what} {}: {e}", shown.display())
    };
    let st = rustix::fs::statat(from, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err("stat"))?;
    let mode = Mode::from_raw_mode(st.st_mode & 0o777);
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            rustix::fs::mkdirat(to, name, Mode::from_raw_mode(0o700)).map_err(err("make"))?;
            let open = |fd| {
                rustix::fs::openat(
                    fd,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            };
            let sub_from = open(from).map_err(err("open"))?;
            let sub_to = open(to).map_err(err("open the copy of"))?;
            let mut opaque = [0u8; 4];
            if matches!(rustix::fs::fgetxattr(&sub_from, OPAQUE_XATTR, &mut opaque), Ok(1) if opaque[0] == b'y')
            {
                rustix::fs::fsetxattr(&sub_to, OPAQUE_XATTR, b"y", rustix::fs::XattrFlags::empty())
                    .map_err(err("mark opaque"))?;
            }
            copy_dir(sub_from.as_fd(), sub_to.as_fd(), &shown)?;
            rustix::fs::fchmod(&sub_to, mode).map_err(err("set the mode of"))
        }
        FileType::RegularFile => {
            let src = rustix::fs::openat(
                from,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(err("open"))?;
            let flags =
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let dst = rustix::fs::openat(to, name, flags, mode).map_err(err("make"))?;
            let (src, dst) = (fs::File::from(src), fs::File::from(dst));
            // Holes kept: a sparse file in the quota's tmpfs costs it
            // nothing, and must not fill the host's disk with zeros here.
            substrat_layer::copy_sparse(&src, &dst)
                .map_err(|e| format!("copy {}: {e}", shown.display()))?;
            rustix::fs::fchmod(&dst, mode).map_err(err("set the mode of"))
        }
        FileType::Symlink => {
            let target = rustix::fs::readlinkat(from, name, Vec::new()).map_err(err("read"))?;
            rustix::fs::symlinkat(target.as_c_str(), to, name).map_err(err("make"))
        }
        // A whiteout: deleted below.
        FileType::CharacterDevice if st.st_rdev == 0 => {
            rustix::fs::mknodat(to, name, FileType::CharacterDevice, Mode::empty(), 0)
                .map_err(err("make the whiteout"))
        }
        FileType::Fifo => {
            rustix::fs::mknodat(to, name, FileType::Fifo, mode, 0).map_err(err("make"))
        }
        // Sockets have nothing to keep; nothing else can be made inside.
        _ => Ok(()),
    }
}
