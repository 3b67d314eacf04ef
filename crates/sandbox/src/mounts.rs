//! Building the sandbox's filesystem view, inside its new mount and user
//! namespaces: a tmpfs becomes the new root, the plan's mounts are made in
//! it in order, then pivot_root leaves the host tree behind.
//!
//! Sources are opened as O_PATH descriptors before anything is mounted and
//! mounted through /proc/self/fd, so later mounts cannot change what a path
//! means. Paths inside writable (agent-controlled) trees are resolved with
//! openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): a symlink planted by the
//! agent is refused, never followed.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, SFlag, fstat, mkdirat};
use nix::unistd::{chdir, pivot_root};
use serde::{Deserialize, Serialize};

use crate::plan::{Access, DEVICES, LaunchPlan, MountStep};

/// Where the new root is assembled, in the sandbox's private mount tree.
/// Sources under it were opened before it is covered.
const NEW_ROOT: &str = "/tmp";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountReport {
    pub binds: usize,
    pub skipped_optional: Vec<String>,
    pub protected: Vec<ProtectedOutcome>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtectedOutcome {
    pub path: String,
    /// `read-only`, or `created-dir` / `created-file` then read-only.
    pub action: String,
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("bind source {path} does not exist (make it exist or mark the bind optional)")]
    MissingSource { path: PathBuf },
    #[error("{what} {path}: {errno}")]
    Sys {
        what: &'static str,
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("protected path {path} is a symlink or leads through one; remove it before launching")]
    ProtectedSymlink { path: PathBuf },
    #[error(
        "bind source {path} (writable, or inside a writable tree) leads through a symlink (it may have been swapped since it was resolved); refusing"
    )]
    WritableSymlink { path: PathBuf },
    #[error("this kernel lacks {what} ({path})")]
    Unsupported { what: &'static str, path: PathBuf },
    #[error(transparent)]
    Socket(#[from] crate::socket_binds::SocketRefused),
    #[error(transparent)]
    Judged(#[from] crate::bind_judge::BindRefused),
}

pub(crate) fn sys<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(nix::errno::Errno) -> MountError + 'a {
    move |errno| MountError::Sys {
        what,
        path: path.to_path_buf(),
        errno,
    }
}

/// A source opened before mounting starts.
pub(crate) struct Source {
    pub(crate) fd: OwnedFd,
    pub(crate) is_dir: bool,
}

/// Opens the source of a bind: a writable one (a workspace, the chats)
/// without following any symlink on the way, so a directory swapped for a
/// link after the path was resolved (by an agent that can write above it)
/// cannot redirect the bind; a read-only one as the system resolves it
/// (/bin, /lib are links into /usr on Debian).
pub(crate) fn open_bind_source(path: &Path, access: Access) -> Result<Option<Source>, MountError> {
    if access == Access::Ro {
        return open_source(path);
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match openat2(nix::fcntl::AT_FDCWD, path, how) {
        Ok(fd) => {
            let st = fstat(&fd).map_err(sys("stat", path))?;
            let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            Ok(Some(Source { fd, is_dir }))
        }
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(nix::errno::Errno::ELOOP) => Err(MountError::WritableSymlink {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(sys("open", path)(e)),
    }
}

/// `open_bind_source` for a bind of `plan`: a read-only bind whose source
/// lies inside a writable bind's source (a repository in the workspace,
/// bound read-only) is opened like a writable one, without following a
/// symlink: the command of another sandbox may write there.
pub(crate) fn open_plan_source(
    plan: &LaunchPlan,
    path: &Path,
    access: Access,
) -> Result<Option<Source>, MountError> {
    open_source_among(&plan.mounts, path, access)
}

/// Where the source of a bind among `mounts` is on the host, found exactly
/// as the launch opens it (`open_plan_source`): symlinks, `..` in their
/// targets and mount points followed for a read-only source, none
/// followed for a writable one. `None` when it is missing. `check` judges
/// this path, the one the kernel will enforce, not the policy's text.
pub fn resolve_bind_source(
    mounts: &[MountStep],
    path: &Path,
    access: Access,
) -> Result<Option<PathBuf>, MountError> {
    let Some(opened) = open_source_among(mounts, path, access)? else {
        return Ok(None);
    };
    let link = fd_path(&opened.fd);
    fs::read_link(&link)
        .map(Some)
        .map_err(|e| io(e, "readlink", &link))
}

fn open_source_among(
    mounts: &[MountStep],
    path: &Path,
    access: Access,
) -> Result<Option<Source>, MountError> {
    let in_writable_tree = mounts.iter().any(|step| {
        matches!(step, MountStep::Bind { source, access: Access::Rw, .. }
            if path.starts_with(source) && path != source)
    });
    let open_as = if in_writable_tree { Access::Rw } else { access };
    open_bind_source(path, open_as)
}

pub(crate) fn open_source(path: &Path) -> Result<Option<Source>, MountError> {
    match open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => {
            let st = fstat(&fd).map_err(sys("stat", path))?;
            let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            Ok(Some(Source { fd, is_dir }))
        }
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(sys("open", path)(e)),
    }
}

pub(crate) fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `target` (absolute, inside the sandbox) under the new root.
fn in_root(target: &Path) -> PathBuf {
    let relative: PathBuf = target
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    Path::new(NEW_ROOT).join(relative)
}

/// Makes an empty directory or file for a mount to cover.
pub(crate) fn make_mount_point_for(path: &Path, dir: bool) -> Result<(), MountError> {
    make_mount_point(path, dir)
}

pub(crate) fn make_mount_point(path: &Path, dir: bool) -> Result<(), MountError> {
    if dir {
        fs::create_dir_all(path).map_err(|e| io(e, "mkdir", path))
    } else {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| io(e, "mkdir", parent))?;
        }
        if path.exists() {
            return Ok(());
        }
        fs::File::create(path)
            .map(|_| ())
            .map_err(|e| io(e, "create", path))
    }
}

pub(crate) fn io(e: std::io::Error, what: &'static str, path: &Path) -> MountError {
    let errno = nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    MountError::Sys {
        what,
        path: path.to_path_buf(),
        errno,
    }
}

/// Binds `source` at `dest` with every mount below it, then makes the
/// whole subtree nosuid, nodev and, for `Access::Ro`, read-only: a plain
/// remount changes only the top mount, and a filesystem mounted below the
/// source (or below the workspace) kept its own flags. Only flags are
/// added, so those the kernel locked on the source (noexec, atime) stay.
pub(crate) fn bind(source: &Source, dest: &Path, access: Access) -> Result<(), MountError> {
    bind_fd(&source.fd, source.is_dir, dest, access)
}

fn bind_fd(fd: &OwnedFd, is_dir: bool, dest: &Path, access: Access) -> Result<(), MountError> {
    make_mount_point(dest, is_dir)?;
    let from = fd_path(fd);
    mount(
        Some(&from),
        dest,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(sys("bind mount", dest))?;
    let mut attr = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if access == Access::Ro {
        attr |= libc::MOUNT_ATTR_RDONLY;
    }
    crate::sys::set_mount_attr_recursive(dest, attr).map_err(|errno| match errno {
        nix::errno::Errno::ENOSYS => MountError::Unsupported {
            what: "mount_setattr (Linux 5.12 or later), needed to make every mount below a \
                   bind read-only, nosuid and nodev",
            path: dest.to_path_buf(),
        },
        errno => MountError::Sys {
            what: "set mount flags (recursively)",
            path: dest.to_path_buf(),
            errno,
        },
    })
}

pub(crate) fn tmpfs(dest: &Path, mode: u32, extra: MsFlags) -> Result<(), MountError> {
    tmpfs_of(dest, mode, None, extra)
}

/// A tmpfs of at most `size` bytes when given.
fn tmpfs_of(dest: &Path, mode: u32, size: Option<u64>, extra: MsFlags) -> Result<(), MountError> {
    make_mount_point(dest, true)?;
    let data = match size {
        Some(size) => format!("mode={mode:o},size={size}"),
        None => format!("mode={mode:o}"),
    };
    mount(
        Some("tmpfs"),
        dest,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra,
        Some(data.as_str()),
    )
    .map_err(sys("mount tmpfs", dest))
}

/// Builds the view described by `plan.mounts` and pivots into it.
/// What the native backend's init mounts, opened before the first mount
/// (in init's new mount namespace: a bind's source must be a mount of the
/// caller's namespace): every bind source, the components of every
/// protected path (resolved without following symlinks), the device nodes
/// and, without a pid namespace, /proc.
#[derive(Debug)]
pub struct Opened {
    sources: Vec<Option<Source>>,
    protected: Vec<Option<ProtectedSteps>>,
    devices: Vec<(String, Option<Source>)>,
    host_proc: Option<Source>,
    /// The workspace layer's directories, when the workspace is an overlay.
    layers: Option<crate::overlay::OpenedLayers>,
}

/// A protected path's components and what had to be created for it.
#[derive(Debug)]
struct ProtectedSteps {
    steps: Vec<ProtectedStep>,
    created: Option<&'static str>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("is_dir", &self.is_dir)
            .finish()
    }
}

/// Opens everything `plan` mounts from the host (see `Opened`), each
/// bind's source judged as opened by `judge` when given.
pub fn open_for(
    plan: &LaunchPlan,
    judge: Option<&crate::bind_judge::BindJudge>,
) -> Result<Opened, MountError> {
    let mut sources = Vec::new();
    let mut protected = Vec::new();
    for step in &plan.mounts {
        let (source, steps) = match step {
            MountStep::Bind { .. } => {
                let source = crate::socket_binds::open_bind_step(plan, step)?;
                crate::bind_judge::judge(judge, step, source.as_ref())?;
                (source, None)
            }
            MountStep::Protect {
                source,
                relative,
                dir,
                ..
            } => match open_bind_source(source, Access::Rw)? {
                // No source: the writable bind itself was optional and absent.
                None => (None, None),
                // A file bind has nothing below it to protect.
                Some(root) if !root.is_dir => (None, None),
                Some(root) => {
                    let (steps, created) = resolve_protected(&root.fd, source, relative, *dir)?;
                    (None, Some(ProtectedSteps { steps, created }))
                }
            },
            _ => (None, None),
        };
        sources.push(source);
        protected.push(steps);
    }
    let devices: Vec<(String, Option<Source>)> = DEVICES
        .iter()
        .map(|d| Ok((d.to_string(), open_source(&Path::new("/dev").join(d))?)))
        .collect::<Result<_, MountError>>()?;
    let host_proc = if plan.namespaces.pid {
        None
    } else {
        open_source(Path::new("/proc"))?
    };
    let layers = match &plan.overlay {
        Some(overlay) => Some(crate::overlay::open_layers(&overlay.dirs)?),
        None => None,
    };
    Ok(Opened {
        sources,
        protected,
        devices,
        host_proc,
        layers,
    })
}

/// Builds the view described by `plan.mounts` from what `open_for` opened,
/// and pivots into it.
pub fn build_root(plan: &LaunchPlan, opened: &Opened) -> Result<MountReport, MountError> {
    // Nothing we mount may propagate back to the host.
    make_private().map_err(sys("make private", Path::new("/")))?;
    tmpfs(Path::new(NEW_ROOT), 0o755, MsFlags::empty())?;
    let mut report = MountReport::default();
    let mut pinned = std::collections::HashSet::new();
    // Under a root filesystem bound at `/`, targets resolve in that tree.
    let root_bound = crate::rootfs::has_root_bind(plan);
    let dest = |target: &Path, dir: bool| match root_bound && target != Path::new("/") {
        true => crate::rootfs::resolve_in_root(Path::new(NEW_ROOT), target, dir),
        false => Ok(in_root(target)),
    };
    let steps = plan
        .mounts
        .iter()
        .zip(&opened.sources)
        .zip(&opened.protected);
    for ((step, source), protected) in steps {
        match step {
            MountStep::Bind {
                source: path,
                target,
                access,
                optional,
                ..
            } => match source {
                Some(source) => {
                    match overlay_at(plan, opened, target) {
                        // The workspace: seen through its layer, never written.
                        Some(layers) => {
                            crate::overlay::mount_overlay(source, layers, &in_root(target))?
                        }
                        None => bind(source, &dest(target, source.is_dir)?, *access)?,
                    }
                    report.binds += 1;
                }
                None if *optional => report.skipped_optional.push(path.display().to_string()),
                None => return Err(MountError::MissingSource { path: path.clone() }),
            },
            MountStep::Tmpfs { target, mode, size } => {
                tmpfs_of(&dest(target, true)?, *mode, *size, MsFlags::empty())?
            }
            MountStep::Dev { target } => {
                crate::devproc::build_dev(&dest(target, true)?, &opened.devices, plan.max_ptys)?
            }
            MountStep::Proc { target } => {
                crate::devproc::mount_proc(&dest(target, true)?, opened.host_proc.as_ref())?
            }
            MountStep::Protect {
                target, relative, ..
            } => {
                if let Some(protected) = protected {
                    protect(protected, target, &dest, &mut pinned)?;
                    report
                        .protected
                        .push(protected_outcome(target, relative, protected.created));
                }
            }
            MountStep::RootReadOnly => {}
            MountStep::Sysfs { .. }
            | MountStep::Mqueue { .. }
            | MountStep::Mask { .. }
            | MountStep::Empty { .. }
            | MountStep::ReadOnly { .. } => {
                crate::rootfs::mount_in_root(Path::new(NEW_ROOT), step, &opened.devices)?
            }
        }
    }
    enter_root()?;
    if plan.mounts.contains(&MountStep::RootReadOnly) {
        let flags = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV;
        mount(None::<&str>, "/", None::<&str>, flags, None::<&str>)
            .map_err(sys("remount read-only", Path::new("/")))?;
    }
    Ok(report)
}

/// The opened layers when `target` is where the plan's overlay goes.
fn overlay_at<'a>(
    plan: &LaunchPlan,
    opened: &'a Opened,
    target: &Path,
) -> Option<&'a crate::overlay::OpenedLayers> {
    match &plan.overlay {
        Some(overlay) if overlay.target == target => opened.layers.as_ref(),
        _ => None,
    }
}

