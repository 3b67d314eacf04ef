//! Per-sandbox cgroups, created by the launcher before the sandbox starts:
//! v1 hierarchies where a controller is mounted there (hybrid hosts), v2
//! otherwise. Every limit is applied or reported with the reason it was not.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

mod delegate;
mod entry;
mod freezer;

pub(crate) use entry::{CgroupEntry, join_self_through, receive_go};
pub use freezer::{Freezer, FreezerVersion, NotAFreezer};

pub use delegate::DaemonGroup;
use delegate::{enable_v2_controller, own_parent, settle_daemon_in_leaf};

use crate::cgroupfs::{CgroupMount, parse_cgroup_mounts};
use crate::plan::CgroupLimits;
use substrat_policy::model::LimitEnforcement;

/// What happened to one limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum LimitOutcome {
    NotRequested,
    Applied { value: String, group: PathBuf },
    NotApplied { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CgroupReport {
    pub pids_max: LimitOutcome,
    pub memory_max: LimitOutcome,
    pub cpu_max: LimitOutcome,
}

/// The limits a policy requires that the host did not let the launcher
/// apply (each with why), and how to fix that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the policy requires its cgroup limits and this host did not let the launcher apply {}. \
     Give it a cgroup delegated to you: `--cgroup-parent GROUP` (a group made yours in each \
     hierarchy, e.g. by an administrator or by systemd's Delegate=yes), or run it as root; \
     or mark the limits best-effort in the policy (`[cgroup] enforcement = \"best-effort\"`: \
     rlimits stand in where they can)",
    .0.join(", ")
)]
pub struct UnmetLimits(pub Vec<String>);

/// Makes the sandbox's groups (`create`); when the policy requires its
/// limits and one is not in force, removes them again and says why: the
/// launch must stop before anything starts.
pub fn create_required(
    limits: &CgroupLimits,
    name: &str,
    parent: Option<&CgroupParent>,
) -> Result<(SandboxCgroups, CgroupReport), UnmetLimits> {
    let (mut groups, report) = create(limits, name, parent);
    match unmet_requirement(limits, &report) {
        Some(unmet) => {
            groups.cleanup();
            Err(unmet)
        }
        None => Ok((groups, report)),
    }
}

/// Why a launch under a policy whose limits are required must stop. `None`
/// when every requested limit is in force or the policy takes them
/// best-effort.
pub fn unmet_requirement(limits: &CgroupLimits, report: &CgroupReport) -> Option<UnmetLimits> {
    if limits.enforcement != LimitEnforcement::Required {
        return None;
    }
    let missing: Vec<String> = [
        ("pids_max", &report.pids_max),
        ("memory_max", &report.memory_max),
        ("cpu_max", &report.cpu_max),
    ]
    .into_iter()
    .filter_map(|(name, outcome)| match outcome {
        LimitOutcome::NotApplied { reason } => Some(format!("{name} ({reason})")),
        _ => None,
    })
    .collect();
    (!missing.is_empty()).then_some(UnmetLimits(missing))
}

/// Where the sandbox's groups go, relative to each hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupParent {
    /// A group delegated to the launcher (`--cgroup-parent`): it must exist.
    Delegated(PathBuf),
    /// An engine's `linux.cgroupsPath` (substrat-oci): made when missing (a
    /// v2 controller enabled on the way down), and its last component
    /// removed again at the end when this launch made it, as runc does.
    /// The engine's limits on the groups above hold for the sandbox's.
    Engine(PathBuf),
}

impl CgroupParent {
    fn path(&self) -> &Path {
        match self {
            Self::Delegated(p) | Self::Engine(p) => p,
        }
    }
}

/// The groups made for one sandbox; removed by `cleanup`.
#[derive(Debug, Default)]
pub struct SandboxCgroups {
    groups: Vec<PathBuf>,
    /// Engine parents this launch made (`CgroupParent::Engine`).
    made_parents: Vec<PathBuf>,
    /// A warm sandbox's freezer group (`add_freezer`), one of `groups`.
    freezer: Option<Freezer>,
}

