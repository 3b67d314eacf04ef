//! Removing a tree of the layer: never following a symlink, and making
//! directories the agent left unwritable (mode 000) removable first: they
//! are the launcher's own files. Both walks here go by descriptors, at
//! any depth ([`walk`]): what an agent made one `mkdir` at a time, past
//! PATH_MAX, is removed and measured like any other tree.

use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use crate::LayerError;
use crate::scan::open_dir;
use crate::walk::{Back, Visit, walk};

/// What is at `path`, its last component not followed; `None`: nothing.
fn lstat(path: &Path) -> Result<Option<Stat>, LayerError> {
    match rustix::fs::lstat(path) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(LayerError::io("stat", path, e.into())),
    }
}

fn is_dir(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

/// Whether a directory of this mode can be read and emptied by its owner.
fn removable(st: &Stat) -> bool {
    st.st_mode & 0o700 == 0o700
}

pub(crate) fn remove_tree(path: &Path) -> Result<(), LayerError> {
    let Some(st) = lstat(path)? else {
        return Ok(());
    };
    if !is_dir(&st) {
        return fs::remove_file(path).map_err(|e| LayerError::io("remove", path, e));
    }
    if !removable(&st) {
        make_removable(rustix::fs::CWD, path.as_os_str(), path)?;
    }
    let root = open_dir(path)?;
    walk(root.as_fd(), path, Back::Parent, &mut Remove { top: path })?;
    drop(root);
    fs::remove_dir(path).map_err(|e| LayerError::io("remove", path, e))
}

/// Gives the directory `name` of `dir` mode 0700, through a descriptor
/// that did not follow a symlink.
fn make_removable(dir: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> Result<(), LayerError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty())
        .map_err(|e| LayerError::io("make removable", shown, e.into()))?;
    // fchmod takes no O_PATH descriptor; its /proc link names that
    // directory and nothing else.
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link.as_str(), Mode::from_raw_mode(0o700))
        .map_err(|e| LayerError::io("make removable", shown, e.into()))
}

/// Unlinks each entry as it is found, each directory once it is empty.
struct Remove<'a> {
    top: &'a Path,
}

impl Visit for Remove<'_> {
    const LEAVES: bool = true;

    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
        st: &Stat,
    ) -> Result<bool, LayerError> {
        if is_dir(st) {
            if !removable(st) {
                make_removable(dir, name, &self.top.join(rel))?;
            }
            return Ok(true);
        }
        rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| LayerError::io("remove", &self.top.join(rel), e.into()))?;
        Ok(false)
    }

    fn leave(&mut self, dir: BorrowedFd<'_>, name: &OsStr, rel: &Path) -> Result<(), LayerError> {
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
            .map_err(|e| LayerError::io("remove", &self.top.join(rel), e.into()))
    }
}

/// Bytes a tree takes on its filesystem (blocks, links not followed).
pub(crate) fn disk_usage(path: &Path) -> Result<u64, LayerError> {
    let Some(st) = lstat(path)? else {
        return Ok(0);
    };
    let mut usage = Usage { total: blocks(&st) };
    if is_dir(&st) {
        let root = open_dir(path)?;
        walk(root.as_fd(), path, Back::Parent, &mut usage)?;
    }
    Ok(usage.total)
}

fn blocks(st: &Stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0) * 512
}

struct Usage {
    total: u64,
}

impl Visit for Usage {
    fn entry(
        &mut self,
        _dir: BorrowedFd<'_>,
        _name: &OsStr,
        _rel: &Path,
        st: &Stat,
    ) -> Result<bool, LayerError> {
        self.total += blocks(st);
        Ok(true)
    }
}
