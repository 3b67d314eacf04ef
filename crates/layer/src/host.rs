//! The host workspace, read beneath its root without following symlinks:
//! a path whose parent is a symlink on the host is absent for the layer
//! (its parent's change says what happens there), never read through it.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, Stat};

use crate::LayerError;
use crate::beneath::open_beneath;
use crate::changes::{Node, NodeKind, Source};
use crate::scan::{kind_of, node_of};
use crate::store::{Identity, Layer};
use crate::walk::{Back, Visit, walk};

#[derive(Debug)]
pub(crate) struct HostTree {
    pub(crate) root: PathBuf,
    pub(crate) fd: OwnedFd,
}

/// What a host path is, and its identity (conflict detection).
#[derive(Debug, Clone)]
pub(crate) struct HostNode {
    pub(crate) node: Node,
    pub(crate) identity: Identity,
}

impl HostTree {
    pub(crate) fn open(root: &Path) -> Result<HostTree, LayerError> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| LayerError::io("open the workspace", root, e.into()))?;
        Ok(HostTree {
            root: root.to_path_buf(),
            fd,
        })
    }

    /// Opens `rel` beneath the root with `flags`, no symlink followed, at
    /// any length ([`open_beneath`]); `None` when it, or a directory on its
    /// way, is not there.
    pub(crate) fn open_at(&self, rel: &Path, flags: OFlags) -> Result<Option<OwnedFd>, LayerError> {
        open_beneath(self.fd.as_fd(), rel, flags)
            .map_err(|e| LayerError::io("open", &self.root.join(rel), e))
    }

    pub(crate) fn lookup(&self, rel: &Path) -> Result<Option<HostNode>, LayerError> {
        let Some(fd) = self.open_at(rel, OFlags::PATH)? else {
            return Ok(None);
        };
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| LayerError::io("stat", &self.root.join(rel), e.into()))?;
        let kind = kind_of(&st, || self.link_target(fd.as_fd(), OsStr::new(""), rel))?;
        Ok(Some(host_node(&st, kind, rel)))
    }

    fn link_target(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
    ) -> Result<PathBuf, LayerError> {
        rustix::fs::readlinkat(dir, name, Vec::new())
            .map(|t| PathBuf::from(std::ffi::OsString::from_vec(t.into_bytes())))
            .map_err(|e| LayerError::io("read the link", &self.root.join(rel), e.into()))
    }

    /// A regular file's bytes (never blocking on a FIFO put in its place).
    pub(crate) fn read(&self, rel: &Path) -> Result<Vec<u8>, LayerError> {
        read_all(self.open_file(rel)?, &self.root.join(rel))
    }

    /// A regular file, opened to be read in pieces.
    pub(crate) fn open_file(&self, rel: &Path) -> Result<fs::File, LayerError> {
        open_regular(self.fd.as_fd(), rel, &|| self.root.join(rel))
    }

    /// Every path below directory `rel` (relative to the root), parents
    /// before children, each directory's names in order. Walked by
    /// descriptors ([`walk`]), never by `..`: other agents may be moving
    /// the workspace's directories meanwhile.
    pub(crate) fn subtree(&self, rel: &Path) -> Result<Vec<(PathBuf, HostNode)>, LayerError> {
        let Some(dir) = self.open_at(rel, OFlags::PATH | OFlags::DIRECTORY)? else {
            return Ok(Vec::new());
        };
        let mut below = Subtree {
            host: self,
            top: rel,
            out: Vec::new(),
        };
        walk(dir.as_fd(), &self.root.join(rel), Back::Root, &mut below)?;
        Ok(below.out)
    }
}

fn host_node(st: &Stat, kind: NodeKind, rel: &Path) -> HostNode {
    HostNode {
        node: node_of(
            st,
            kind,
            Source::Host {
                path: rel.to_path_buf(),
            },
        ),
        identity: Identity {
            ino: st.st_ino,
            ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
        },
    }
}

struct Subtree<'a> {
    host: &'a HostTree,
    top: &'a Path,
    out: Vec<(PathBuf, HostNode)>,
}

impl Visit for Subtree<'_> {
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
        st: &Stat,
    ) -> Result<bool, LayerError> {
        let path = self.top.join(rel);
        let kind = kind_of(st, || self.host.link_target(dir, name, &path))?;
        let descend = kind == NodeKind::Dir;
        let node = host_node(st, kind, &path);
        self.out.push((path, node));
        Ok(descend)
    }
}

/// The bytes of a node of either tree: a layer file (the agent's) or a
/// host file, opened beneath its tree's root by its relative path, never
/// followed out of it, never blocking, and a regular file or an error.
/// A layer's nodes name their turn, each turn's upper directory being
/// opened by its own (short) path.
pub(crate) fn open_node_content(layer: &Layer, node: &Node) -> Result<fs::File, LayerError> {
    match &node.source {
        Source::Turn { turn, path } => {
            let upper = layer.upper(*turn);
            let root = crate::scan::open_dir(&upper)?;
            open_regular(root.as_fd(), path, &|| upper.join(path))
        }
        Source::Host { path } => layer.host()?.open_file(path),
    }
}

