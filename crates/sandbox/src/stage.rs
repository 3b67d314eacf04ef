//! Binds for a sandbox that runs as a subordinate id (`hostid`): every
//! bind source is shown to it through an idmapped copy, in which files
//! owned by root appear owned by the sandbox's uid and gid, and what the
//! sandbox creates is owned by root on the disk. The sandbox's view of
//! ownership is the one it had as root (the workspace stays its owner's);
//! only its host credentials change.
//!
//! A caller's judge (`bind_judge`) may have a source shown as it is
//! instead (`BindView::AsIs`): the sandbox then acts on it as its
//! subordinate uid, a stranger to the host (substrat-oci's host paths).
//!
//! The copies are made by root, before anything drops privileges: each
//! source is opened as the plan says (no symlink followed in writable
//! trees), copied with every mount below it (open_tree), idmapped
//! (mount_setattr), and attached in a private mount namespace at a staged
//! path, `/run/substrat-bind-N` for the plan's mount step N, on a tmpfs
//! covering /run there. The backends then build the sandbox from
//! `staged_plan`, whose sources are those paths, exactly as from the plan:
//! the native holder enters the namespace for good before it drops to the
//! subordinate ids; the bwrap launcher opens bwrap's descriptors in it and
//! returns to its own, and bwrap starts in it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::unistd::ForkResult;

use crate::hostid::SubordinateIds;
use crate::mounts::{MountError, MountReport, Source};
use crate::plan::{Access, LaunchPlan, MountStep};
use crate::sys;

/// The directory a tmpfs covers in the private namespace, to hold the
/// staged sources. It exists on every system; the sources are copied
/// before it is covered, so one below it is staged like any other.
const STAGE_DIR: &str = "/run";

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(
        "cannot show {} to the sandbox through an idmapped mount: {errno} (its filesystem, or one \
         mounted below it, may not support idmapped mounts; `check --host` lists them). A \
         sandbox launched by root runs as a subordinate id and needs one; launch as the \
         workspace's owner instead",
        path.display()
    )]
    NotIdmappable {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error(
        "protected paths in {} belong to no writable bind of the plan; refusing to resolve them \
         outside the idmapped copies",
        path.display()
    )]
    Unstaged { path: PathBuf },
    #[error("cannot stage the binds ({what}): {errno}")]
    Sys {
        what: &'static str,
        errno: nix::errno::Errno,
    },
}

fn sys_error(what: &'static str) -> impl Fn(nix::errno::Errno) -> StageError {
    move |errno| StageError::Sys { what, errno }
}

/// Where the workspace layer's directory is staged.
const STAGED_LAYER: &str = "/run/substrat-layer";

/// Where mount step `index`'s source is staged.
fn staged_source(index: usize) -> PathBuf {
    Path::new(STAGE_DIR).join(format!("substrat-bind-{index}"))
}

/// `plan` as the staged namespace shows it: every bind's source replaced by
/// its staged path, and each protected path resolved in the staged copy of
/// its writable bind (the first writable bind of the same source and
/// target). A protected path with no such bind is refused: resolved from
/// the host's tree, it would be bound without the idmap. Pure.
pub fn staged_plan(plan: &LaunchPlan) -> Result<LaunchPlan, StageError> {
    let staged_bind_of = |source: &Path, target: &Path| {
        plan.mounts.iter().position(|step| {
            matches!(step, MountStep::Bind { source: s, target: t, access: Access::Rw, .. }
                if s == source && t == target)
        })
    };
    let mut staged = plan.clone();
    for (index, step) in staged.mounts.iter_mut().enumerate() {
        match step {
            MountStep::Bind { source, .. } => *source = staged_source(index),
            MountStep::Protect { source, target, .. } => match staged_bind_of(source, target) {
                Some(bind) => *source = staged_source(bind),
                None => {
                    return Err(StageError::Unstaged {
                        path: source.clone(),
                    });
                }
            },
            _ => {}
        }
    }
    if let Some(overlay) = &mut staged.overlay {
        let dirs = &mut overlay.dirs;
        let root = std::mem::replace(&mut dirs.root, STAGED_LAYER.into());
        let restage = |path: &mut PathBuf| match path.strip_prefix(&root) {
            Ok(relative) => {
                *path = Path::new(STAGED_LAYER).join(relative);
                Ok(())
            }
            Err(_) => Err(StageError::Unstaged { path: path.clone() }),
        };
        for path in dirs.frozen.iter_mut() {
            restage(path)?;
        }
        restage(&mut dirs.upper)?;
        restage(&mut dirs.work)?;
    }
    Ok(staged)
}

