//! Git repositories below the workspace's root.
//!
//! Host git finds a repository wherever a person runs it: a `.git`
//! directory or gitfile in that directory or above, or the directory itself
//! when it looks like a bare repository (HEAD, objects/, refs/). One the
//! agent made or changed would run what its config names. So:
//!
//! - before a run, every such repository below the root (the root's own
//!   `.git` is `gitdir`'s business) is found and bound read-only into the
//!   sandbox: the agent may read it, not change it;
//! - after the run (the sandbox's processes are all gone by then), every one
//!   that was not there before is made inert by a rename (`.git` to
//!   `.git.substrat-quarantine`, a git dir's `HEAD` to
//!   `HEAD.substrat-quarantine`), the root included, and the walk goes on
//!   inside it (a repository may hide in another): nothing is deleted, git
//!   no longer sees a repository there, and the launcher says where.
//!
//! The walk opens each directory beneath the previous one without following
//! symlinks, and stays below the workspace whatever another process does to
//! it meanwhile. It keeps one descriptor per level, not per directory seen.
//! Names are matched as git would on a case-insensitive filesystem too
//! (`.GIT`, `head`).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag, fstatat};

/// The suffix a quarantined name gets.
pub const QUARANTINE_SUFFIX: &str = ".substrat-quarantine";

/// What makes a directory a repository to host git.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    /// A `.git` directory (its path is the `.git`).
    GitDir,
    /// A `.git` file naming a git dir elsewhere (its path is the file).
    GitFile,
    /// A directory that is itself a git dir (its path is the directory).
    Bare,
    /// A `.git` that is a symlink or anything else git might follow.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedRepo {
    /// Absolute host path: the `.git` entry, or the bare repository.
    pub path: PathBuf,
    pub kind: RepoKind,
    /// Device and inode of the entry that makes it a repository (the `.git`
    /// entry, a bare repository's HEAD).
    pub id: (u64, u64),
}

/// A repository made inert after a run: `from` was renamed to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    pub from: PathBuf,
    pub to: PathBuf,
}

/// What a scan found, and the directories it could not look into.
#[derive(Debug, Default)]
pub struct Scan<T> {
    pub found: Vec<T>,
    pub unreadable: Vec<PathBuf>,
    /// After a run: repositories made during it that another running
    /// sandbox holds (bound read-only); that launch renames them.
    pub held: Vec<PathBuf>,
}

/// Which `.git` a walk leaves alone: the root's own when the launcher
/// replaces it (the workspace's), none in another writable tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootGit {
    Replaced,
    Scanned,
}

/// Every repository in the tree `workspace`.
pub fn find_nested(workspace: &Path, root_git: RootGit) -> std::io::Result<Scan<NestedRepo>> {
    let mut found = Vec::new();
    let pass = Pass::Before(root_git);
    let unreadable = walk(workspace, pass, &mut |_dir, rel, name, kind, id| {
        let path = match kind {
            RepoKind::Bare => workspace.join(rel),
            RepoKind::GitDir | RepoKind::GitFile | RepoKind::Other => {
                workspace.join(rel).join(name)
            }
        };
        found.push(NestedRepo { path, kind, id });
        None
    })?;
    Ok(Scan {
        found,
        unreadable,
        held: Vec::new(),
    })
}

