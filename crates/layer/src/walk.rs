//! Walking a tree by directory descriptors, at any depth.
//!
//! The walk is iterative (an explicit stack: a tree 100,000 levels deep
//! takes no more of the thread's stack than a flat one), and every entry
//! is reached from its directory's descriptor by its name alone, so no
//! path longer than one name is ever given to the kernel. Only the
//! deepest [`WINDOW`] directories of the current path hold a descriptor;
//! a directory below them that is walked on again is reopened:
//!
//! - [`Back::Parent`], for a layer's trees: by `..` from the child just
//!   left. The layer is locked and its sandbox has ended, so nothing moves
//!   in it; the directory reached is still checked to be the one left
//!   (device and inode), and a walk that finds otherwise fails.
//! - [`Back::Root`], for the host workspace, which other agents may change
//!   while it is walked: never by `..`, but from the walk's root, beneath
//!   it, with no symlink followed ([`open_beneath`]), and checked alike.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::LayerError;
use crate::beneath::open_beneath;

/// Directories of the current path that keep their descriptor.
pub(crate) const WINDOW: usize = 64;

/// How a directory whose descriptor was let go is found again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Back {
    Parent,
    Root,
}

/// What a walk does with what it finds.
pub(crate) trait Visit {
    /// Whether [`Visit::leave`] is called (it needs each directory's
    /// parent descriptor once more, after the directory).
    const LEAVES: bool = false;

    /// `name`, an entry of the directory `dir`, at `rel` below the root:
    /// whether to walk into it (asked of directories only).
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
        st: &Stat,
    ) -> Result<bool, LayerError>;

    /// After everything below the directory `name` of `dir` was walked.
    fn leave(
        &mut self,
        _dir: BorrowedFd<'_>,
        _name: &OsStr,
        _rel: &Path,
    ) -> Result<(), LayerError> {
        Ok(())
    }
}

/// A directory to walk into: its descriptor, names and identity.
type Child = (OwnedFd, Vec<OsString>, (u64, u64));

/// One directory of the current path.
struct Frame {
    fd: Option<OwnedFd>,
    /// Names yet to walk, last first.
    names: Vec<OsString>,
    id: (u64, u64),
}

/// Walks everything below `root` (a directory descriptor, `O_PATH` or
/// not), each directory's entries in name order, parents first;
/// `display` is the root's path, for messages.
pub(crate) fn walk(
    root: BorrowedFd<'_>,
    display: &Path,
    back: Back,
    visit: &mut impl Visit,
) -> Result<(), LayerError> {
    let mut walker = Walker {
        root,
        display,
        back,
        rel: PathBuf::new(),
        stack: Vec::new(),
    };
    let top = walker.reopen(None, None)?;
    let names = walker.names(&top)?;
    walker.stack.push(Frame {
        id: walker.id(&top)?,
        fd: Some(top),
        names,
    });
    while !walker.stack.is_empty() {
        walker.step(visit)?;
    }
    Ok(())
}

struct Walker<'a> {
    root: BorrowedFd<'a>,
    display: &'a Path,
    back: Back,
    /// The path of the directory on top of the stack, relative.
    rel: PathBuf,
    stack: Vec<Frame>,
}

