//! The launcher joins the group the engine names (`linux.cgroupsPath`)
//! before it builds the sandbox (issue 44): every process of the container
//! is then below it, whether or not the container has limits of its own, so
//! the pod's and QoS class's limits above hold; and the engine, which reads
//! the container's usage from the group of the container's pid (the
//! launcher's), reports the container's (ContainerStats), not the engine's.
//!
//! Joined: every cgroup v1 hierarchy with a controller (as runc does:
//! cpuacct for the CPU the engine reports, cpuset, blkio, freezer,
//! devices... besides the pids, memory and cpu the runtime limits), and
//! the v2 hierarchy when it has none of those three (a hybrid host) or the
//! container asks no limit. On a pure v2 host with limits the sandbox's
//! groups (below the same path) need it free of processes: the launcher
//! stays where it is there. A cpuset group made here gets its parent's
//! cpus and mems (a new one has none, and no process may join it).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The controllers whose v1 hierarchies are joined.
const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// A cgroup filesystem: where it is mounted, v2 or not, its controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    pub v2: bool,
    pub controllers: Vec<String>,
}

/// The cgroup filesystems of a mount table (`/proc/self/mountinfo`).
pub fn hierarchies(mountinfo: &str) -> Vec<Hierarchy> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let kind = right.next()?;
            let options = right.nth(1).unwrap_or("");
            let v2 = match kind {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let controllers = if v2 {
                let path = Path::new(mount_point).join("cgroup.controllers");
                fs::read_to_string(path)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            } else {
                options.split(',').map(str::to_string).collect()
            };
            Some(Hierarchy {
                mount_point: PathBuf::from(mount_point.replace("\\040", " ")),
                v2,
                controllers,
            })
        })
        .collect()
}

/// The hierarchies to join, for a container with or without limits.
pub fn to_join(all: &[Hierarchy], has_limits: bool) -> Vec<Hierarchy> {
    let limited = |h: &Hierarchy| {
        h.controllers
            .iter()
            .any(|c| CONTROLLERS.contains(&c.as_str()))
    };
    all.iter()
        .filter(|h| {
            if h.v2 {
                !has_limits || !limited(h)
            } else {
                has_controller(h)
            }
        })
        .cloned()
        .collect()
}

/// A v1 hierarchy with a controller (not only a name, `name=systemd`,
/// whose group the engine's tools never read).
fn has_controller(h: &Hierarchy) -> bool {
    h.controllers
        .iter()
        .any(|c| V1_CONTROLLERS.contains(&c.as_str()))
}

/// The kernel's cgroup v1 controllers.
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// Makes the missing levels of `group` below `mount_point`, top down, a
/// cpuset level with its parent's cpus and mems; returns those it made.
fn make_levels(mount_point: &Path, group: &Path, cpuset: bool) -> io::Result<Vec<PathBuf>> {
    let mut made = Vec::new();
    let Ok(relative) = group.strip_prefix(mount_point) else {
        return Ok(made);
    };
    let mut level = mount_point.to_path_buf();
    for part in relative.components() {
        let parent = level.clone();
        level.push(part);
        // Containers created at once share levels: one made by another
        // launcher meanwhile is theirs (and may not have its cpuset yet).
        match fs::create_dir(&level) {
            Ok(()) => made.push(level.clone()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if cpuset {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if fs::read_to_string(level.join(file))?.trim().is_empty() {
                    let value = fs::read_to_string(parent.join(file))?;
                    fs::write(level.join(file), value.trim())?;
                }
            }
        }
    }
    Ok(made)
}

/// One group joined: put back and removed (when made here) by `leave`.
#[derive(Debug)]
struct Joined {
    /// The group this process was in before.
    before: PathBuf,
    /// The levels made here, top down.
    made: Vec<PathBuf>,
}

/// The groups the launcher joined.
#[derive(Debug, Default)]
pub struct EngineGroup {
    joined: Vec<Joined>,
}

impl EngineGroup {
    /// Moves this process into `cgroups_path` of each hierarchy of
    /// `hierarchies`, making the group (and the ones above) when missing.
    pub fn join(cgroups_path: &str, hierarchies: &[Hierarchy]) -> io::Result<Self> {
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let mut this = Self::default();
        let relative = Path::new(cgroups_path.trim_start_matches('/'));
        for h in hierarchies {
            let group = h.mount_point.join(relative);
            let before = h.mount_point.join(own_path(&own, h));
            let cpuset = !h.v2 && h.controllers.iter().any(|c| c == "cpuset");
            let made = make_levels(&h.mount_point, &group, cpuset);
            // Recorded first: a failed move still removes what was made.
            let made_ok = made.as_ref().map(Vec::clone).unwrap_or_default();
            this.joined.push(Joined {
                before,
                made: made_ok,
            });
            let joined = made.and_then(|_| {
                fs::write(group.join("cgroup.procs"), std::process::id().to_string())
            });
            if let Err(e) = joined {
                this.leave();
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot join {}: {e}", group.display()),
                ));
            }
        }
        Ok(this)
    }

    /// Moves this process back and removes the groups it made (as runc
    /// removes the container's group at delete).
    pub fn leave(&mut self) {
        for joined in self.joined.drain(..).rev() {
            let _ = fs::write(
                joined.before.join("cgroup.procs"),
                std::process::id().to_string(),
            );
            for level in joined.made.iter().rev() {
                remove_when_empty(level);
            }
        }
    }
}