/// Makes every mount of this mount namespace private: nothing mounted
/// here propagates to the namespace it was copied from (the host's).
pub(crate) fn make_private() -> nix::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
}

/// pivot_root(".", ".") stacks the old root on top of the new one; detaching
/// it leaves only the new root. No host path is reachable afterwards.
fn enter_root() -> Result<(), MountError> {
    let root = Path::new(NEW_ROOT);
    chdir(root).map_err(sys("chdir", root))?;
    pivot_root(".", ".").map_err(sys("pivot_root", root))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root", root))?;
    chdir("/").map_err(sys("chdir", Path::new("/")))
}

/// Resolves `relative` inside the writable tree `root_fd` without following
/// any symlink and without leaving the tree.
pub(crate) fn open_beneath(
    root_fd: &OwnedFd,
    relative: &Path,
    flags: OFlag,
) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    openat2(root_fd.as_fd(), relative, how)
}

/// One directory or file on the way to a protected path, opened safely.
#[derive(Debug)]
pub struct ProtectedStep {
    /// Relative to the writable bind.
    pub relative: PathBuf,
    pub fd: OwnedFd,
    pub is_dir: bool,
    /// The protected path itself (read-only); the others are its directories
    /// (bound onto themselves, so they cannot be renamed away).
    pub leaf: bool,
}