impl Walker<'_> {
    fn err(&self, what: &'static str, e: impl Into<std::io::Error>) -> LayerError {
        LayerError::io(what, &self.display.join(&self.rel), e.into())
    }

    /// Walks the next name of the top directory, or leaves it.
    fn step(&mut self, visit: &mut impl Visit) -> Result<(), LayerError> {
        let Some(top) = self.stack.last_mut() else {
            return Ok(());
        };
        let Some(name) = top.names.pop() else {
            return self.leave(visit);
        };
        let dir = match top.fd.take() {
            Some(fd) => fd,
            None => {
                let id = top.id;
                self.reopen(None, Some(id))?
            }
        };
        self.rel.push(&name);
        let child = self.visit_entry(&dir, &name, visit);
        if let Some(top) = self.stack.last_mut() {
            top.fd = Some(dir);
        }
        match child? {
            Some((fd, names, id)) => self.push(fd, names, id),
            None => {
                self.rel.pop();
            }
        }
        Ok(())
    }

    /// Shows `name` of `dir` (at `self.rel`) to `visit`; the directory to
    /// walk into next, if any. What went meanwhile (the workspace may be
    /// changed as it is walked) is passed over.
    fn visit_entry(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        visit: &mut impl Visit,
    ) -> Result<Option<Child>, LayerError> {
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(self.err("stat", e)),
        };
        if !visit.entry(dir.as_fd(), name, &self.rel, &st)?
            || FileType::from_raw_mode(st.st_mode) != FileType::Directory
        {
            return Ok(None);
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(None),
            Err(e) => return Err(self.err("open the directory", e)),
        };
        let id = (st.st_dev, st.st_ino);
        if self.id(&fd)? != id {
            return Err(self.err("walk", std::io::Error::other("it changed while walked")));
        }
        let names = self.names(&fd)?;
        Ok(Some((fd, names, id)))
    }

    fn push(&mut self, fd: OwnedFd, names: Vec<OsString>, id: (u64, u64)) {
        self.stack.push(Frame {
            fd: Some(fd),
            names,
            id,
        });
        if let Some(i) = self.stack.len().checked_sub(WINDOW + 1) {
            self.stack[i].fd = None;
        }
    }

    /// The top directory is done: it goes, and its parent is reopened when
    /// it has more to walk (or `leave` needs it).
    fn leave<V: Visit>(&mut self, visit: &mut V) -> Result<(), LayerError> {
        let Some(done) = self.stack.pop() else {
            return Ok(());
        };
        let Some(name) = self.rel.file_name().map(OsStr::to_os_string) else {
            return Ok(());
        };
        self.rel.pop();
        let Some(parent) = self.stack.last_mut() else {
            return Ok(());
        };
        if parent.fd.is_none()
            && (self.back == Back::Parent || V::LEAVES || !parent.names.is_empty())
        {
            let id = parent.id;
            let fd = self.reopen(done.fd.as_ref(), Some(id))?;
            if let Some(parent) = self.stack.last_mut() {
                parent.fd = Some(fd);
            }
        }
        if V::LEAVES
            && let Some(Frame { fd: Some(fd), .. }) = self.stack.last()
        {
            self.rel.push(&name);
            let left = visit.leave(fd.as_fd(), &name, &self.rel);
            self.rel.pop();
            left?;
        }
        Ok(())
    }

    /// The directory at `self.rel` again: by `..` from `child` (a layer's
    /// tree), else from the root; checked to be `id` when given.
    fn reopen(
        &self,
        child: Option<&OwnedFd>,
        id: Option<(u64, u64)>,
    ) -> Result<OwnedFd, LayerError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match (self.back, child) {
            (Back::Parent, Some(child)) => Some(
                rustix::fs::openat(child, "..", flags, Mode::empty())
                    .map_err(|e| self.err("open", e))?,
            ),
            _ => open_beneath(self.root, &self.rel, flags).map_err(|e| self.err("open", e))?,
        };
        let fd = fd.ok_or_else(|| self.err("open", std::io::ErrorKind::NotFound))?;
        if let Some(id) = id
            && self.id(&fd)? != id
        {
            return Err(self.err("walk", std::io::Error::other("it changed while walked")));
        }
        Ok(fd)
    }

    fn id(&self, fd: &OwnedFd) -> Result<(u64, u64), LayerError> {
        let st = rustix::fs::fstat(fd).map_err(|e| self.err("stat", e))?;
        Ok((st.st_dev, st.st_ino))
    }

    /// A directory's names, last first (popped in order).
    fn names(&self, fd: &OwnedFd) -> Result<Vec<OsString>, LayerError> {
        names_of(fd).map_err(|e| self.err("read", e))
    }
}

