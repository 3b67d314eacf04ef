//! Mount points the sandbox needs inside writable binds.
//!
//! A bind needs something to mount onto. Inside the workspace that
//! something is on the host: an empty `.cursor/` for the protected path, an
//! empty `.git/` for the agent's git dir when the workspace has no
//! repository, `.cursor/mcp.json` for a turn's configuration. The launcher
//! makes the missing ones itself before the sandbox starts (the backends
//! then find them), and removes them when it has ended, so the workspace
//! holds only what the command wrote.
//!
//! Another sandbox on the same workspace may be using the same mount point:
//! removing it would detach that sandbox's mount (the kernel lazily unmounts
//! a removed mount point in other namespaces) and with it the protection.
//! So every launch holds a shared lock on each mount point it made or uses
//! for its whole run, and removes one only when it gets the lock alone.
//! A launcher killed with SIGKILL cannot remove its own: the ones it made
//! are listed in a record file of its own (`mountpoints.<pid>` in the
//! agent's git state), and the next launch there takes over the lists of
//! launchers that are gone and removes what it finds empty and unused.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use nix::unistd::UnlinkatFlags;

use crate::mounts::{MountError, open_beneath};
use crate::plan::{Access, Holding, LaunchPlan, MountStep, mount_holding};

/// One mount point inside a writable bind: its bind's host source, the path
/// below it, and whether it is a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needed {
    pub bind_source: PathBuf,
    pub relative: PathBuf,
    pub dir: bool,
}

/// The mount points `plan` needs inside writable binds, every directory on
/// the way included, parents first: a pure function.
pub fn needed(plan: &LaunchPlan) -> Vec<Needed> {
    let mut out: Vec<Needed> = Vec::new();
    let mut push = |bind_source: &Path, relative: &Path, leaf_dir: bool| {
        let parts: Vec<_> = relative.components().collect();
        let mut walked = PathBuf::new();
        for (i, part) in parts.iter().enumerate() {
            walked.push(part);
            let dir = i + 1 < parts.len() || leaf_dir;
            let entry = Needed {
                bind_source: bind_source.to_path_buf(),
                relative: walked.clone(),
                dir,
            };
            if !out.contains(&entry) {
                out.push(entry);
            }
        }
    };
    for step in &plan.mounts {
        match step {
            MountStep::Protect {
                source,
                relative,
                dir,
                ..
            } => push(source, Path::new(relative), *dir),
            MountStep::Bind { source, target, .. } => {
                if let Some((bind_source, relative)) = inside_writable_bind(plan, target) {
                    push(&bind_source, &relative, !is_file(source));
                }
            }
            _ => {}
        }
    }
    out
}

/// The writable bind `target` would be made in (its host source and the
/// path below it), when the deepest mount holding `target` is one.
fn inside_writable_bind(plan: &LaunchPlan, target: &Path) -> Option<(PathBuf, PathBuf)> {
    match mount_holding(plan, target, Holding::Below)? {
        // A root filesystem's mount points are resolved inside it, links
        // and all (`rootfs`), by its launcher: not walked here.
        (MountStep::Bind { target: root, .. }, _) if root == Path::new("/") => None,
        (
            MountStep::Bind {
                source,
                access: Access::Rw,
                ..
            },
            relative,
        ) => Some((source.clone(), relative)),
        _ => None,
    }
}

fn is_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_dir())
}

/// A mount point in use by this launch: the directory holding it, its name,
/// and the shared lock on it.
struct InUse {
    path: PathBuf,
    parent: OwnedFd,
    name: OsString,
    lock: Flock<std::fs::File>,
    dir: bool,
    /// Made by this launch or listed by an earlier one: removed when unused.
    ours: bool,
}

/// The mount points this launch made or took over; `finish` removes those
/// no other launch holds.
pub struct MountPoints {
    in_use: Vec<InUse>,
    record: Option<PathBuf>,
}

impl std::fmt::Debug for MountPoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&PathBuf> = self.in_use.iter().map(|u| &u.path).collect();
        f.debug_struct("MountPoints")
            .field("in_use", &paths)
            .finish()
    }
}

fn sys(what: &'static str, path: &Path) -> impl FnOnce(nix::errno::Errno) -> MountError + use<> {
    let path = path.to_path_buf();
    move |errno| MountError::Sys { what, path, errno }
}

