//! Where the host's cgroup hierarchies are mounted (v2, and v1 with their
//! controllers), read from mountinfo: what the launcher's groups and
//! `check --host`'s probes are made in.

use std::path::PathBuf;

/// One cgroup filesystem mount: v2, or v1 with its controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    /// Empty for v2.
    pub controllers: Vec<String>,
    pub v2: bool,
}

/// Reads cgroup mounts from a mountinfo text (see proc(5)).
pub fn parse_cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split(' ').nth(4);
        let mut right = right.split(' ');
        let fstype = right.next();
        let super_options = right.nth(1).unwrap_or("");
        let (Some(mount_point), Some(fstype)) = (mount_point, fstype) else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
        match fstype {
            "cgroup2" => mounts.push(CgroupMount {
                mount_point,
                controllers: Vec::new(),
                v2: true,
            }),
            "cgroup" => mounts.push(CgroupMount {
                mount_point,
                controllers: super_options
                    .split(',')
                    .filter(|o| {
                        ["pids", "memory", "cpu", "cpuacct", "cpuset", "freezer"].contains(o)
                    })
                    .map(str::to_string)
                    .collect(),
                v2: false,
            }),
            _ => {}
        }
    }
    mounts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn parses_hybrid_mountinfo() {
        let text = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 35 0:35 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
41 35 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
42 35 0:37 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let mounts = parse_cgroup_mounts(text);
        assert_eq!(mounts.len(), 4);
        assert!(mounts[0].v2 && mounts[0].mount_point == Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(mounts[2].controllers, ["cpu", "cpuacct"]);
        assert_eq!(mounts[3].controllers, ["memory"]);
    }
}