struct LimitFiles<'a> {
    controller: &'a str,
    /// (file, value) pairs to write, v1 and v2 spelling.
    v1: Vec<(&'a str, String)>,
    v2: Vec<(&'a str, String)>,
}

/// Creates `substrat-<name>` groups with the limits. They go below `parent`
/// (a path relative to each hierarchy's root, e.g. a group an administrator
/// delegated to this user) or, without one, below this process's own group.
pub fn create(
    limits: &CgroupLimits,
    name: &str,
    parent: Option<&CgroupParent>,
) -> (SandboxCgroups, CgroupReport) {
    let mut groups = SandboxCgroups::default();
    if limits.pids_max.is_none() && limits.memory_max.is_none() && limits.cpu_max.is_none() {
        // Nothing to make: do not even read the host's cgroup layout.
        let report = CgroupReport {
            pids_max: LimitOutcome::NotRequested,
            memory_max: LimitOutcome::NotRequested,
            cpu_max: LimitOutcome::NotRequested,
        };
        return (groups, report);
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_cgroup_mounts(&t))
        .unwrap_or_default();
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut apply = |files: Option<LimitFiles<'_>>| match files {
        None => LimitOutcome::NotRequested,
        Some(files) => groups.apply(&mounts, &own, parent, name, &files),
    };
    let pids = limits.pids_max.map(|n| LimitFiles {
        controller: "pids",
        v1: vec![("pids.max", n.to_string())],
        v2: vec![("pids.max", n.to_string())],
    });
    let memory = limits.memory_max.map(|n| LimitFiles {
        controller: "memory",
        v1: vec![("memory.limit_in_bytes", n.to_string())],
        v2: vec![
            ("memory.max", n.to_string()),
            ("memory.swap.max", "0".to_string()),
        ],
    });
    let cpu = limits.cpu_max.map(|cpus| {
        let quota = ((cpus * 100_000.0).round() as u64).max(1000);
        LimitFiles {
            controller: "cpu",
            v1: vec![
                ("cpu.cfs_period_us", "100000".into()),
                ("cpu.cfs_quota_us", quota.to_string()),
            ],
            v2: vec![("cpu.max", format!("{quota} 100000"))],
        }
    });
    let report = CgroupReport {
        pids_max: apply(pids),
        memory_max: apply(memory),
        cpu_max: apply(cpu),
    };
    (groups, report)
}

/// At a daemon's start, without `--cgroup-parent`: on a cgroup v2 host
/// (every controller the launcher uses there), a daemon alone in a group
/// delegated to it moves into its leaf (`delegate::settle_daemon_in_leaf`).
pub fn settle_daemon() -> Result<DaemonGroup, CgroupError> {
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_cgroup_mounts(&t))
        .unwrap_or_default();
    let Some(v2) = mounts.iter().find(|m| m.v2) else {
        return Ok(DaemonGroup::Stays {
            reason: "no cgroup v2 hierarchy".to_string(),
        });
    };
    let in_v1 = |c: &str| {
        mounts
            .iter()
            .any(|m| !m.v2 && m.controllers.iter().any(|x| x == c))
    };
    if ["pids", "memory", "cpu"].iter().any(|c| in_v1(c)) {
        return Ok(DaemonGroup::Stays {
            reason: "the controllers are in cgroup v1 here".to_string(),
        });
    }
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let path = own_path(&own, true, "");
    let group = v2.mount_point.join(path);
    // Root at the root of its cgroup namespace (a container's own
    // hierarchy, where it is alone) may rearrange it; elsewhere only a
    // group systemd marked delegated.
    let privileged = nix::unistd::geteuid().is_root() && !path.is_empty();
    settle_daemon_in_leaf(&group, std::process::id(), privileged)
}

/// The path of this process's group in a hierarchy, from /proc/self/cgroup.
fn own_path<'a>(own: &'a str, v2: bool, controller: &str) -> &'a str {
    own.lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if v2 {
                controllers.is_empty()
            } else {
                controllers.split(',').any(|c| c == controller)
            };
            matches.then_some(path)
        })
        .unwrap_or("/")
        .trim_start_matches('/')
}