/// Makes what `plan` needs and is missing (never following a symlink: a
/// planted one stops the launch), and takes over the mount points an
/// earlier launch listed in `record` and could not remove.
pub fn prepare(plan: &LaunchPlan, record: Option<&Path>) -> Result<MountPoints, MountError> {
    let mut points = MountPoints {
        in_use: Vec::new(),
        record: record.map(Path::to_path_buf),
    };
    let mut listed = read_record(record);
    for need in needed(plan) {
        let path = need.bind_source.join(&need.relative);
        let Some(root) = crate::mounts::open_bind_source(&need.bind_source, Access::Rw)? else {
            continue; // an optional writable bind that is absent
        };
        if !root.is_dir {
            continue; // a file bind: nothing below it to protect
        }
        let parent_rel = need.relative.parent().unwrap_or(Path::new(""));
        let parent = if parent_rel.as_os_str().is_empty() {
            root.fd
        } else {
            open_beneath(&root.fd, parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
                .map_err(|_| MountError::ProtectedSymlink { path: path.clone() })?
        };
        let Some(name) = need.relative.file_name().map(|n| n.to_os_string()) else {
            continue;
        };
        let made = match fstatat(
            parent.as_fd(),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK => {
                return Err(MountError::ProtectedSymlink { path });
            }
            Ok(_) => false,
            Err(nix::errno::Errno::ENOENT) => create_if_absent(&parent, &name, need.dir, &path)?,
            Err(e) => return Err(sys("stat mount point", &path)(e)),
        };
        let was_listed = listed
            .iter()
            .position(|p| *p == path)
            .map(|i| listed.remove(i));
        // Every mount point is locked, ours or not: a launch that made one
        // must see that this one uses it before removing it.
        let mut point = lock_shared(parent, name, need.dir, path)?;
        // (lock_shared says ours when it had to make the point again.)
        point.ours |= made || was_listed.is_some();
        points.in_use.push(point);
    }
    // Listed by an earlier launch and not needed by this one: take them
    // over all the same, to remove them at the end if unused.
    for path in listed {
        if let Some(taken) = take_over(plan, &path) {
            points.in_use.push(taken);
        }
    }
    points.write_record();
    Ok(points)
}

/// Makes the mount point; whether this launch made it. One that appeared
/// since it was found absent was made by another launch at the same time:
/// it is not ours (whatever it is, it is opened without following a link).
fn create_if_absent(
    parent: &OwnedFd,
    name: &OsString,
    dir: bool,
    path: &Path,
) -> Result<bool, MountError> {
    match create(parent, name, dir) {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::EEXIST) => Ok(false),
        Err(e) => Err(sys("create mount point", path)(e)),
    }
}