/// Resolves `relative` inside the writable tree `root` without following
/// symlinks, creating what is missing as empty directories (and the leaf as
/// a file unless `dir`), and opens every component as an O_PATH descriptor.
/// Runs against the host tree: in the native sandbox before pivot_root, in
/// the bwrap launcher before bwrap starts.
pub fn resolve_protected(
    root: &OwnedFd,
    source: &Path,
    relative: &str,
    dir: bool,
) -> Result<(Vec<ProtectedStep>, Option<&'static str>), MountError> {
    let refuse = |_| MountError::ProtectedSymlink {
        path: source.join(relative),
    };
    let parts: Vec<&str> = relative.split('/').filter(|p| !p.is_empty()).collect();
    let mut created = None;
    let mut steps = Vec::new();
    let mut walked = PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        let parent = walked.clone();
        walked.push(part);
        let leaf = i + 1 == parts.len();
        let want_dir = !leaf || dir;
        match open_beneath(root, &walked, OFlag::O_PATH) {
            Ok(_) => {}
            Err(nix::errno::Errno::ENOENT) => {
                let parent_fd = if parent.as_os_str().is_empty() {
                    root.try_clone().map_err(|e| io(e, "dup", source))?
                } else {
                    open_beneath(root, &parent, OFlag::O_PATH | OFlag::O_DIRECTORY)
                        .map_err(refuse)?
                };
                create_empty(&parent_fd, part, want_dir)
                    .map_err(sys("create protected path", &source.join(&walked)))?;
                created.get_or_insert(if want_dir {
                    "created-dir"
                } else {
                    "created-file"
                });
            }
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV) => {
                return Err(refuse(nix::errno::Errno::ELOOP));
            }
            Err(e) => return Err(sys("open protected path", &source.join(&walked))(e)),
        }
        let fd = open_beneath(root, &walked, OFlag::O_PATH).map_err(refuse)?;
        let st = fstat(&fd).map_err(sys("stat", &walked))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        // O_PATH | O_NOFOLLOW opens a symlink itself rather than failing.
        if kind == SFlag::S_IFLNK {
            return Err(refuse(nix::errno::Errno::ELOOP));
        }
        steps.push(ProtectedStep {
            relative: walked.clone(),
            fd,
            is_dir: kind == SFlag::S_IFDIR,
            leaf,
        });
    }
    Ok((steps, created))
}

