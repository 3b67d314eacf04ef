//! Git repositories below the workspace's root.
//!
//! Host git finds a repository wherever a person runs it: a `.git`
//! directory or gitfile in that directory or above, or the directory itself
//! when it looks like a bare repository (HEAD, objects/, refs/). One the
//! agent made or changed would run what its config names. So:
//!
//! - before a run, every such repository below the root (the root's own is
//!   `gitdir`'s business) is found and bound read-only into the sandbox:
//!   the agent may read it, not change it;
//! - after the run (the sandbox's processes are all gone by then), every one
//!   that was not there before is made inert by a rename (`.git` to
//!   `.git.substrat-quarantine`, a bare repository's `HEAD` to
//!   `HEAD.substrat-quarantine`): nothing is deleted, git no longer sees a
//!   repository there, and the launcher says where.
//!
//! The walk opens each directory beneath the previous one without following
//! symlinks, and stays below the workspace whatever another process does to
//! it meanwhile.

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
}

/// Every repository below `workspace` (its own `.git` excepted).
pub fn find_nested(workspace: &Path) -> std::io::Result<Scan<NestedRepo>> {
    let mut found = Vec::new();
    let unreadable = walk(workspace, false, &mut |_dir, rel, name, kind, id| {
        let path = match kind {
            RepoKind::Bare => workspace.join(rel),
            RepoKind::GitDir | RepoKind::GitFile | RepoKind::Other => {
                workspace.join(rel).join(name)
            }
        };
        found.push(NestedRepo { path, kind, id });
    })?;
    Ok(Scan { found, unreadable })
}