fn create(parent: &OwnedFd, name: &OsString, dir: bool) -> nix::Result<()> {
    if dir {
        nix::sys::stat::mkdirat(
            parent.as_fd(),
            name.as_os_str(),
            Mode::from_bits_truncate(0o755),
        )
    } else {
        nix::fcntl::openat(
            parent.as_fd(),
            name.as_os_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map(drop)
    }
}

/// Opens `name` in `parent` and takes a shared lock on it, checking that
/// the lock is on what the name still means (a remover may have taken it
/// away in between: then it is made again).
fn lock_shared(
    parent: OwnedFd,
    name: OsString,
    dir: bool,
    path: PathBuf,
) -> Result<InUse, MountError> {
    let mut made = false;
    for _ in 0..10 {
        let flags = if dir {
            OFlag::O_RDONLY | OFlag::O_DIRECTORY
        } else {
            OFlag::O_RDONLY
        };
        let fd = match nix::fcntl::openat(
            parent.as_fd(),
            name.as_os_str(),
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => {
                made |= create_if_absent(&parent, &name, dir, &path)?;
                continue;
            }
            Err(e) => return Err(sys("open mount point", &path)(e)),
        };
        let lock = Flock::lock(std::fs::File::from(fd), FlockArg::LockShared)
            .map_err(|(_, e)| sys("lock mount point", &path)(e))?;
        if same_entry(&parent, &name, &lock) {
            return Ok(InUse {
                path,
                parent,
                name,
                lock,
                dir,
                ours: made,
            });
        }
    }
    Err(sys("lock mount point (it keeps changing)", &path)(
        nix::errno::Errno::EBUSY,
    ))
}

fn same_entry(parent: &OwnedFd, name: &OsString, lock: &Flock<std::fs::File>) -> bool {
    let (Ok(now), Ok(held)) = (
        fstatat(
            parent.as_fd(),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        fstat(lock.as_fd()),
    ) else {
        return false;
    };
    now.st_dev == held.st_dev && now.st_ino == held.st_ino
}

/// A path from the record that still exists inside one of `plan`'s
/// writable binds: locked like the ones this launch made.
fn take_over(plan: &LaunchPlan, path: &Path) -> Option<InUse> {
    let (bind_source, relative) = plan.mounts.iter().find_map(|step| match step {
        MountStep::Bind {
            source,
            access: Access::Rw,
            ..
        } if path.starts_with(source) && path != source => Some((
            source.clone(),
            path.strip_prefix(source).ok()?.to_path_buf(),
        )),
        _ => None,
    })?;
    let root = crate::mounts::open_bind_source(&bind_source, Access::Rw).ok()??;
    let parent_rel = relative.parent()?;
    let parent = if parent_rel.as_os_str().is_empty() {
        root.fd
    } else {
        open_beneath(&root.fd, parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY).ok()?
    };
    let name = relative.file_name()?.to_os_string();
    let st = fstatat(
        parent.as_fd(),
        name.as_os_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .ok()?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFDIR && kind != SFlag::S_IFREG {
        return None;
    }
    let mut point = lock_shared(parent, name, kind == SFlag::S_IFDIR, path.to_path_buf()).ok()?;
    point.ours = true; // listed: an earlier launch made it
    Some(point)
}

/// Dropped when the launch is over (the backends keep it until the sandbox
/// has ended, on every path): see `finish`.
impl Drop for MountPoints {
    fn drop(&mut self) {
        self.finish();
    }
}

impl MountPoints {
    /// After the sandbox has ended: removes, deepest first, each mount point
    /// that is empty and that no other launch holds; lists the rest in the
    /// record when another launch still uses them.
    fn finish(&mut self) {
        let mut kept = Vec::new();
        while let Some(point) = self.in_use.pop() {
            let InUse {
                path,
                parent,
                name,
                lock,
                dir,
                ours,
            } = point;
            if !ours {
                continue; // the lock goes with it
            }
            // Alone when the shared lock can become exclusive at once.
            let exclusive = match lock.relock(FlockArg::LockExclusiveNonblock) {
                Ok(()) => true,
                Err(nix::errno::Errno::EWOULDBLOCK) => false,
                Err(_) => false,
            };
            if !exclusive {
                kept.push(path);
                continue;
            }
            if same_entry(&parent, &name, &lock) && is_empty(&lock, dir) {
                let how = if dir {
                    UnlinkatFlags::RemoveDir
                } else {
                    UnlinkatFlags::NoRemoveDir
                };
                // One that cannot be removed now stays in the record: the
                // next launch tries again.
                match nix::unistd::unlinkat(parent.as_fd(), name.as_os_str(), how) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(_) => kept.push(path),
                }
            }
            // Not empty: the command (or a person) put something there; it
            // is theirs now, not a mount point of ours.
        }
        kept.reverse();
        write_paths(self.record.as_deref(), &kept);
    }

    fn write_record(&self) {
        let paths: Vec<PathBuf> = self
            .in_use
            .iter()
            .filter(|u| u.ours)
            .map(|u| u.path.clone())
            .collect();
        write_paths(self.record.as_deref(), &paths);
    }
}

fn is_empty(lock: &Flock<std::fs::File>, dir: bool) -> bool {
    if !dir {
        return lock.metadata().is_ok_and(|m| m.len() == 0);
    }
    let Ok(fd) = lock.as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(mut handle) = nix::dir::Dir::from_fd(fd) else {
        return false;
    };
    handle
        .iter()
        .all(|entry| entry.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b"..")))
}

/// The mount points listed by launches that are gone: `record` is this
/// launch's own list (`<dir>/mountpoints.<pid>`); the others in `<dir>`
/// whose pid no longer runs are read, and removed (this launch's list takes
/// their entries over).
fn read_record(record: Option<&Path>) -> Vec<PathBuf> {
    let Some(dir) = record.and_then(Path::parent) else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("mountpoints."))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if !gone || Some(entry.path().as_path()) == record {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        paths.extend(
            text.lines()
                .filter(|l| l.starts_with('/'))
                .map(PathBuf::from),
        );
        let _ = std::fs::remove_file(entry.path());
    }
    paths.sort();
    paths.dedup();
    paths
}

fn write_paths(record: Option<&Path>, paths: &[PathBuf]) {
    let Some(record) = record else {
        return;
    };
    if paths.is_empty() {
        let _ = std::fs::remove_file(record);
        return;
    }
    let text: String = paths.iter().map(|p| format!("{}\n", p.display())).collect();
    let _ = std::fs::write(record, text);
}