/// Renames every repository in `workspace` that is not one of `known`
/// (those found before the run, which were read-only inside) so that git
/// no longer sees it: a repository made during the run (see the module's
/// comment). By identity, not time: no clock's granularity to race.
pub fn quarantine_new(
    workspace: &Path,
    root_git: RootGit,
    known: &[NestedRepo],
) -> std::io::Result<Scan<Quarantined>> {
    let known: std::collections::HashSet<(u64, u64)> = known.iter().map(|r| r.id).collect();
    let mut done = Vec::new();
    let mut failed = None;
    let mut held = Vec::new();
    let unreadable = walk(
        workspace,
        Pass::After(root_git),
        &mut |dir, rel, name, kind, id| {
            // What another sandbox may have bound read-only: the `.git`
            // entry, or the git dir itself.
            let mount_point = match kind {
                RepoKind::Bare => dir.try_clone().ok(),
                _ => open_entry(dir, name),
            };
            let deferred = mount_point
                .as_ref()
                .is_some_and(|fd| crate::sys::has_xattr(fd, PENDING));
            if known.contains(&id) && !deferred {
                return None;
            }
            let at = workspace.join(rel);
            // Renaming a mount point another launch holds would detach its
            // read-only bind: that launch renames it when it ends instead
            // (marked for it, since it counts the repository as its own).
            // (Where the filesystem keeps no attribute, it is renamed all
            // the same.)
            if let Some(fd) = &mount_point
                && held_by_another(fd)
                && crate::sys::set_xattr(fd, PENDING, b"1").is_ok()
            {
                held.push(match kind {
                    RepoKind::Bare => at.clone(),
                    _ => at.join(name),
                });
                return None;
            }
            match rename_aside(dir, name) {
                Ok(new_name) => {
                    done.push(Quarantined {
                        from: at.join(name),
                        to: at.join(&new_name),
                    });
                    // Walk on inside a renamed `.git` directory: it is a git dir
                    // itself (its HEAD goes aside then) and may hold others.
                    (kind == RepoKind::GitDir).then_some(new_name)
                }
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        },
    )?;
    match failed {
        Some(e) => Err(e),
        None => Ok(Scan {
            found: done,
            unreadable,
            held,
        }),
    }
}

/// Marks a repository another running launch holds: it renames it aside
/// when it ends, even though it found it before its run.
const PENDING: &std::ffi::CStr = c"user.substrat.quarantine-pending";

fn open_entry(dir: &OwnedFd, name: &OsStr) -> Option<OwnedFd> {
    nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Whether another launch holds a shared lock on it (`mountpoints`): a
/// lock through a new open of our own cannot be made exclusive then.
fn held_by_another(fd: &OwnedFd) -> bool {
    let Ok(own) = nix::fcntl::openat(
        fd.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .or_else(|_| {
        nix::fcntl::open(
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd)).as_str(),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }) else {
        return false;
    };
    matches!(
        nix::fcntl::Flock::lock(
            std::fs::File::from(own),
            nix::fcntl::FlockArg::LockExclusiveNonblock
        ),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

/// `name` -> `name.substrat-quarantine`, or with a random suffix when that
/// is taken: the command may have planted any names it can predict, so a
/// sequence of them could all be taken. A directory the command made
/// read-only is given back its owner's write permission first (the
/// launcher's user owns what the command made).
pub(crate) fn rename_aside(dir: &OwnedFd, name: &OsStr) -> std::io::Result<OsString> {
    use std::hash::{BuildHasher, Hasher};
    if let Ok(stat) = nix::sys::stat::fstat(dir.as_fd())
        && stat.st_mode & 0o300 != 0o300
    {
        let mode = nix::sys::stat::Mode::from_bits_truncate((stat.st_mode & 0o7777) | 0o700);
        nix::sys::stat::fchmod(dir.as_fd(), mode)?;
    }
    for attempt in 0..16 {
        let mut new_name = name.to_os_string();
        new_name.push(QUARANTINE_SUFFIX);
        if attempt > 0 {
            let mut random = std::collections::hash_map::RandomState::new().build_hasher();
            random.write_u32(attempt);
            new_name.push(format!("-{:016x}", random.finish()));
        }
        let taken = fstatat(
            dir.as_fd(),
            new_name.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok();
        if taken {
            continue;
        }
        nix::fcntl::renameat(dir.as_fd(), name, dir.as_fd(), new_name.as_os_str())?;
        return Ok(new_name);
    }
    Err(std::io::Error::other(format!(
        "no free name to rename {} aside",
        name.to_string_lossy()
    )))
}

/// Which walk: before a run (repositories are not entered: they are bound
/// read-only whole; a directory that cannot be entered is reported) or
/// after it (everything is entered, renamed repositories too; a directory
/// the command made unreadable is made 0700 first: it is the same user's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Before(RootGit),
    After(RootGit),
}

impl Pass {
    fn before(self) -> bool {
        matches!(self, Pass::Before(_))
    }

    fn root_git(self) -> RootGit {
        match self {
            Pass::Before(r) | Pass::After(r) => r,
        }
    }
}

/// A repository the walk found: `found(dir, rel, name, kind, id)`, where
/// `dir` holds the entry `name` that makes it one (`.git`, or a git dir's
/// `HEAD`; then `dir` is the git dir, `rel` its path). It returns the name
/// of a directory in `dir` to walk into instead of `name`, if any.
type Found<'a> = dyn FnMut(&OwnedFd, &Path, &OsStr, RepoKind, (u64, u64)) -> Option<OsString> + 'a;

/// One directory still to walk: its parent's descriptor (shared by its
/// siblings, so one descriptor per level stays open) and its name.
struct Pending {
    parent: std::rc::Rc<OwnedFd>,
    name: OsString,
    rel: PathBuf,
}

/// Walks `root` (see `Pass` and `Found`); returns the directories it could
/// not enter (their contents unchecked).
fn walk(root: &Path, pass: Pass, found: &mut Found<'_>) -> std::io::Result<Vec<PathBuf>> {
    let mut unreadable = Vec::new();
    let root_fd: OwnedFd = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(root_fd, PathBuf::new())];
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let (dir, rel) = match stack.pop() {
            Some(next) => next,
            None => match pending.pop() {
                Some(p) => match enter(&p.parent, &p.name, pass) {
                    Some(fd) => (fd, p.rel),
                    None => {
                        unreadable.push(root.join(&p.rel));
                        continue;
                    }
                },
                None => return Ok(unreadable),
            },
        };
        let dir = std::rc::Rc::new(dir);
        let (names, not_dirs) = list(&dir)?;
        let mut names_to_walk: Vec<OsString> = Vec::new();
        if let Some(head) = git_dir_head(&dir, &names) {
            let name = head.0.clone();
            let into = found(&dir, &rel, &name, RepoKind::Bare, head.1);
            if pass.before() {
                continue; // bound read-only whole
            }
            names_to_walk.extend(into);
        }
        for name in names {
            if name.as_bytes().eq_ignore_ascii_case(b".git") {
                if rel.as_os_str().is_empty() && pass.root_git() == RootGit::Replaced {
                    continue; // the root's own: `gitdir`'s business
                }
                let st = fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
                let (kind, id) = match st {
                    Ok(st) => (
                        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                            SFlag::S_IFDIR => RepoKind::GitDir,
                            SFlag::S_IFREG => RepoKind::GitFile,
                            _ => RepoKind::Other,
                        },
                        (st.st_dev, st.st_ino),
                    ),
                    Err(nix::errno::Errno::ENOENT) => continue,
                    Err(_) => (RepoKind::Other, (0, 0)),
                };
                if let Some(into) = found(&dir, &rel, &name, kind, id) {
                    names_to_walk.push(into);
                }
                continue;
            }
            names_to_walk.push(name);
        }
        for name in names_to_walk {
            if not_dirs.contains(&name) {
                continue;
            }
            match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st)
                    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR =>
                {
                    pending.push(Pending {
                        parent: dir.clone(),
                        rel: rel.join(&name),
                        name,
                    });
                }
                Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
                // Not searchable: its entries cannot be looked at.
                Err(_) => unreadable.push(root.join(&rel)),
            }
        }
    }
}

