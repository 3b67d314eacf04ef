//! Freezing a warm sandbox between its turns. Nothing but init should run
//! in one then (each turn ends by killing every other process of its pid
//! namespace); frozen, not even a process that somehow outlived that can
//! run, and the sandbox costs the scheduler nothing. The launcher makes
//! the group (the v1 freezer hierarchy on hybrid hosts, else the sandbox's
//! v2 group, where `cgroup.freeze` is part of the core) and tells the
//! daemon where it is; the daemon freezes after a turn's answer and thaws
//! before the next request. A v1 freezer's frozen tasks do not die of
//! SIGKILL until thawed: `SandboxCgroups::cleanup` thaws first.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::delegate::own_parent;
use super::{CgroupParent, SandboxCgroups, create_group, is_cgroup_fs, own_path};
use crate::cgroupfs::{CgroupMount, parse_cgroup_mounts};

/// Which interface a freezer group has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreezerVersion {
    /// `freezer.state`: FROZEN, THAWED (FREEZING on the way).
    V1,
    /// `cgroup.freeze`: 1, 0 (`cgroup.events` says `frozen 1` once done).
    V2,
}

/// A sandbox's freezer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freezer {
    pub group: PathBuf,
    pub version: FreezerVersion,
}

/// Why a freezer named by someone else (the launcher, over the control
/// socket) is not used: it is not a group on a cgroup filesystem.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} is not a cgroup of a cgroup filesystem", .0.display())]
pub struct NotAFreezer(pub PathBuf);

impl Freezer {
    /// This freezer, when its group is a cgroup (a daemon writes only to
    /// cgroup files, whatever path it was told).
    pub fn checked(self) -> Result<Self, NotAFreezer> {
        let file_ok = self.control_file().is_file();
        if self.group.is_absolute() && is_cgroup_fs(&self.group) && file_ok {
            Ok(self)
        } else {
            Err(NotAFreezer(self.group))
        }
    }

    fn control_file(&self) -> PathBuf {
        self.group.join(match self.version {
            FreezerVersion::V1 => "freezer.state",
            FreezerVersion::V2 => "cgroup.freeze",
        })
    }

    /// Asks the kernel to freeze every process of the group; it completes
    /// on its own (`is_frozen`).
    pub fn freeze(&self) -> std::io::Result<()> {
        fs::write(
            self.control_file(),
            match self.version {
                FreezerVersion::V1 => "FROZEN",
                FreezerVersion::V2 => "1",
            },
        )
    }

    /// Lets the group's processes run again (at once: thawing does not wait).
    pub fn thaw(&self) -> std::io::Result<()> {
        fs::write(
            self.control_file(),
            match self.version {
                FreezerVersion::V1 => "THAWED",
                FreezerVersion::V2 => "0",
            },
        )
    }

    /// Whether every process of the group is frozen now.
    pub fn is_frozen(&self) -> std::io::Result<bool> {
        Ok(match self.version {
            FreezerVersion::V1 => fs::read_to_string(self.control_file())?.trim() == "FROZEN",
            FreezerVersion::V2 => fs::read_to_string(self.group.join("cgroup.events"))?
                .lines()
                .any(|line| line.trim() == "frozen 1"),
        })
    }
}

impl SandboxCgroups {
    /// Thaws the sandbox's freezer group, if it has one (before it is
    /// killed: a v1 freezer's frozen tasks do not die until thawed).
    pub fn thaw(&self) {
        if let Some(freezer) = &self.freezer {
            let _ = freezer.thaw();
        }
    }

    /// A group to freeze the sandbox in, made before its first process
    /// enters the groups (`entry`: it enters every group made). Err: why there is
    /// none (no freezer hierarchy, no group of ours to make it in).
    pub fn add_freezer(
        &mut self,
        name: &str,
        parent: Option<&CgroupParent>,
    ) -> Result<Freezer, String> {
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map(|t| parse_cgroup_mounts(&t))
            .unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let (mount, version) = freezer_mount(&mounts)
            .ok_or_else(|| "no cgroup hierarchy freezes (no v1 freezer, no v2)".to_string())?;
        // A process is in one group per hierarchy: the sandbox's own there
        // when its limits made one (v2, or a v1 freezer mounted with a
        // limit's controller); the core's v2 freezer needs no controller.
        let made = self
            .groups
            .iter()
            .find(|g| g.starts_with(&mount.mount_point))
            .cloned();
        let group = match made {
            Some(group) => group,
            None => self.make_freezer_group(&mount.mount_point, version, &own, name, parent)?,
        };
        let freezer = Freezer { group, version };
        if !freezer.control_file().is_file() {
            return Err(format!(
                "{} has no {} (a kernel without the cgroup v2 freezer)",
                freezer.group.display(),
                freezer.control_file().display()
            ));
        }
        self.freezer = Some(freezer.clone());
        Ok(freezer)
    }