/// Renames every repository below `workspace` that is not one of `known`
/// (those found before the run, which were read-only inside) so that git
/// no longer sees it: a repository made during the run (see the module's
/// comment). By identity, not time: no clock's granularity to race.
pub fn quarantine_new(
    workspace: &Path,
    known: &[NestedRepo],
) -> std::io::Result<Scan<Quarantined>> {
    let known: std::collections::HashSet<(u64, u64)> = known.iter().map(|r| r.id).collect();
    let mut done = Vec::new();
    let mut failed = None;
    let unreadable = walk(workspace, true, &mut |dir, rel, name, kind, id| {
        if known.contains(&id) {
            return;
        }
        let name = entry_name(name, kind);
        let at = workspace.join(rel);
        match rename_aside(dir, name) {
            Ok(new_name) => {
                // A `.git` directory renamed aside is still a git dir to
                // git run inside it: its HEAD goes aside too.
                if kind == RepoKind::GitDir
                    && let Err(e) = head_aside(dir, &new_name)
                {
                    failed = Some(e);
                }
                done.push(Quarantined {
                    from: at.join(name),
                    to: at.join(new_name),
                });
            }
            Err(e) => failed = Some(e),
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(Scan {
            found: done,
            unreadable,
        }),
    }
}

/// The entry that makes the repository: `.git` for a git dir or gitfile,
/// `HEAD` inside a bare repository (`dir` is then the bare repository).
fn entry_name(name: &OsStr, kind: RepoKind) -> &OsStr {
    match kind {
        RepoKind::Bare => OsStr::new("HEAD"),
        RepoKind::GitDir | RepoKind::GitFile | RepoKind::Other => name,
    }
}

/// `name` -> `name.substrat-quarantine` (or `...-2`, `-3` when taken).
fn rename_aside(dir: &OwnedFd, name: &OsStr) -> std::io::Result<OsString> {
    for n in 1..1000 {
        let mut new_name = name.to_os_string();
        new_name.push(QUARANTINE_SUFFIX);
        if n > 1 {
            new_name.push(format!("-{n}"));
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

/// Renames `HEAD` aside in the directory `name` of `dir` (when it has one).
fn head_aside(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let inner = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    match fstatat(inner.as_fd(), "HEAD", AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => rename_aside(&inner, OsStr::new("HEAD")).map(drop),
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Calls `found(dir, rel, name, kind)` for every repository below `root`:
/// for a `.git` entry, `dir` holds it; for a bare repository, `dir` is the
/// repository itself (and `name` its directory's name). Does not descend
/// into `.git` directories, bare repositories or the root's own `.git`.
/// Returns the directories it could not open (their contents unchecked);
/// with `open_up`, one refused for its mode is made 0700 first (after a
/// run: the command's own directories).
fn walk(
    root: &Path,
    open_up: bool,
    found: &mut impl FnMut(&OwnedFd, &Path, &OsStr, RepoKind, (u64, u64)),
) -> std::io::Result<Vec<PathBuf>> {
    let mut unreadable = Vec::new();
    let root_fd: OwnedFd = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(root_fd, PathBuf::new())];
    while let Some((dir, rel)) = stack.pop() {
        let names = list(&dir)?;
        if !rel.as_os_str().is_empty()
            && let Some(head) = bare_head(&dir, &names)
        {
            let name = rel.file_name().unwrap_or_default();
            found(&dir, &rel, name, RepoKind::Bare, head);
            continue;
        }
        for name in names {
            let Ok(st) = fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue; // gone meanwhile
            };
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if name == ".git" {
                if rel.as_os_str().is_empty() {
                    continue; // the root's own
                }
                let id = (st.st_dev, st.st_ino);
                let repo = match kind {
                    SFlag::S_IFDIR => RepoKind::GitDir,
                    SFlag::S_IFREG => RepoKind::GitFile,
                    _ => RepoKind::Other,
                };
                found(&dir, &rel, &name, repo, id);
                continue;
            }
            if kind != SFlag::S_IFDIR {
                continue;
            }
            match nix::fcntl::openat(
                dir.as_fd(),
                name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(child) => stack.push((child, rel.join(&name))),
                Err(nix::errno::Errno::ENOENT) => {} // gone meanwhile
                Err(nix::errno::Errno::EACCES) if open_up => {
                    // A directory the command made unreadable: ours (same
                    // user), so opened up to be looked into.
                    let opened = nix::sys::stat::fchmodat(
                        dir.as_fd(),
                        name.as_os_str(),
                        Mode::from_bits_truncate(0o700),
                        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                    )
                    .ok()
                    .and_then(|()| {
                        nix::fcntl::openat(
                            dir.as_fd(),
                            name.as_os_str(),
                            OFlag::O_RDONLY
                                | OFlag::O_DIRECTORY
                                | OFlag::O_NOFOLLOW
                                | OFlag::O_CLOEXEC,
                            Mode::empty(),
                        )
                        .ok()
                    });
                    match opened {
                        Some(child) => stack.push((child, rel.join(&name))),
                        None => unreadable.push(root.join(&rel).join(&name)),
                    }
                }
                Err(_) => unreadable.push(root.join(&rel).join(&name)),
            }
        }
    }
    Ok(unreadable)
}

/// The names in `dir`, `.` and `..` left out; raw bytes, so that no name
/// (UTF-8 or not) is skipped.
fn list(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let mut handle = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let mut names = Vec::new();
    for entry in handle.iter() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(OsStr::from_bytes(bytes).to_os_string());
        }
    }
    Ok(names)
}

/// A directory git would take for a git dir when run in it: HEAD (a file)
/// and objects/ and refs/ directories, or a `commondir` file. The device
/// and inode of its HEAD.
fn bare_head(dir: &OwnedFd, names: &[OsString]) -> Option<(u64, u64)> {
    let stat = |name: &str, want: SFlag| {
        if !names.iter().any(|n| n == name) {
            return None;
        }
        fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .filter(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == want)
    };
    let head = stat("HEAD", SFlag::S_IFREG)?;
    // Its own objects and refs, or a common dir named in `commondir` (a
    // worktree's git dir).
    let own = stat("objects", SFlag::S_IFDIR).is_some() && stat("refs", SFlag::S_IFDIR).is_some();
    (own || stat("commondir", SFlag::S_IFREG).is_some()).then_some((head.st_dev, head.st_ino))
}