/// The names in a directory (`.` and `..` left out), last first.
pub(crate) fn names_of(fd: &OwnedFd) -> rustix::io::Result<Vec<OsString>> {
    let mut dir = Dir::read_from(fd)?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name));
        }
    }
    names.sort_unstable_by(|a, b| b.as_bytes().cmp(a.as_bytes()));
    Ok(names)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Names seen, and how many directories were left.
    #[derive(Default)]
    struct Seen {
        paths: Vec<PathBuf>,
        left: usize,
    }

    impl Visit for Seen {
        const LEAVES: bool = true;

        fn entry(
            &mut self,
            _dir: BorrowedFd<'_>,
            _name: &OsStr,
            rel: &Path,
            _st: &Stat,
        ) -> Result<bool, LayerError> {
            self.paths.push(rel.to_path_buf());
            Ok(true)
        }

        fn leave(
            &mut self,
            dir: BorrowedFd<'_>,
            name: &OsStr,
            _rel: &Path,
        ) -> Result<(), LayerError> {
            // The parent handed back is the one `name` is in.
            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
            self.left += 1;
            Ok(())
        }
    }

    /// Three times the window deep, with a file after each directory (`z`
    /// comes after `a`): every directory below the window is walked on
    /// after its child, so it is reopened, by `..` or from the root.
    #[test]
    fn directories_past_the_window_are_reopened_and_walked_on() {
        let dir = tempfile::tempdir().unwrap();
        let depth = WINDOW * 3;
        let mut fd = rustix::fs::open(dir.path(), OFlags::RDONLY, Mode::empty()).unwrap();
        let mut expected = Vec::new();
        let mut rel = PathBuf::new();
        for _ in 0..depth {
            rustix::fs::mkdirat(&fd, "a", Mode::from_raw_mode(0o700)).unwrap();
            rustix::fs::mknodat(&fd, "z", FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
            expected.push(rel.join("a"));
            expected.push(rel.join("z"));
            rel.push("a");
            fd = rustix::fs::openat(&fd, "a", OFlags::RDONLY, Mode::empty()).unwrap();
        }
        expected.sort();
        let root = rustix::fs::open(dir.path(), OFlags::PATH, Mode::empty()).unwrap();
        for back in [Back::Parent, Back::Root] {
            let mut seen = Seen::default();
            walk(root.as_fd(), dir.path(), back, &mut seen).unwrap();
            assert_eq!(seen.paths, expected, "{back:?}");
            assert_eq!(seen.left, depth, "{back:?}");
        }
    }

    /// A directory moved away while it is walked is not walked on from
    /// wherever `..` now leads.
    #[test]
    fn a_directory_replaced_meanwhile_stops_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let chain = "a/".repeat(WINDOW + 4);
        std::fs::create_dir_all(dir.path().join(&chain)).unwrap();
        std::fs::write(dir.path().join("a/z"), "").unwrap();
        struct Mover<'a>(&'a Path, bool);
        impl Visit for Mover<'_> {
            fn entry(
                &mut self,
                _dir: BorrowedFd<'_>,
                _name: &OsStr,
                rel: &Path,
                _st: &Stat,
            ) -> Result<bool, LayerError> {
                if !self.1 && rel.components().count() == WINDOW + 3 {
                    // Swap the top directory for another while deep below.
                    std::fs::rename(self.0.join("a"), self.0.join("moved")).unwrap();
                    std::fs::create_dir_all(self.0.join("a/a")).unwrap();
                    self.1 = true;
                }
                Ok(true)
            }
        }
        let root = rustix::fs::open(dir.path(), OFlags::PATH, Mode::empty()).unwrap();
        let mut mover = Mover(dir.path(), false);
        let err = walk(root.as_fd(), dir.path(), Back::Root, &mut mover).unwrap_err();
        assert!(err.to_string().contains("changed while walked"), "{err}");
    }
}
