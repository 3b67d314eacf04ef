//! The launcher joins the group the engine names (`linux.cgroupsPath`)
//! before it builds the sandbox (issue 44): every process of the container
//! is then below it, whether or not the container has limits of its own, so
//! the pod's and QoS class's limits above hold; and the engine, which reads
//! the container's usage from the group of the container's pid (the
//! launcher's), reports the container's (ContainerStats), not the engine's.
//!
//! Joined: the cgroup v1 hierarchies of the controllers the runtime limits
//! (pids, memory, cpu), and the v2 hierarchy when it has none of those (a
//! hybrid host) or the container asks no limit. On a pure v2 host with
//! limits the sandbox's groups (below the same path) need it free of
//! processes: the launcher stays where it is there.

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
                limited(h)
            }
        })
        .cloned()
        .collect()
}

/// One group joined: put back and removed (when made here) by `leave`.
#[derive(Debug)]
struct Joined {
    group: PathBuf,
    /// The group this process was in before.
    before: PathBuf,
    made: bool,
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
            let made = !group.is_dir();
            if made {
                fs::create_dir_all(&group)?;
            }
            // Recorded first: a failed move still removes what was made.
            this.joined.push(Joined {
                group: group.clone(),
                before,
                made,
            });
            if let Err(e) = fs::write(group.join("cgroup.procs"), std::process::id().to_string()) {
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
            if joined.made {
                remove_when_empty(&joined.group);
            }
        }
    }
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
40 1 8:1 / / rw - ext4 /dev/vda rw
";

    #[test]
    fn a_hybrid_host_joins_the_limited_v1_hierarchies_and_the_empty_v2() {
        let all = hierarchies(HYBRID);
        assert_eq!(all.len(), 5);
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
                "/sys/fs/cgroup/pids"
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