impl SandboxCgroups {
    fn apply(
        &mut self,
        mounts: &[CgroupMount],
        own: &str,
        parent: Option<&CgroupParent>,
        name: &str,
        files: &LimitFiles<'_>,
    ) -> LimitOutcome {
        let controller = files.controller;
        let (mount, v2) = match mounts
            .iter()
            .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
        {
            Some(m) => (m, false),
            None => match mounts.iter().find(|m| m.v2) {
                Some(m) => (m, true),
                None => {
                    return LimitOutcome::NotApplied {
                        reason: format!("no cgroup hierarchy has the {controller} controller"),
                    };
                }
            },
        };
        let launcher = std::process::id();
        let parent = match parent {
            Some(p) => {
                let path = mount
                    .mount_point
                    .join(p.path().strip_prefix("/").unwrap_or(p.path()));
                if let CgroupParent::Engine(_) = p
                    && let Err(e) = self.make_parent(&mount.mount_point, &path, v2, controller)
                {
                    return LimitOutcome::NotApplied {
                        reason: format!("cannot make {}: {e}", path.display()),
                    };
                }
                path
            }
            None => own_parent(&mount.mount_point, own_path(own, v2, controller)),
        };
        if v2 && let Err(e) = enable_v2_controller(&parent, controller, launcher) {
            return LimitOutcome::NotApplied {
                reason: e.to_string(),
            };
        }
        // The launcher's pid makes the name this launch's own: a daemon
        // re-runs a turn under the same name after a restart, while the
        // killed launch's group may still hold its dying processes.
        let group = parent.join(format!("substrat-{name}-{}", std::process::id()));
        match create_group(&group) {
            Ok(()) => self.groups.push(group.clone()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && self.groups.contains(&group) => {}
            Err(e) => {
                return LimitOutcome::NotApplied {
                    reason: format!("cannot create {}: {e}", group.display()),
                };
            }
        }
        let writes = if v2 { &files.v2 } else { &files.v1 };
        let mut shown = Vec::new();
        for (i, (file, value)) in writes.iter().enumerate() {
            match fs::write(group.join(file), value) {
                Ok(()) => shown.push(format!("{file}={value}")),
                // Only the first file is the limit; later ones (swap) are refinements.
                Err(e) if i == 0 => {
                    return LimitOutcome::NotApplied {
                        reason: format!("cannot write {file}: {e}"),
                    };
                }
                Err(_) => {}
            }
        }
        LimitOutcome::Applied {
            value: shown.join(" "),
            group,
        }
    }

    /// Makes `path` (below `root`, a hierarchy's mount point) where it is
    /// missing; in v2 the controller is enabled in each group above it
    /// (the last one's is `apply`'s). The last component is remembered
    /// when made here, to be removed by `cleanup`.
    fn make_parent(
        &mut self,
        root: &Path,
        path: &Path,
        v2: bool,
        controller: &str,
    ) -> Result<(), CgroupError> {
        let relative = path.strip_prefix(root).unwrap_or(path);
        let mut dir = root.to_path_buf();
        let parts: Vec<_> = relative.components().collect();
        for (i, part) in parts.iter().enumerate() {
            // Enabled where the engine has not (never moving the launcher
            // out of the engine's groups to make room: a group that holds
            // processes refuses, and `apply` reports the limit unmet).
            if v2 {
                let control = dir.join("cgroup.subtree_control");
                let enabled = fs::read_to_string(&control).unwrap_or_default();
                if !enabled.split_whitespace().any(|c| c == controller) {
                    let _ = fs::write(&control, format!("+{controller}"));
                }
            }
            dir.push(part);
            match fs::create_dir(&dir) {
                Ok(()) if i + 1 == parts.len() => self.made_parents.push(dir.clone()),
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(CgroupError::Io {
                        path: dir.clone(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Kills whatever is left in the groups and removes them, then removes
    /// stale groups of earlier launches beside them (`sweep_stale`).
    pub fn cleanup(&mut self) {
        // Frozen processes (v1) do not die of SIGKILL until thawed.
        self.thaw();
        self.freezer = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        let parents: Vec<PathBuf> = self
            .groups
            .iter()
            .filter_map(|g| g.parent().map(Path::to_path_buf))
            .collect();
        for group in self.groups.drain(..).rev() {
            loop {
                for pid in fs::read_to_string(group.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                match fs::remove_dir(&group) {
                    Err(e) if e.kind() == ErrorKind::ResourceBusy && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    _ => break,
                }
            }
        }
        for parent in parents.iter().filter(|p| is_cgroup_fs(p)) {
            sweep_stale(parent, STALE_AFTER);
        }
        // An engine's group this launch made, empty now (another sandbox
        // below it keeps it).
        for made in self.made_parents.drain(..) {
            let _ = fs::remove_dir(made);
        }
    }
}

/// Makes the group. One of the same name left behind (a launcher killed
/// with SIGKILL leaves its groups, and pids are reused) is removed first
/// when it is empty; a populated one is another live sandbox, and stays
/// (the limit is then reported as not applied).
fn create_group(group: &Path) -> std::io::Result<()> {
    match fs::create_dir(group) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && is_cgroup_fs(group) => {
            fs::remove_dir(group).map_err(|_| e)?;
            fs::create_dir(group)
        }
        other => other,
    }
}

/// Whether `path` is on a cgroup (v1 or v2) filesystem.
fn is_cgroup_fs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|fs| {
        let kind = fs.filesystem_type();
        kind == nix::sys::statfs::CGROUP_SUPER_MAGIC
            || kind == nix::sys::statfs::CGROUP2_SUPER_MAGIC
    })
}

/// An empty group older than this is a leftover, not a launch in progress
/// (a launch moves its first process in milliseconds after making it).
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Removes empty groups of launches in `parent` older than `min_age`: the
/// groups of launchers that were killed (SIGKILL leaves no chance to clean
/// up). The kernel refuses to remove a group that still has processes or
/// child groups, so a live sandbox's group is never removed; the age keeps
/// a group another launcher has just made, and not yet filled, alone.
///
/// A launch's group is `substrat-NAME-PID` and belongs to whoever launched
/// it: a group of another owner is left alone whatever its name (the
/// `substrat-USER` group an administrator delegated to a user is that
/// user's, and an empty one must survive a launch by root beside it), and
/// so is a name not ending in a pid, or with a dot (systemd units such as
/// `substrat-daemon.service`). Returns the groups removed.
pub fn sweep_stale(parent: &Path, min_age: Duration) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(parent) else {
        return removed;
    };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let launch_name = name.starts_with("substrat-")
            && !name.contains('.')
            && name
                .rsplit_once('-')
                .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        let stale = launch_name
            && entry.file_type().is_ok_and(|t| t.is_dir())
            && entry.metadata().is_ok_and(|m| {
                m.uid() == me
                    && m.modified()
                        .is_ok_and(|made| made.elapsed().is_ok_and(|age| age >= min_age))
            });
        if stale {
            freezer::thaw_orphan(&entry.path(), &name);
        }
        if stale && fs::remove_dir(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

impl Drop for SandboxCgroups {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Why a group could not be made or filled.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot move pid {pid} into {}: {reason}", group.display())]
    Move {
        pid: String,
        group: PathBuf,
        reason: std::io::Error,
    },
    #[error("cannot move itself into its cgroup {index} of {count}: {reason}")]
    MoveSelf {
        index: usize,
        count: usize,
        reason: std::io::Error,
    },
    #[error("{0} cgroups to enter, more than one go message carries")]
    TooManyToEnter(usize),
    #[error("the cgroups' files came cut short with the go byte")]
    EntryCut,
    #[error("the go byte: {0}")]
    Go(std::io::Error),
    #[error(
        "the {controller} controller is not delegated to {} and cannot be enabled: {reason}",
        parent.display()
    )]
    NotDelegated {
        controller: String,
        parent: PathBuf,
        reason: std::io::Error,
    },
    #[error(
        "{} holds other processes besides this launcher, so no controller can be enabled for \
         groups below it: give the launcher a group of its own (`--cgroup-parent`, or \
         `systemd-run --scope -p Delegate=yes`)",
        parent.display()
    )]
    Crowded { parent: PathBuf },
    #[error(
        "this launcher's group holds it, so no controller can be enabled for groups below \
         it, and {} cannot be made to move it into: {reason}",
        leaf.display()
    )]
    NoLeaf {
        leaf: PathBuf,
        reason: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