/// The file in the container's state directory that says where its groups
/// are, for `delete` after a launcher that could not leave (SIGKILL).
pub const RECORD: &str = "cgroups";

impl EngineGroup {
    /// Writes `RECORD` in `dir`: the cgroupsPath, then each level made
    /// here, top down.
    pub fn record(&self, cgroups_path: &str, dir: &Path) -> io::Result<()> {
        let mut text = format!("path {cgroups_path}\n");
        for level in self.joined.iter().flat_map(|j| &j.made) {
            text.push_str(&format!("made {}\n", level.display()));
        }
        fs::write(dir.join(RECORD), text)
    }
}

/// Removes what a container `id` left below its cgroupsPath (`RECORD` in
/// `dir`): the sandbox's groups (`substrat-ID-*`) in every hierarchy,
/// then the levels its launcher made, bottom up, when empty. What still
/// holds a process stays. Nothing recorded, nothing done.
pub fn remove_recorded(dir: &Path, id: &str) {
    let Ok(text) = fs::read_to_string(dir.join(RECORD)) else {
        return;
    };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = format!("substrat-{id}-");
    for line in text.lines() {
        let Some(path) = line.strip_prefix("path ") else {
            continue;
        };
        let relative = Path::new(path.trim_start_matches('/'));
        if relative
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            continue;
        }
        for h in hierarchies(&mountinfo) {
            let group = h.mount_point.join(relative);
            for entry in fs::read_dir(&group).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    remove_tree(&entry.path());
                }
            }
        }
    }
    let made: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("made "))
        .collect();
    for level in made.iter().rev() {
        let level = Path::new(level);
        // Only a group: a level the launcher made in a cgroup filesystem.
        if level.starts_with("/sys/fs/cgroup") {
            let _ = fs::remove_dir(level);
        }
    }
}

/// Removes a group and the groups below it, deepest first.
fn remove_tree(group: &Path) {
    for entry in fs::read_dir(group).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path());
        }
    }
    remove_when_empty(group);
}

impl Drop for EngineGroup {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Removes a group once the sandbox's last processes, killed just before,
/// have left it (EBUSY until then); gives up after 2 s.
fn remove_when_empty(group: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while let Err(e) = fs::remove_dir(group) {
        if e.raw_os_error() != Some(libc::EBUSY) || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// This process's group in `h`, relative to its root.
fn own_path(own: &str, h: &Hierarchy) -> PathBuf {
    let path = own
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if h.v2 {
                controllers.is_empty()
            } else {
                controllers
                    .split(',')
                    .any(|c| h.controllers.iter().any(|x| x == c))
            };
            matches.then_some(path)
        })
        .unwrap_or("/");
    PathBuf::from(path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
33 25 0:29 / /sys/fs/cgroup/pids rw,nosuid shared:13 - cgroup cgroup rw,pids
34 25 0:30 / /sys/fs/cgroup/cpuset rw,nosuid shared:14 - cgroup cgroup rw,cpuset
35 25 0:31 / /sys/fs/cgroup/systemd rw,nosuid shared:15 - cgroup cgroup rw,xattr,name=systemd
40 1 8:1 / / rw - ext4 /dev/vda rw
";

    #[test]
    fn a_hybrid_host_joins_the_limited_v1_hierarchies_and_the_empty_v2() {
        let all = hierarchies(HYBRID);
        assert_eq!(all.len(), 6);
        let points = |hs: Vec<Hierarchy>| {
            hs.into_iter()
                .map(|h| h.mount_point.display().to_string())
                .collect::<Vec<_>>()
        };
        // The test's v2 mount point does not exist here: no controllers.
        let joined = points(to_join(&all, true));
        assert_eq!(
            joined,
            [
                "/sys/fs/cgroup/unified",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/cpu,cpuacct",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup/cpuset"
            ]
        );
    }

    #[test]
    fn a_pure_v2_host_with_limits_leaves_the_group_to_the_sandbox() {
        let v2 = Hierarchy {
            mount_point: "/sys/fs/cgroup".into(),
            v2: true,
            controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
        };
        assert!(to_join(std::slice::from_ref(&v2), true).is_empty());
        assert_eq!(to_join(std::slice::from_ref(&v2), false), [v2]);
    }
}
