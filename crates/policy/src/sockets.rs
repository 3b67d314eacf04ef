//! Host Unix sockets a bind would put in a sandbox's view. Landlock before
//! ABI 9 has no right for connect(2) to a pathname socket: a socket bound
//! in (or found below a bound directory) is reachable, whatever the rules
//! say. The scan is bounded (a bind of a large tree is not walked whole),
//! and says when it stopped early.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Directories below a bind's source looked into (the source is depth 0).
pub const SCAN_DEPTH: usize = 3;
/// Entries read in all before the scan stops.
pub const SCAN_ENTRIES: usize = 4096;

/// What a scan found: the sockets, and whether it stopped before the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketScan {
    pub sockets: Vec<PathBuf>,
    pub cut: bool,
}

/// The Unix sockets at or below `source` (links not followed), at most
/// `SCAN_DEPTH` directories down and `SCAN_ENTRIES` entries read.
pub fn unix_sockets_at(source: &Path) -> SocketScan {
    let mut scan = SocketScan::default();
    let Ok(meta) = std::fs::symlink_metadata(source) else {
        return scan;
    };
    if meta.file_type().is_socket() {
        scan.sockets.push(source.to_path_buf());
        return scan;
    }
    let mut budget = SCAN_ENTRIES;
    let mut dirs = vec![(source.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if budget == 0 {
                scan.cut = true;
                return scan;
            }
            budget -= 1;
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_socket() {
                scan.sockets.push(entry.path());
            } else if kind.is_dir() {
                if depth + 1 < SCAN_DEPTH {
                    dirs.push((entry.path(), depth + 1));
                } else {
                    scan.cut = true;
                }
            }
        }
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_found_at_and_below_a_source_within_the_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(deep.join("c/d")).unwrap();
        let top = dir.path().join("top.sock");
        let _top = std::os::unix::net::UnixListener::bind(&top).unwrap();
        let _deep = std::os::unix::net::UnixListener::bind(deep.join("c/d/far.sock")).unwrap();
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let scan = unix_sockets_at(dir.path());
        assert_eq!(scan.sockets, vec![top.clone()]);
        assert!(scan.cut, "a/b/c was not looked into");
        assert_eq!(
            unix_sockets_at(&top),
            SocketScan {
                sockets: vec![top.clone()],
                cut: false
            }
        );
        assert_eq!(
            unix_sockets_at(&dir.path().join("file")),
            SocketScan::default()
        );
    }
}