/// A node's bytes, whole ([`open_node_content`]).
pub(crate) fn read_node_content(layer: &Layer, node: &Node) -> Result<Vec<u8>, LayerError> {
    read_all(open_node_content(layer, node)?, &node.source.display(layer))
}

fn read_all(mut file: fs::File, shown: &Path) -> Result<Vec<u8>, LayerError> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| LayerError::io("read", shown, e))?;
    Ok(bytes)
}

/// The regular file `rel` beneath `root`; `shown`: its path, for messages.
fn open_regular(
    root: BorrowedFd<'_>,
    rel: &Path,
    shown: &dyn Fn() -> PathBuf,
) -> Result<fs::File, LayerError> {
    let fd = open_beneath(root, rel, OFlags::RDONLY | OFlags::NONBLOCK)
        .map_err(|e| LayerError::io("read", &shown(), e))?
        .ok_or_else(|| LayerError::io("read", &shown(), std::io::ErrorKind::NotFound.into()))?;
    let file = fs::File::from(fd);
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(LayerError::io(
            "read",
            &shown(),
            std::io::Error::other("no longer a regular file"),
        )),
        Err(e) => Err(LayerError::io("read", &shown(), e)),
    }
}

/// Whether two files hold the same bytes, read in pieces (a file may be
/// sparse and far larger than memory).
pub(crate) fn same_bytes(
    mut a: fs::File,
    mut b: fs::File,
    path: &Path,
) -> Result<bool, LayerError> {
    let mut left = vec![0u8; 1 << 16];
    let mut right = vec![0u8; 1 << 16];
    loop {
        let n = read_full(&mut a, &mut left).map_err(|e| LayerError::io("read", path, e))?;
        let m = read_full(&mut b, &mut right).map_err(|e| LayerError::io("read", path, e))?;
        if n != m || left[..n] != right[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Blocks of a file's content digest: a block of zeros (written or a
/// hole) adds nothing, so the digest is the same however the zeros lie.
const DIGEST_BLOCK: u64 = 1 << 16;

/// A digest of a file's content (SHA-256 over its size and its blocks that
/// are not all zeros, each with its index), reading only its data extents
/// (SEEK_DATA, SEEK_HOLE): an agent's sparse file claiming a terabyte
/// costs what it holds, not a terabyte of reading. Equal for equal
/// content, whatever the file's holes.
pub(crate) fn digest(file: fs::File, path: &Path) -> Result<[u8; 32], LayerError> {
    use rustix::fs::SeekFrom;
    use sha2::Digest;
    let io = |e: std::io::Error| LayerError::io("read", path, e);
    let len = file.metadata().map_err(io)?.len();
    let mut hasher = sha2::Sha256::new();
    hasher.update(len.to_le_bytes());
    let mut buf = vec![0u8; DIGEST_BLOCK as usize];
    let mut next_block = 0u64;
    let mut pos = 0u64;
    while pos < len {
        let data = match rustix::fs::seek(&file, SeekFrom::Data(pos)) {
            Ok(data) => data,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(io(e.into())),
        };
        let hole = rustix::fs::seek(&file, SeekFrom::Hole(data))
            .map_err(|e| io(e.into()))?
            .min(len);
        let first = (data / DIGEST_BLOCK).max(next_block);
        let end = hole.div_ceil(DIGEST_BLOCK);
        for block in first..end {
            let offset = block * DIGEST_BLOCK;
            let want = usize::try_from((len - offset).min(DIGEST_BLOCK)).unwrap_or(buf.len());
            let n = pread_full(&file, &mut buf[..want], offset).map_err(io)?;
            if buf[..n].iter().any(|b| *b != 0) {
                hasher.update(block.to_le_bytes());
                hasher.update(&buf[..n]);
            }
        }
        next_block = next_block.max(end);
        pos = hole.max(data + 1);
    }
    Ok(hasher.finalize().into())
}

/// Reads `buf.len()` bytes at `offset` unless the file ends first.
fn pread_full(file: &fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::pread(file, &mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(filled)
}

/// Fills `buf` unless the file ends first: how many bytes it holds.
fn read_full(file: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Copies a regular file's bytes keeping its holes: only the data extents
/// are read and written (SEEK_DATA, SEEK_HOLE), and the length is set
/// last. A sparse file an agent made (`truncate -s 1T`) stays sparse on
/// the host instead of filling its disk with zeros.
pub fn copy_sparse(from: &fs::File, to: &fs::File) -> std::io::Result<()> {
    use rustix::fs::SeekFrom;
    let len = from.metadata()?.len();
    let mut buf = vec![0u8; 1 << 16];
    let mut pos = 0u64;
    while pos < len {
        let data = match rustix::fs::seek(from, SeekFrom::Data(pos)) {
            Ok(data) => data,
            // No data after `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(from, SeekFrom::Hole(data))?.min(len);
        let mut offset = data;
        while offset < hole {
            let want = usize::try_from(hole - offset).map_or(buf.len(), |n| n.min(buf.len()));
            let n = rustix::io::pread(from, &mut buf[..want], offset)?;
            if n == 0 {
                break;
            }
            let mut written = 0;
            while written < n {
                written += rustix::io::pwrite(to, &buf[written..n], offset + written as u64)?;
            }
            offset += n as u64;
        }
        pos = hole.max(data + 1);
    }
    to.set_len(len)
}