/// Opens the directory `name` in `parent` to be listed and searched. After
/// a run, one the command left without read or search permission (its own,
/// same user) is made 0700 first.
fn enter(parent: &OwnedFd, name: &OsStr, pass: Pass) -> Option<OwnedFd> {
    let open = || {
        nix::fcntl::openat(
            parent.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let searchable = |fd: &OwnedFd| {
        nix::unistd::faccessat(
            fd.as_fd(),
            ".",
            nix::unistd::AccessFlags::X_OK,
            AtFlags::empty(),
        )
        .is_ok()
    };
    if let Ok(fd) = open()
        && searchable(&fd)
    {
        return Some(fd);
    }
    if pass.before() {
        return None;
    }
    nix::sys::stat::fchmodat(
        parent.as_fd(),
        name,
        Mode::from_bits_truncate(0o700),
        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
    )
    .ok()?;
    open().ok().filter(searchable)
}

/// The names in `dir`, `.` and `..` left out; raw bytes, so that no name
/// (UTF-8 or not) is skipped.
fn list(dir: &OwnedFd) -> std::io::Result<(Vec<OsString>, NotDirs)> {
    let mut handle = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let mut names = Vec::new();
    let mut not_dirs = NotDirs::new();
    for entry in handle.iter() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            let name = OsStr::from_bytes(bytes).to_os_string();
            // The type readdir gives (where the filesystem fills it in)
            // spares a stat of each file: only directories are walked.
            if entry
                .file_type()
                .is_some_and(|t| t != nix::dir::Type::Directory)
            {
                not_dirs.insert(name.clone());
            }
            names.push(name);
        }
    }
    Ok((names, not_dirs))
}

/// Names readdir reported as something other than a directory.
type NotDirs = std::collections::HashSet<OsString>;

/// Whether git would take `dir` for a git dir when run in it: a `HEAD`, and
/// `objects` and `refs` or a `commondir`, of any type (git follows links
/// there). The name of its HEAD and that entry's device and inode.
fn git_dir_head(dir: &OwnedFd, names: &[OsString]) -> Option<(OsString, (u64, u64))> {
    let named = |want: &str| {
        names
            .iter()
            .find(|n| n.as_bytes().eq_ignore_ascii_case(want.as_bytes()))
    };
    let head = named("head")?;
    let own = named("objects").is_some() && named("refs").is_some();
    if !own && named("commondir").is_none() {
        return None;
    }
    let id = fstatat(dir.as_fd(), head.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| (st.st_dev, st.st_ino))
        .unwrap_or((0, 0));
    Some((head.clone(), id))
}
