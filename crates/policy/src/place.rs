//! Whether one path lies inside a directory as the kernel sees the tree,
//! never by comparing text: links and `..` resolved, then either a
//! directory on the path's way up is the same directory (device and
//! inode), or both are on the same filesystem and the path's place in it
//! is below the directory's (a bind mount shows a directory at a second
//! path: `/mnt/w` bound from `/srv/w/sub` is inside `/srv/w`). Which
//! mount a path is on is asked of the kernel (statx's mount id), never
//! guessed from the mount table's text: mounts stacked on one place, or a
//! mount over a parent, hide what is below them.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Whether `path` (which may not exist yet: its deepest existing part is
/// judged) is `dir` or lies below it.
pub fn within(path: &Path, dir: &Path) -> io::Result<bool> {
    let dir = dir.canonicalize()?;
    let path = existing_part(path)?.canonicalize()?;
    let dir_meta = std::fs::metadata(&dir)?;
    for up in path.ancestors() {
        let meta = std::fs::metadata(up)?;
        if meta.dev() == dir_meta.dev() && meta.ino() == dir_meta.ino() {
            return Ok(true);
        }
    }
    // A mount the kernel does not name or list cannot be judged: an error
    // (callers refuse), never "outside".
    let (Some(a), Some(b)) = (fs_place(&path)?, fs_place(&dir)?) else {
        return Err(io::Error::other(format!(
            "cannot tell which mount {} or {} is on",
            path.display(),
            dir.display()
        )));
    };
    Ok(a.0 == b.0 && a.1.starts_with(&b.1))
}

/// A resolved path's place: its filesystem (`major:minor`) and its path
/// from that filesystem's root, through the mount the kernel says it is
/// on. `None` when the mount table does not list that mount.
pub fn fs_place(path: &Path) -> io::Result<Option<(String, PathBuf)>> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let st = statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::MNT_ID)?;
    if !StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID) {
        return Ok(None);
    }
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mounts = parse_mountinfo(&text);
    Ok(place_on(&mounts, st.stx_mnt_id, path))
}

/// The longest leading part of `path` that exists.
fn existing_part(path: &Path) -> io::Result<&Path> {
    for up in path.ancestors() {
        match std::fs::symlink_metadata(up) {
            Ok(_) => return Ok(up),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Path::new("/"))
}

/// One line of /proc/self/mountinfo: its id, the filesystem
/// (`major:minor`), the directory of it mounted, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u64,
    pub device: String,
    pub root: PathBuf,
    pub mount_point: PathBuf,
}

/// The mounts of a mountinfo text, in its order (later mounts over
/// earlier ones); lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?.parse().ok()?;
            let device = fields.nth(1)?.to_string();
            let root = unescape(fields.next()?);
            let mount_point = unescape(fields.next()?);
            Some(MountEntry {
                id,
                device,
                root,
                mount_point,
            })
        })
        .collect()
}

/// A (resolved) path on mount `id` as its filesystem knows it: the
/// device, and the path from that filesystem's root.
fn place_on(mounts: &[MountEntry], id: u64, path: &Path) -> Option<(String, PathBuf)> {
    let mount = mounts.iter().find(|m| m.id == id)?;
    let below = path.strip_prefix(&mount.mount_point).ok()?;
    Some((mount.device.clone(), mount.root.join(below)))
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_mount_is_judged_by_its_place_in_the_filesystem() {
        let text = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 8:1 /srv/w/sub /mnt/w rw - ext4 /dev/sda1 rw
31 22 8:1 /srv/other /mnt/o\\040x rw - ext4 /dev/sda1 rw
32 22 0:40 / /tmp rw - tmpfs tmpfs rw
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts[2].mount_point, PathBuf::from("/mnt/o x"));
        let place = |id: u64, p: &str| place_on(&mounts, id, Path::new(p)).unwrap();
        assert_eq!(
            place(30, "/mnt/w/L"),
            ("8:1".to_string(), PathBuf::from("/srv/w/sub/L"))
        );
        assert_eq!(
            place(31, "/mnt/o x/y"),
            ("8:1".into(), PathBuf::from("/srv/other/y"))
        );
        assert_eq!(place(32, "/tmp/a"), ("0:40".into(), PathBuf::from("/a")));
        assert!(place(30, "/mnt/w/L").1.starts_with(place(22, "/srv/w").1));
        assert!(!place(31, "/mnt/o x/y").1.starts_with(place(22, "/srv/w").1));
        // Two mounts stacked on one place: the id says which one.
        let stacked = "22 1 8:1 / / rw - ext4 /dev/sda1 rw
40 22 0:50 / /mnt/a rw - tmpfs none rw
41 40 8:1 /srv/w/sub /mnt/a rw - ext4 /dev/sda1 rw
";
        let mounts = parse_mountinfo(stacked);
        assert_eq!(
            place_on(&mounts, 41, Path::new("/mnt/a/L")).unwrap(),
            ("8:1".into(), PathBuf::from("/srv/w/sub/L"))
        );
    }

    #[test]
    fn links_and_dotdot_are_resolved_before_judging() {
        let top = tempfile::tempdir().unwrap();
        let ws = top.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::os::unix::fs::symlink(ws.join("sub"), top.path().join("alias")).unwrap();
        assert!(within(&top.path().join("alias/L"), &ws).unwrap());
        std::fs::create_dir(top.path().join("other")).unwrap();
        assert!(within(&top.path().join("other/../ws/new/L"), &ws).unwrap());
        assert!(!within(&top.path().join("elsewhere/L"), &ws).unwrap());
        assert!(within(&ws, &ws).unwrap());
    }
}
