//! Reading one turn's upper directory as overlayfs left it: files,
//! directories (opaque ones hide everything below them in lower layers),
//! symlinks, whiteouts (character device 0:0: deleted below), and anything
//! else the agent made (FIFOs, sockets, other devices), which is listed
//! and never applied.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::LayerError;
use crate::changes::{Node, NodeKind};

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

/// Every path below `upper`, relative, with what it is.
pub(crate) fn scan_upper(upper: &Path) -> Result<BTreeMap<PathBuf, Entry>, LayerError> {
    let mut out = BTreeMap::new();
    walk(upper, Path::new(""), &mut out)?;
    Ok(out)
}

fn walk(
    upper: &Path,
    relative: &Path,
    out: &mut BTreeMap<PathBuf, Entry>,
) -> Result<(), LayerError> {
    let dir = upper.join(relative);
    for entry in fs::read_dir(&dir).map_err(|e| LayerError::io("read the layer's", &dir, e))? {
        let entry = entry.map_err(|e| LayerError::io("read the layer's", &dir, e))?;
        let rel = relative.join(entry.file_name());
        let path = upper.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(|e| LayerError::io("stat", &path, e))?;
        let entry = entry_of(&path, &meta)?;
        let descend =
            matches!(entry, Entry::Present(_) | Entry::OpaqueDir(_)) && meta.file_type().is_dir();
        out.insert(rel.clone(), entry);
        if descend {
            walk(upper, &rel, out)?;
        }
    }
    Ok(())
}

pub(crate) fn entry_of(path: &Path, meta: &fs::Metadata) -> Result<Entry, LayerError> {
    let ft = meta.file_type();
    if ft.is_char_device() && meta.rdev() == 0 {
        return Ok(Entry::Whiteout);
    }
    let node = node_of(path, meta)?;
    if node.kind == NodeKind::Dir && is_opaque(path) {
        return Ok(Entry::OpaqueDir(node));
    }
    Ok(Entry::Present(node))
}

/// A file system object as both trees describe it.
pub(crate) fn node_of(path: &Path, meta: &fs::Metadata) -> Result<Node, LayerError> {
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        NodeKind::File
    } else if ft.is_dir() {
        NodeKind::Dir
    } else if ft.is_symlink() {
        NodeKind::Symlink {
            target: fs::read_link(path).map_err(|e| LayerError::io("read the link", path, e))?,
        }
    } else if ft.is_fifo() {
        NodeKind::Special { what: "a FIFO" }
    } else if ft.is_socket() {
        NodeKind::Special { what: "a socket" }
    } else {
        NodeKind::Special {
            what: "a device node",
        }
    };
    Ok(Node {
        kind,
        mode: meta.mode() & 0o7777,
        size: meta.len(),
        source: path.to_path_buf(),
    })
}

fn is_opaque(path: &Path) -> bool {
    let mut value = [0u8; 4];
    matches!(rustix::fs::lgetxattr(path, OPAQUE_XATTR, &mut value), Ok(1) if value[0] == b'y')
}

/// Clears a directory's opaque mark (once what it hid was applied).
pub(crate) fn clear_opaque(path: &Path) -> Result<(), LayerError> {
    match rustix::fs::lremovexattr(path, OPAQUE_XATTR) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(LayerError::io("clear the opaque mark of", path, e.into())),
    }
}
