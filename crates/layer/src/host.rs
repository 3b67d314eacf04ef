//! The host workspace, read beneath its root without following symlinks:
//! a path whose parent is a symlink on the host is absent for the layer
//! (its parent's change says what happens there), never read through it.

use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::LayerError;
use crate::changes::{Node, NodeKind};
use crate::store::Identity;

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

pub(crate) const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

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

    /// Opens `rel` beneath the root with `flags`, no symlink followed;
    /// `None` when it, or a directory on its way, is not there.
    pub(crate) fn open_at(&self, rel: &Path, flags: OFlags) -> Result<Option<OwnedFd>, LayerError> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        match rustix::fs::openat2(
            self.fd.as_fd(),
            rel,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        ) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => Ok(None),
            Err(e) => Err(LayerError::io("open", &self.root.join(rel), e.into())),
        }
    }

    pub(crate) fn lookup(&self, rel: &Path) -> Result<Option<HostNode>, LayerError> {
        let Some(fd) = self.open_at(rel, OFlags::PATH)? else {
            return Ok(None);
        };
        let path = self.root.join(rel);
        let st = rustix::fs::fstat(&fd).map_err(|e| LayerError::io("stat", &path, e.into()))?;
        let file_type = rustix::fs::FileType::from_raw_mode(st.st_mode);
        let kind = match file_type {
            rustix::fs::FileType::RegularFile => NodeKind::File,
            rustix::fs::FileType::Directory => NodeKind::Dir,
            rustix::fs::FileType::Symlink => NodeKind::Symlink {
                target: PathBuf::from(
                    <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                        rustix::fs::readlinkat(&fd, "", Vec::new())
                            .map_err(|e| LayerError::io("read the link", &path, e.into()))?
                            .into_bytes(),
                    ),
                ),
            },
            rustix::fs::FileType::Fifo => NodeKind::Special { what: "a FIFO" },
            rustix::fs::FileType::Socket => NodeKind::Special { what: "a socket" },
            _ => NodeKind::Special {
                what: "a device node",
            },
        };
        Ok(Some(HostNode {
            node: Node {
                kind,
                mode: st.st_mode & 0o7777,
                size: u64::try_from(st.st_size).unwrap_or(0),
                source: path,
            },
            identity: Identity {
                ino: st.st_ino,
                ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
            },
        }))
    }

    /// A regular file's bytes (never blocking on a FIFO put in its place).
    pub(crate) fn read(&self, rel: &Path) -> Result<Vec<u8>, LayerError> {
        let path = self.root.join(rel);
        let mut bytes = Vec::new();
        self.open_file(rel)?
            .read_to_end(&mut bytes)
            .map_err(|e| LayerError::io("read", &path, e))?;
        Ok(bytes)
    }

    /// A regular file, opened to be read in pieces.
    pub(crate) fn open_file(&self, rel: &Path) -> Result<fs::File, LayerError> {
        let path = self.root.join(rel);
        let fd = self
            .open_at(rel, OFlags::RDONLY | OFlags::NONBLOCK)?
            .ok_or_else(|| LayerError::io("read", &path, std::io::ErrorKind::NotFound.into()))?;
        regular(fs::File::from(fd), &path)
    }

    /// Every path below directory `rel` (relative to the root), parents
    /// before children.
    pub(crate) fn subtree(&self, rel: &Path) -> Result<Vec<(PathBuf, HostNode)>, LayerError> {
        let mut out = Vec::new();
        let Some(dir) = self.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY)? else {
            return Ok(out);
        };
        let listing = Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string());
        let mut names: Vec<_> = fs::read_dir(&listing)
            .map_err(|e| LayerError::io("read", &self.root.join(rel), e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| LayerError::io("read", &self.root.join(rel), e))?;
        names.sort();
        for name in names {
            let child = rel.join(name);
            if let Some(node) = self.lookup(&child)? {
                let is_dir = node.node.kind == NodeKind::Dir;
                out.push((child.clone(), node));
                if is_dir {
                    out.extend(self.subtree(&child)?);
                }
            }
        }
        Ok(out)
    }
}

/// A layer file's bytes (the agent's; never followed out of the layer).
pub(crate) fn read_layer_file(path: &Path) -> Result<Vec<u8>, LayerError> {
    let mut bytes = Vec::new();
    open_layer_file(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| LayerError::io("read", path, e))?;
    Ok(bytes)
}

/// A layer file, opened to be read in pieces: its last component never
/// followed, never blocking, and a regular file or an error.
pub(crate) fn open_layer_file(path: &Path) -> Result<fs::File, LayerError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LayerError::io("read", path, e.into()))?;
    regular(fs::File::from(fd), path)
}

fn regular(file: fs::File, path: &Path) -> Result<fs::File, LayerError> {
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(LayerError::io(
            "read",
            path,
            std::io::Error::other("no longer a regular file"),
        )),
        Err(e) => Err(LayerError::io("read", path, e)),
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

/// A file's SHA-256, read in pieces.
pub(crate) fn digest(mut file: fs::File, path: &Path) -> Result<[u8; 32], LayerError> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = read_full(&mut file, &mut buf).map_err(|e| LayerError::io("read", path, e))?;
        if n == 0 {
            return Ok(hasher.finalize().into());
        }
        hasher.update(&buf[..n]);
    }
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
