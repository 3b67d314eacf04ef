//! Where an opened descriptor's object really is on the host (issue 44).
//!
//! A descriptor's path (`/proc/self/fd/N`) names where it was reached, not
//! what it is: the kubelet bind-mounts a pod's `subPath` of a `hostPath`
//! `/` at `/var/lib/kubelet/pods/UID/volume-subpaths/...`, a path that
//! looks like the pod's own while the object is the host's `/etc`. The
//! descriptor's mount (`mnt_id` in `/proc/self/fdinfo/N`) and that mount's
//! line in `/proc/self/mountinfo` say what it is: the mount's `root` is the
//! path inside its filesystem (device `major:minor`) the mount shows.
//!
//! The origins are the object's paths through the mounts of its filesystem
//! that show the most of it (the shortest `root`, `/` when the filesystem
//! is mounted whole): a subPath's bind of `/etc` is `/etc`, a pod's tmpfs
//! is where it is mounted. A descriptor whose mount is not in this
//! namespace's table (another namespace's `/proc/PID/root`) has none.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// One line of `/proc/self/mountinfo` (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountLine {
    pub id: u64,
    /// The filesystem's device, `major:minor`.
    pub dev: String,
    /// The path inside the filesystem that the mount shows.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fstype: String,
}

/// The mounts of a mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountLine> {
    let (fields, rest) = line.split_once(" - ")?;
    let mut fields = fields.split(' ');
    let id = fields.next()?.parse().ok()?;
    let _parent = fields.next()?;
    let dev = fields.next()?.to_string();
    let root = PathBuf::from(unescape(fields.next()?));
    let mount_point = PathBuf::from(unescape(fields.next()?));
    let fstype = rest.split(' ').next()?.to_string();
    // The kernel writes absolute, clean paths; anything else is no line.
    if !clean(&root) || !clean(&mount_point) {
        return None;
    }
    Some(MountLine {
        id,
        dev,
        root,
        mount_point,
        fstype,
    })
}

fn clean(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// The kernel's octal escapes (`\040` for a space) undone; an escape that
/// is not one is kept as it is.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| {
            bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount id of an open descriptor (`mnt_id` of its fdinfo).
pub fn mount_id(fd: &impl AsRawFd) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The object's host paths (see the module's comment), for a descriptor
/// on mount `mnt_id` reached at `resolved`. Empty when the mount is not in
/// `mounts` or `resolved` is not below its mount point.
pub fn origins(mounts: &[MountLine], mnt_id: u64, resolved: &Path) -> Vec<PathBuf> {
    let Some(own) = mounts.iter().find(|m| m.id == mnt_id) else {
        return Vec::new();
    };
    let Ok(below) = resolved.strip_prefix(&own.mount_point) else {
        return Vec::new();
    };
    if below
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Vec::new();
    }
    let in_fs = own.root.join(below);
    let showing: Vec<&MountLine> = mounts
        .iter()
        .filter(|m| m.dev == own.dev && in_fs.starts_with(&m.root))
        .collect();
    let Some(widest) = showing.iter().map(|m| m.root.components().count()).min() else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = showing
        .iter()
        .filter(|m| m.root.components().count() == widest)
        .filter_map(|m| Some(m.mount_point.join(in_fs.strip_prefix(&m.root).ok()?)))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The origins of an opened descriptor reached at `resolved`, read from
/// this namespace's mount table; empty when they cannot be told.
pub fn origins_of_fd(fd: &impl AsRawFd, resolved: &Path) -> Vec<PathBuf> {
    let (Some(id), Ok(text)) = (
        mount_id(fd),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return Vec::new();
    };
    origins(&parse_mountinfo(&text), id, resolved)
}

/// The origins of `path` (opened `O_PATH`, links followed) and where
/// it was reached; an error when it cannot be opened.
pub fn origins_of_path(path: &Path) -> Result<(PathBuf, Vec<PathBuf>), nix::errno::Errno> {
    use nix::fcntl::{OFlag, open};
    let fd: OwnedFd = open(
        path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    let found = origins_of_fd(&fd, &resolved);
    Ok((resolved, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:25 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
40 22 254:1 /etc /var/lib/kubelet/pods/u/volume-subpaths/v/c/0 rw shared:1 - ext4 /dev/vda1 rw
41 22 254:1 /var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/e/s /var/lib/kubelet/pods/u/volume-subpaths/v/c/1 rw - ext4 /dev/vda1 rw
42 22 0:60 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw
50 22 0:70 /@home /home rw - btrfs /dev/vdb rw
51 22 0:70 /@home/a\\040b /srv/a\\040b rw - btrfs /dev/vdb rw
";

    fn of(id: u64, resolved: &str) -> Vec<PathBuf> {
        origins(&parse_mountinfo(TABLE), id, Path::new(resolved))
    }

    #[test]
    fn a_subpath_bind_is_judged_by_what_it_shows() {
        let sp = "/var/lib/kubelet/pods/u/volume-subpaths/v/c";
        assert_eq!(of(40, &format!("{sp}/0")), [PathBuf::from("/etc")]);
        assert_eq!(of(40, &format!("{sp}/0/ssh")), [PathBuf::from("/etc/ssh")]);
        assert_eq!(
            of(41, &format!("{sp}/1")),
            [PathBuf::from(
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/e/s"
            )]
        );
        let tmpfs = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/t";
        assert_eq!(of(42, tmpfs), [PathBuf::from(tmpfs)]);
        assert_eq!(of(22, "/etc"), [PathBuf::from("/etc")]);
    }

    #[test]
    fn partial_filesystems_and_escapes() {
        assert_eq!(of(51, "/srv/a b/x"), [PathBuf::from("/home/a b/x")]);
        assert_eq!(of(50, "/home/q"), [PathBuf::from("/home/q")]);
    }

    #[test]
    fn an_unknown_mount_or_a_path_outside_it_has_no_origin() {
        assert!(of(99, "/etc").is_empty());
        assert!(of(30, "/etc").is_empty());
        assert!(of(30, "/run/../etc").is_empty());
    }
}