pub fn protected_outcome(target: &Path, relative: &str, created: Option<&str>) -> ProtectedOutcome {
    ProtectedOutcome {
        path: target.join(relative).display().to_string(),
        action: match created {
            Some(how) => format!("{how}, read-only"),
            None => "read-only".into(),
        },
    }
}

/// Whether a protected-path component must be bound at `dest`: the
/// protected path itself always, a directory on the way only the first
/// time. Binding a directory again would cover the read-only mounts made
/// inside it before (`.git` for both `.git/hooks` and `.git/config`).
pub(crate) fn needs_bind(
    pinned: &mut std::collections::HashSet<PathBuf>,
    dest: &Path,
    leaf: bool,
) -> bool {
    let first = pinned.insert(dest.to_path_buf());
    leaf || first
}

/// Keeps a protected path read-only inside its writable bind (resolved by
/// `open_for`); `pinned` remembers directories already bound: binding one
/// again would cover the read-only mounts made inside it before. `dest`
/// finds a path in the new root (under a root filesystem, through its
/// links, never out of it).
fn protect(
    protected: &ProtectedSteps,
    target: &Path,
    dest: &dyn Fn(&Path, bool) -> Result<PathBuf, MountError>,
    pinned: &mut std::collections::HashSet<PathBuf>,
) -> Result<(), MountError> {
    for step in &protected.steps {
        let dest = dest(&target.join(&step.relative), step.is_dir)?;
        if !needs_bind(pinned, &dest, step.leaf) {
            continue;
        }
        let access = if step.leaf { Access::Ro } else { Access::Rw };
        bind_fd(&step.fd, step.is_dir, &dest, access)?;
    }
    Ok(())
}

fn create_empty(parent: &OwnedFd, name: &str, dir: bool) -> nix::Result<()> {
    if dir {
        mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(0o755))
    } else {
        nix::fcntl::openat(
            parent.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map(drop)
    }
}
