//! After an apply, what was applied leaves the layer: the host has it
//! now, so the layer keeps only what is still the agent's alone. Files,
//! links and whiteouts at applied paths are removed from every turn;
//! directories that are then empty, not opaque, and match the host's
//! directory go too. Every path of a turn is reached from its upper
//! directory's descriptor, at any depth.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, OFlags, Stat};

use crate::LayerError;
use crate::beneath::{open_beneath, split};
use crate::changes::{Change, ChangeKind, NodeKind};
use crate::host::HostTree;
use crate::scan::{Entry, clear_opaque, open_dir, scan_upper};
use crate::store::{Layer, LayerLock};
use crate::walk::{Back, Visit, names_of, walk};

pub(crate) fn forget_applied(
    layer: &Layer,
    _lock: &LayerLock,
    applied: &[&Change],
    pending: &[Change],
) -> Result<(), LayerError> {
    let host = layer.host()?;
    for turn in layer.turns()? {
        let upper = layer.upper(turn);
        let root = open_dir(&upper)?;
        // An opaque directory whose deletions are all applied hides nothing
        // the host still has: its mark goes, and the host shows through
        // again. One with deletions still pending keeps its mark, and with
        // it everything below it (the host's copies would stay hidden).
        let mut still_opaque = Vec::new();
        for (path, entry) in scan_upper(&upper, turn)? {
            if !matches!(entry, Entry::OpaqueDir(_)) {
                continue;
            }
            let blocked = pending
                .iter()
                .any(|c| c.kind == ChangeKind::Deleted && c.path.starts_with(&path));
            if blocked {
                still_opaque.push(path);
            } else {
                clear_opaque(root.as_fd(), &path, &upper.join(&path))?;
            }
        }
        for c in applied {
            if !still_opaque.iter().any(|o| c.path.starts_with(o)) {
                remove_non_dir(root.as_fd(), &c.path, &upper)?;
            }
        }
        let mut prune = Prune {
            host: &host,
            upper: &upper,
        };
        walk(root.as_fd(), &upper, Back::Parent, &mut prune)?;
    }
    Ok(())
}

/// Removes `rel` from the upper `root` unless it is a directory (or not
/// there).
fn remove_non_dir(root: BorrowedFd<'_>, rel: &Path, upper: &Path) -> Result<(), LayerError> {
    let shown = || upper.join(rel);
    let (parent, name) = split(rel);
    let Some(dir) = open_beneath(root, parent, OFlags::PATH | OFlags::DIRECTORY)
        .map_err(|e| LayerError::io("open", &shown(), e))?
    else {
        return Ok(());
    };
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
            rustix::fs::unlinkat(&dir, name, AtFlags::empty())
                .map_err(|e| LayerError::io("remove", &shown(), e.into()))
        }
        _ => Ok(()),
    }
}

/// Removes the directories of an upper that carry nothing, deepest first:
/// empty once what was below them went, not opaque, and with the host's
/// mode.
struct Prune<'a> {
    host: &'a HostTree,
    upper: &'a Path,
}

impl Visit for Prune<'_> {
    const LEAVES: bool = true;

    fn entry(
        &mut self,
        _dir: BorrowedFd<'_>,
        _name: &OsStr,
        _rel: &Path,
        _st: &Stat,
    ) -> Result<bool, LayerError> {
        Ok(true)
    }

    fn leave(&mut self, dir: BorrowedFd<'_>, name: &OsStr, rel: &Path) -> Result<(), LayerError> {
        let shown = || self.upper.join(rel);
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| LayerError::io("stat", &shown(), e.into()))?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, rustix::fs::Mode::empty())
            .map_err(|e| LayerError::io("open", &shown(), e.into()))?;
        let empty = names_of(&fd)
            .map_err(|e| LayerError::io("read", &shown(), e.into()))?
            .is_empty();
        if !empty || crate::scan::fd_is_opaque(&fd) {
            return Ok(());
        }
        let mode = st.st_mode & 0o7777;
        let same_on_host = self
            .host
            .lookup(rel)?
            .is_some_and(|h| h.node.kind == NodeKind::Dir && h.node.mode == mode);
        if same_on_host {
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
                .map_err(|e| LayerError::io("remove", &shown(), e.into()))?;
        }
        Ok(())
    }
}
