//! Reading one turn's upper directory as overlayfs left it: files,
//! directories (opaque ones hide everything below them in lower layers),
//! symlinks, whiteouts (character device 0:0: deleted below), and anything
//! else the agent made (FIFOs, sockets, other devices), which is listed
//! and never applied.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat};

use crate::LayerError;
use crate::beneath::open_beneath;
use crate::changes::{Node, NodeKind, Source};
use crate::walk::{Back, Visit, walk};

/// What one path of an upper directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    Present(Node),
    /// An opaque directory: nothing of the lower layers shows below it.
    OpaqueDir(Node),
    Whiteout,
}

impl Entry {
    /// Whether lower layers still show below this path.
    pub(crate) fn merges_below(&self) -> bool {
        matches!(self, Entry::Present(node) if node.kind == NodeKind::Dir)
    }
}

/// The xattr overlayfs sets (with `userxattr`) on an opaque directory.
const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Every path below `upper` (turn `turn`'s), relative, with what it is,
/// in path order (a directory first, then what is below it).
pub(crate) fn scan_upper(upper: &Path, turn: u32) -> Result<Vec<(PathBuf, Entry)>, LayerError> {
    let root = open_dir(upper)?;
    let mut scan = Scan {
        turn,
        upper,
        out: Vec::new(),
    };
    walk(root.as_fd(), upper, Back::Parent, &mut scan)?;
    Ok(scan.out)
}

/// How deep a layer is reviewed: a directory at this depth or path length
/// is one entry, listed and never applied, and nothing below it is read.
/// An agent can make a chain of 100,000 directories in seconds; every
/// path of it kept whole would take tens of GB to diff (each entry holds
/// its full path), so the review stops where no project's tree goes.
pub const REVIEW_DEPTH: usize = 1024;
pub const REVIEW_PATH_BYTES: usize = 8192;
const TOO_DEEP: &str = "a directory tree deeper than a review goes (1024 levels or 8192 bytes)";

fn too_deep(rel: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let bytes = rel.as_os_str().as_bytes();
    bytes.len() >= REVIEW_PATH_BYTES
        || bytes.iter().filter(|b| **b == b'/').count() + 1 >= REVIEW_DEPTH
}

/// A directory of the layer (its own path is short), its last component
/// never followed.
pub(crate) fn open_dir(path: &Path) -> Result<std::os::fd::OwnedFd, LayerError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LayerError::io("open", path, e.into()))
}

struct Scan<'a> {
    turn: u32,
    upper: &'a Path,
    out: Vec<(PathBuf, Entry)>,
}

impl Visit for Scan<'_> {
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
        st: &Stat,
    ) -> Result<bool, LayerError> {
        let source = Source::Turn {
            turn: self.turn,
            path: rel.to_path_buf(),
        };
        let mut entry = entry_of(dir, name, st, source, &|| self.upper.join(rel))?;
        if let Entry::Present(node) | Entry::OpaqueDir(node) = &mut entry
            && node.kind == NodeKind::Dir
            && too_deep(rel)
        {
            node.kind = NodeKind::Special { what: TOO_DEEP };
            self.out
                .push((rel.to_path_buf(), Entry::Present(node.clone())));
            return Ok(false);
        }
        let descend = matches!(entry, Entry::Present(_) | Entry::OpaqueDir(_));
        self.out.push((rel.to_path_buf(), entry));
        Ok(descend)
    }
}

/// What `name` in `dir` is, as overlayfs means it; `shown`: its path, for
/// messages.
fn entry_of(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    st: &Stat,
    source: Source,
    shown: &dyn Fn() -> PathBuf,
) -> Result<Entry, LayerError> {
    let file_type = FileType::from_raw_mode(st.st_mode);
    if file_type == FileType::CharacterDevice && st.st_rdev == 0 {
        return Ok(Entry::Whiteout);
    }
    let kind = kind_of(st, || {
        rustix::fs::readlinkat(dir, name, Vec::new())
            .map(|target| PathBuf::from(std::ffi::OsString::from_vec(target.into_bytes())))
            .map_err(|e| LayerError::io("read the link", &shown(), e.into()))
    })?;
    let node = node_of(st, kind, source);
    if node.kind == NodeKind::Dir && is_opaque(dir, name) {
        return Ok(Entry::OpaqueDir(node));
    }
    Ok(Entry::Present(node))
}

/// What kind of object `st` describes; `link` reads a symlink's target.
pub(crate) fn kind_of(
    st: &Stat,
    link: impl FnOnce() -> Result<PathBuf, LayerError>,
) -> Result<NodeKind, LayerError> {
    Ok(match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => NodeKind::File,
        FileType::Directory => NodeKind::Dir,
        FileType::Symlink => NodeKind::Symlink { target: link()? },
        FileType::Fifo => NodeKind::Special { what: "a FIFO" },
        FileType::Socket => NodeKind::Special { what: "a socket" },
        _ => NodeKind::Special {
            what: "a device node",
        },
    })
}

/// A file system object as both trees describe it.
pub(crate) fn node_of(st: &Stat, kind: NodeKind, source: Source) -> Node {
    Node {
        kind,
        mode: st.st_mode & 0o7777,
        size: u64::try_from(st.st_size).unwrap_or(0),
        source,
    }
}

/// Whether the directory `name` of `dir` is marked opaque (an error
/// reading the mark, as before, counts as unmarked; the walk into it
/// reports what is wrong).
fn is_opaque(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(dir, name, flags, Mode::empty()).is_ok_and(|fd| fd_is_opaque(&fd))
}

/// Whether the directory open as `fd` (not `O_PATH`) is marked opaque.
pub(crate) fn fd_is_opaque(fd: &std::os::fd::OwnedFd) -> bool {
    let mut value = [0u8; 4];
    matches!(rustix::fs::fgetxattr(fd, OPAQUE_XATTR, &mut value), Ok(1) if value[0] == b'y')
}

/// Clears the opaque mark of the directory `rel` of `upper` (once what it
/// hid was applied).
pub(crate) fn clear_opaque(
    upper: BorrowedFd<'_>,
    rel: &Path,
    shown: &Path,
) -> Result<(), LayerError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let fd = open_beneath(upper, rel, flags)
        .map_err(|e| LayerError::io("open", shown, e))?
        .ok_or_else(|| LayerError::io("open", shown, std::io::ErrorKind::NotFound.into()))?;
    match rustix::fs::fremovexattr(&fd, OPAQUE_XATTR) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(LayerError::io("clear the opaque mark of", shown, e.into())),
    }
}