    /// Makes the sandbox's group in the freezer's hierarchy; first thaws
    /// orphans beside it and removes stale groups (`sweep_stale`). A group
    /// of that name already there, populated, is another launch's: no
    /// freezer then, rather than one the sandbox is not in.
    fn make_freezer_group(
        &mut self,
        mount_point: &Path,
        version: FreezerVersion,
        own: &str,
        name: &str,
        parent: Option<&CgroupParent>,
    ) -> Result<PathBuf, String> {
        let base = match parent {
            Some(p) => mount_point.join(p.path().strip_prefix("/").unwrap_or(p.path())),
            None => own_parent(
                mount_point,
                own_path(own, version == FreezerVersion::V2, "freezer"),
            ),
        };
        super::sweep_stale(&base, super::STALE_AFTER);
        let group = base.join(format!("substrat-{name}-{}", std::process::id()));
        match create_group(&group) {
            Ok(()) => {
                self.groups.push(group.clone());
                Ok(group)
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(format!(
                "{} exists and holds processes of another launch",
                group.display()
            )),
            Err(e) => Err(format!("cannot create {}: {e}", group.display())),
        }
    }
}

/// A frozen group whose launcher (the pid its name ends with) is gone: a
/// launcher killed by SIGKILL while its warm sandbox was frozen. Thawed,
/// so that the sandbox's processes die of the parent-death signals they
/// hold pending; a later sweep removes the empty group. A pid in use again
/// leaves the group alone (it may be a live launcher's).
pub(super) fn thaw_orphan(group: &Path, name: &str) {
    let state = group.join("freezer.state");
    let frozen = fs::read_to_string(&state).is_ok_and(|s| s.trim() != "THAWED");
    let launcher = name
        .rsplit_once('-')
        .and_then(|(_, pid)| pid.parse::<i32>().ok());
    let gone = launcher.is_some_and(|pid| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
    });
    if frozen && gone {
        let _ = fs::write(state, "THAWED");
    }
}

/// The v1 freezer hierarchy where one is mounted (hybrid hosts), else the
/// v2 hierarchy.
fn freezer_mount(mounts: &[CgroupMount]) -> Option<(&CgroupMount, FreezerVersion)> {
    mounts
        .iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == "freezer"))
        .map(|m| (m, FreezerVersion::V1))
        .or_else(|| {
            mounts
                .iter()
                .find(|m| m.v2)
                .map(|m| (m, FreezerVersion::V2))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(point: &str, controllers: &[&str], v2: bool) -> CgroupMount {
        CgroupMount {
            mount_point: PathBuf::from(point),
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
            v2,
        }
    }

    #[test]
    fn the_v1_freezer_comes_before_v2() {
        let hybrid = [
            mount("/sys/fs/cgroup/unified", &[], true),
            mount("/sys/fs/cgroup/memory", &["memory"], false),
            mount("/sys/fs/cgroup/freezer", &["freezer"], false),
        ];
        let (m, v) = freezer_mount(&hybrid).unwrap();
        assert_eq!(
            (m.mount_point.as_path(), v),
            (Path::new("/sys/fs/cgroup/freezer"), FreezerVersion::V1)
        );
        let unified = [mount("/sys/fs/cgroup", &[], true)];
        let (m, v) = freezer_mount(&unified).unwrap();
        assert_eq!(
            (m.mount_point.as_path(), v),
            (Path::new("/sys/fs/cgroup"), FreezerVersion::V2)
        );
        assert!(freezer_mount(&[mount("/sys/fs/cgroup/pids", &["pids"], false)]).is_none());
    }

    #[test]
    fn a_freezer_outside_a_cgroup_filesystem_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("freezer.state"), "THAWED").unwrap();
        let named = Freezer {
            group: dir.path().to_path_buf(),
            version: FreezerVersion::V1,
        };
        assert_eq!(
            named.clone().checked(),
            Err(NotAFreezer(dir.path().to_path_buf()))
        );
        let relative = Freezer {
            group: PathBuf::from("sys/fs/cgroup/freezer"),
            version: FreezerVersion::V1,
        };
        assert!(relative.checked().is_err());
    }

    /// A launcher killed by SIGKILL while its sandbox was frozen (v1): the
    /// next sweep beside it thaws the group, its processes die of the
    /// SIGKILL they hold pending, and the group is left empty.
    #[test]
    fn the_sweep_thaws_a_frozen_orphan() {
        let test = "the_sweep_thaws_a_frozen_orphan";
        let parent = Path::new("/sys/fs/cgroup/freezer");
        if !nix::unistd::geteuid().is_root() || !parent.join("cgroup.procs").exists() {
            println!("SKIPPED {test}: needs root and the v1 freezer hierarchy");
            return;
        }
        // A pid that is gone: a child that has ended and been reaped.
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let dead = ended.id();
        ended.wait().unwrap();
        let group = parent.join(format!("substrat-orphan-test-{dead}"));
        fs::create_dir(&group).unwrap();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap();
        fs::write(group.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
        let freezer = Freezer {
            group: group.clone(),
            version: FreezerVersion::V1,
        };
        freezer.freeze().unwrap();
        while !freezer.is_frozen().unwrap() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        sleeper.kill().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(sleeper.try_wait().unwrap(), None, "frozen: SIGKILL waits");
        // Old enough to be stale.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        fs::File::open(&group).unwrap().set_modified(old).unwrap();
        super::super::sweep_stale(parent, super::super::STALE_AFTER);
        let status = sleeper.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        // Empty now: removable (the next sweep's work).
        fs::remove_dir(&group).unwrap();
    }
}