/// Writes the plan's host paths back into a report made from
/// `staged_plan(plan)` (optional sources found absent).
pub fn report_host_paths(plan: &LaunchPlan, report: &mut MountReport) {
    for path in &mut report.skipped_optional {
        let host = plan
            .mounts
            .iter()
            .enumerate()
            .find_map(|(index, step)| match step {
                MountStep::Bind { source, .. } if staged_source(index) == Path::new(path) => {
                    Some(source)
                }
                _ => None,
            });
        if let Some(host) = host {
            *path = host.display().to_string();
        }
    }
}

/// In the calling process (root, single-threaded): a private mount
/// namespace with every bind source of `plan` staged, idmapped for `ids`.
/// The process stays in it. Each source is judged as opened when `judge`
/// is given (`RunOptions::bind_judge`): the copy is made from that one.
pub fn enter(
    plan: &LaunchPlan,
    ids: &SubordinateIds,
    judge: Option<&crate::bind_judge::BindJudge>,
) -> Result<(), StageError> {
    // Opened and copied in the host's namespace (a copy's source must be a
    // mount of the caller's namespace), before the stage covers /run.
    let mut trees = Vec::new();
    let userns = idmap_userns(ids.uid, ids.gid)?;
    for (index, step) in plan.mounts.iter().enumerate() {
        let MountStep::Bind {
            source,
            access,
            optional,
            ..
        } = step
        else {
            continue;
        };
        let opened = crate::socket_binds::open_bind_step(plan, step)?;
        let view = crate::bind_judge::judge(judge, step, opened.as_ref())?;
        match opened {
            // The judge's: shown as it is, the sandbox a stranger to it.
            Some(opened) if view == crate::bind_judge::BindView::AsIs => {
                trees.push((index, plain_copy(&opened, *access)?));
            }
            Some(opened) => {
                let copy = match idmapped_copy(&opened, source, *access, &userns) {
                    // A root filesystem on one that cannot be idmapped (an
                    // engine's overlayfs) is shown as it is: root's files
                    // are nobody's inside and cannot be changed there.
                    Err(StageError::NotIdmappable { .. })
                        if index == 0 && crate::rootfs::has_root_bind(plan) =>
                    {
                        plain_copy(&opened, *access)?
                    }
                    other => other?,
                };
                trees.push((index, copy));
            }
            // Absent and optional: nothing is staged, so the sandbox finds
            // it absent too and reports it skipped.
            None if *optional => {}
            None => {
                return Err(MountError::MissingSource {
                    path: source.clone(),
                }
                .into());
            }
        }
    }
    // The workspace layer, idmapped like the workspace: what the sandbox
    // writes there is its launcher's on the disk.
    let layer = match &plan.overlay {
        Some(overlay) => {
            let root = &overlay.dirs.root;
            let opened = crate::mounts::open_bind_source(root, Access::Rw)?
                .ok_or_else(|| MountError::MissingSource { path: root.clone() })?;
            Some(idmapped_copy(&opened, root, Access::Rw, &userns)?.0)
        }
        None => None,
    };
    unshare(CloneFlags::CLONE_NEWNS).map_err(sys_error("unshare the mount namespace"))?;
    // Nothing staged may propagate back to the host.
    crate::mounts::make_private().map_err(sys_error("make the mount namespace private"))?;
    mount(
        Some("tmpfs"),
        STAGE_DIR,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755"),
    )
    .map_err(sys_error("mount the stage tmpfs on /run"))?;
    for (index, (tree, is_dir)) in trees {
        let at = staged_source(index);
        let made = if is_dir {
            std::fs::create_dir(&at)
        } else {
            std::fs::File::create(&at).map(drop)
        };
        made.map_err(|e| StageError::Sys {
            what: "make a staged mount point",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        sys::attach_tree(&tree, &at).map_err(sys_error("attach a staged bind"))?;
    }
    if let Some(tree) = layer {
        std::fs::create_dir(STAGED_LAYER).map_err(|e| StageError::Sys {
            what: "make the staged layer's mount point",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        sys::attach_tree(&tree, Path::new(STAGED_LAYER))
            .map_err(sys_error("attach the staged layer"))?;
    }
    Ok(())
}

/// Runs `open` in a staged namespace (`enter`) and returns to the
/// caller's own; the staged namespace stays reachable through the
/// descriptor returned, for the process that will mount from it.
pub fn open_in_staged<T>(
    plan: &LaunchPlan,
    ids: &SubordinateIds,
    open: impl FnOnce() -> T,
) -> Result<(T, OwnedFd), StageError> {
    let own_ns = open_ns_fd()?;
    let cwd = nix::fcntl::open(
        ".",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(sys_error("open the working directory"))?;
    let result = match enter(plan, ids, None).and_then(|()| open_ns_fd()) {
        Ok(staged_ns) => Ok((open(), staged_ns)),
        Err(e) => Err(e),
    };
    // Back to the launcher's own namespace on every path: the launcher
    // goes on to restore the workspace on the host. setns also moves the
    // working directory to the namespace's root, hence fchdir.
    setns(&own_ns, CloneFlags::CLONE_NEWNS).map_err(sys_error("return to the mount namespace"))?;
    nix::unistd::fchdir(&cwd).map_err(sys_error("return to the working directory"))?;
    result
}

fn open_ns_fd() -> Result<OwnedFd, StageError> {
    nix::fcntl::open(
        "/proc/self/ns/mnt",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(sys_error("open /proc/self/ns/mnt"))
}

/// A detached copy of the tree at `opened`, idmapped through `userns`.
/// The bind's flags (nosuid, nodev, read-only for a read-only bind) are
/// set here, by root, with the idmap: flags set in the host's user
/// namespace are locked in the sandbox's, where a process that gained
/// capabilities (a kernel bug) could otherwise remount the copy writable
/// and, through the idmap, rewrite root's files.
fn idmapped_copy(
    opened: &Source,
    path: &Path,
    access: Access,
    userns: &OwnedFd,
) -> Result<(OwnedFd, bool), StageError> {
    let tree = sys::clone_tree(&opened.fd).map_err(|errno| StageError::Sys {
        what: "copy a bind source's mounts (open_tree)",
        errno,
    })?;
    let mut flags = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if access == Access::Ro {
        flags |= libc::MOUNT_ATTR_RDONLY;
    }
    sys::idmap_tree(&tree, userns, flags).map_err(|errno| StageError::NotIdmappable {
        path: path.to_path_buf(),
        errno,
    })?;
    Ok((tree, opened.is_dir))
}

/// A detached copy of the tree at `opened` with the bind's flags, not
/// idmapped (flags set by root: locked in the sandbox's namespace).
fn plain_copy(opened: &Source, access: Access) -> Result<(OwnedFd, bool), StageError> {
    let tree = sys::clone_tree(&opened.fd).map_err(|errno| StageError::Sys {
        what: "copy a bind source's mounts (open_tree)",
        errno,
    })?;
    let mut flags = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if access == Access::Ro {
        flags |= libc::MOUNT_ATTR_RDONLY;
    }
    sys::set_tree_attr(&tree, flags).map_err(|errno| StageError::Sys {
        what: "set a staged bind's flags",
        errno,
    })?;
    Ok((tree, opened.is_dir))
}

/// Whether a bind of `path` could be staged (`check --host`, as root, in a
/// fresh process: `substrat-sandbox __probe-idmap PATH`): an idmapped copy
/// of the mounts holding it and below it is made, then dropped.
pub fn idmap_probe_child(path: &Path) -> Result<(), IdmapProbeError> {
    let opened = crate::mounts::open_source(path)
        .map_err(StageError::from)?
        .ok_or_else(|| IdmapProbeError::Missing(path.to_path_buf()))?;
    let userns = idmap_userns(NOBODY, NOBODY)?;
    idmapped_copy(&opened, path, Access::Ro, &userns)
        .map(drop)
        .map_err(|e| match e {
            StageError::NotIdmappable { errno, .. } => IdmapProbeError::NotIdmappable(errno),
            other => IdmapProbeError::Stage(other),
        })
}

/// What the idmap probe found (`check --host` shows the text).
#[derive(Debug, thiserror::Error)]
pub enum IdmapProbeError {
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    #[error("its filesystem, or one mounted below it, cannot be idmapped ({0})")]
    NotIdmappable(nix::errno::Errno),
    #[error(transparent)]
    Stage(#[from] StageError),
}

/// The id the probe maps root's files to (any id would do).
const NOBODY: u32 = 65534;

/// A user namespace whose maps say: root's files are `uid`'s and `gid`'s
/// (0 inside is them outside). Made by a child that unshares it and waits;
/// the namespace outlives the child through the descriptor.
fn idmap_userns(uid: u32, gid: u32) -> Result<OwnedFd, StageError> {
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys_error("pipe for the idmap"))
    };
    let (ready_read, ready_write) = pipe()?;
    let (wait_read, wait_write) = pipe()?;
    let child = match sys::fork().map_err(sys_error("fork for the idmap"))? {
        ForkResult::Child => {
            drop((ready_read, wait_write));
            let byte = if unshare(CloneFlags::CLONE_NEWUSER).is_ok() {
                b"."
            } else {
                b"!"
            };
            let _ = nix::unistd::write(&ready_write, byte);
            // Blocks until the parent has the namespace and closes its end.
            let _ = nix::unistd::read(&wait_read, &mut [0u8; 1]);
            sys::exit_now(0)
        }
        ForkResult::Parent { child } => child,
    };
    drop((ready_write, wait_read));
    let mut byte = [0u8; 1];
    let ready = nix::unistd::read(&ready_read, &mut byte) == Ok(1) && byte == *b".";
    let proc_dir = PathBuf::from(format!("/proc/{child}"));
    let made = if ready {
        let write = |file: &str, id: u32| {
            std::fs::write(proc_dir.join(file), format!("0 {id} 1"))
                .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
        };
        write("uid_map", uid)
            .and_then(|()| write("gid_map", gid))
            .and_then(|()| {
                nix::fcntl::open(
                    &proc_dir.join("ns/user"),
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
            })
            .map_err(sys_error("map the idmap's user namespace"))
    } else {
        Err(StageError::Sys {
            what: "create the idmap's user namespace",
            errno: nix::errno::Errno::EPERM,
        })
    };
    drop(wait_write);
    let _ = nix::sys::wait::waitpid(child, None);
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{AgentContext, SocketUse, build_plan};

    fn sample_plan(mounts: Vec<MountStep>) -> LaunchPlan {
        let options = substrat_policy::LoadOptions::default();
        let policy = substrat_policy::load_builtin("worker", &options)
            .unwrap()
            .unwrap();
        let ctx = AgentContext {
            home_mount: crate::plan::HomeMount::None,
            terminal: false,
            workspace_layer: None,
            workspace: "/srv/ws".into(),
            home: "/home/ana".into(),
            agent_id: "a1".into(),
            host_env: vec![],
            uid: 100_000,
            gid: 100_000,
            argv: vec!["true".into()],
            agent_binds: vec![],
            pass_env: vec![],
            landlock_abi: 7,
        };
        LaunchPlan {
            mounts,
            ..build_plan(&policy, &ctx).unwrap()
        }
    }

    #[test]
    fn staged_plan_moves_every_bind_source_and_its_protected_paths() {
        let plan = sample_plan(vec![
            MountStep::Tmpfs {
                target: "/tmp".into(),
                mode: 0o1777,
                size: None,
            },
            MountStep::Bind {
                source: "/usr".into(),
                target: "/usr".into(),
                access: Access::Ro,
                optional: false,
                socket: SocketUse::Unjudged,
            },
            MountStep::Bind {
                source: "/srv/ws".into(),
                target: "/work".into(),
                access: Access::Rw,
                optional: false,
                socket: SocketUse::Unjudged,
            },
            MountStep::Bind {
                source: "/opt/maybe".into(),
                target: "/opt/maybe".into(),
                access: Access::Ro,
                optional: true,
                socket: SocketUse::Unjudged,
            },
            MountStep::Protect {
                source: "/srv/ws".into(),
                target: "/work".into(),
                relative: ".git/hooks".into(),
                dir: true,
            },
            MountStep::RootReadOnly,
        ]);
        let staged = staged_plan(&plan).unwrap();
        let expected = vec![
            MountStep::Tmpfs {
                target: "/tmp".into(),
                mode: 0o1777,
                size: None,
            },
            MountStep::Bind {
                source: "/run/substrat-bind-1".into(),
                target: "/usr".into(),
                access: Access::Ro,
                optional: false,
                socket: SocketUse::Unjudged,
            },
            MountStep::Bind {
                source: "/run/substrat-bind-2".into(),
                target: "/work".into(),
                access: Access::Rw,
                optional: false,
                socket: SocketUse::Unjudged,
            },
            MountStep::Bind {
                source: "/run/substrat-bind-3".into(),
                target: "/opt/maybe".into(),
                access: Access::Ro,
                optional: true,
                socket: SocketUse::Unjudged,
            },
            MountStep::Protect {
                source: "/run/substrat-bind-2".into(),
                target: "/work".into(),
                relative: ".git/hooks".into(),
                dir: true,
            },
            MountStep::RootReadOnly,
        ];
        assert_eq!(staged.mounts, expected);
        // Everything but the sources is the plan's.
        assert_eq!(
            LaunchPlan {
                mounts: plan.mounts.clone(),
                ..staged
            },
            plan
        );
        let mut report = MountReport {
            skipped_optional: vec!["/run/substrat-bind-3".into()],
            ..MountReport::default()
        };
        report_host_paths(&plan, &mut report);
        assert_eq!(report.skipped_optional, vec!["/opt/maybe".to_string()]);
        // A protected path outside every writable bind is not staged.
        let stray = sample_plan(vec![MountStep::Protect {
            source: "/elsewhere".into(),
            target: "/elsewhere".into(),
            relative: ".git/hooks".into(),
            dir: true,
        }]);
        assert!(matches!(
            staged_plan(&stray),
            Err(StageError::Unstaged { path }) if path == Path::new("/elsewhere")
        ));
    }
}
