//! Opening a path beneath a directory descriptor, whatever its length.
//!
//! One `openat2` with RESOLVE_BENEATH, NO_SYMLINKS and NO_MAGICLINKS
//! opens a short path; a path near or past PATH_MAX (4096 bytes, which a
//! tree an agent made one `mkdir` at a time can exceed) is opened in
//! chunks of whole components, each chunk one such `openat2` from the
//! directory the last one opened. Every chunk is resolved beneath its own
//! start, so the whole is beneath the root, and no symlink is followed on
//! the way or at the end.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

pub(crate) const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// The most bytes one `openat2` is given: well below PATH_MAX.
pub(crate) const CHUNK: usize = 3000;

/// Opens `rel` beneath `root` with `flags` (NOFOLLOW and CLOEXEC added);
/// `None` when it, or a directory on its way, is not there (or is a
/// symlink, or would leave `root`). The empty path is `root` itself.
pub(crate) fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
) -> io::Result<Option<OwnedFd>> {
    let bytes = rel.as_os_str().as_bytes();
    if bytes.len() < CHUNK {
        let rel = if bytes.is_empty() {
            Path::new(".")
        } else {
            rel
        };
        return once(root, rel, flags);
    }
    let mut dir: Option<OwnedFd> = None;
    let mut rest = bytes;
    while rest.len() >= CHUNK {
        // Cut after the last whole name that fits (a name is at most 255
        // bytes, so there is one; an absolute path fails beneath anyway).
        let cut = rest[..CHUNK].iter().rposition(|b| *b == b'/').unwrap_or(0);
        let from = dir.as_ref().map_or(root, AsFd::as_fd);
        let head = Path::new(OsStr::from_bytes(&rest[..cut]));
        match once(from, head, OFlags::PATH | OFlags::DIRECTORY)? {
            Some(next) => dir = Some(next),
            None => return Ok(None),
        }
        rest = &rest[cut + 1..];
    }
    let from = dir.as_ref().map_or(root, AsFd::as_fd);
    let rest = match rest {
        [] => Path::new("."),
        _ => Path::new(OsStr::from_bytes(rest)),
    };
    once(from, rest, flags)
}

/// One `openat2`, retried when a rename elsewhere made it give up.
fn once(root: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<Option<OwnedFd>> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            root,
            rel,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        ) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => return Ok(None),
            Err(Errno::AGAIN | Errno::INTR) if tries < 8 => tries += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `rel`'s parent directory and last name (`.` for the empty path).
pub(crate) fn split(rel: &Path) -> (&Path, &OsStr) {
    (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().unwrap_or(OsStr::new(".")),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::path::PathBuf;

    #[test]
    fn long_paths_open_in_chunks_and_no_link_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = rustix::fs::open(dir.path(), OFlags::PATH, Mode::empty()).unwrap();
        let mut fd = rustix::fs::open(dir.path(), OFlags::RDONLY, Mode::empty()).unwrap();
        let name = "x".repeat(200);
        let mut rel = PathBuf::new();
        for _ in 0..40 {
            rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o700)).unwrap();
            fd = rustix::fs::openat(&fd, name.as_str(), OFlags::RDONLY, Mode::empty()).unwrap();
            rel.push(&name);
        }
        rustix::fs::symlinkat("/", &fd, "up").unwrap();
        assert!(rel.as_os_str().len() > 8000);
        let found = open_beneath(root.as_fd(), &rel, OFlags::PATH)
            .unwrap()
            .unwrap();
        let (a, b) = (
            rustix::fs::fstat(&found).unwrap(),
            rustix::fs::fstat(&fd).unwrap(),
        );
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        // A link is never opened as a file (O_PATH would open the link
        // itself, as `lookup` wants).
        let link = open_beneath(root.as_fd(), &rel.join("up"), OFlags::RDONLY).unwrap();
        assert!(link.is_none());
        let through = rel.join("up").join("etc");
        assert!(
            open_beneath(root.as_fd(), &through, OFlags::PATH)
                .unwrap()
                .is_none()
        );
        assert!(
            open_beneath(root.as_fd(), &rel.join("none"), OFlags::PATH)
                .unwrap()
                .is_none()
        );
        let escape = rel.join("../".repeat(45));
        assert!(
            open_beneath(root.as_fd(), &escape, OFlags::PATH)
                .unwrap()
                .is_none()
        );
        assert!(
            open_beneath(root.as_fd(), Path::new(""), OFlags::PATH)
                .unwrap()
                .is_some()
        );
    }
}
