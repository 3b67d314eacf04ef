//! The host as the plan asks about it: what a path is, where its links
//! lead (its longest existing part resolved, the rest kept), whether a
//! directory holds sockets or credential stores (bounded scans), whether
//! a path lies in a world-writable sticky directory, and every account's
//! home (the passwd database).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use substrat_policy::learn::{EntryKind, Host, SHARED_TMP};
use substrat_policy::workspace_risk::{CREDENTIAL_PATHS, HOME_TOKEN_PATHS};

/// Directories below a scanned one looked into, and entries read in all.
const SCAN_DEPTH: usize = 3;
const SCAN_ENTRIES: usize = 4096;

#[derive(Debug)]
pub struct RealHost;

impl Host for RealHost {
    fn kind(&self, path: &Path) -> Option<EntryKind> {
        let meta = std::fs::metadata(path).ok()?;
        Some(if meta.is_dir() {
            EntryKind::Dir
        } else {
            EntryKind::File
        })
    }

    fn resolve(&self, path: &Path) -> PathBuf {
        for existing in path.ancestors() {
            if let Ok(real) = existing.canonicalize()
                && let Ok(rest) = path.strip_prefix(existing)
            {
                // join("") would add a trailing `/` (a file then reads as absent).
                return match rest.as_os_str().is_empty() {
                    true => real,
                    false => real.join(rest),
                };
            }
        }
        path.to_path_buf()
    }

    fn holds_socket(&self, dir: &Path) -> bool {
        let scan = substrat_policy::sockets::unix_sockets_at(dir);
        !scan.sockets.is_empty() || scan.cut
    }

    fn holds_credential_name(&self, dir: &Path) -> bool {
        let names: Vec<&str> = CREDENTIAL_PATHS
            .iter()
            .chain(HOME_TOKEN_PATHS.iter())
            .copied()
            .collect();
        let mut budget = SCAN_ENTRIES;
        let mut dirs = vec![(dir.to_path_buf(), 0)];
        while let Some((d, depth)) = dirs.pop() {
            if names.iter().any(|n| d.join(n).symlink_metadata().is_ok()) {
                return true;
            }
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                if budget == 0 {
                    return true; // cut short: judged as holding one
                }
                budget -= 1;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    if depth + 1 > SCAN_DEPTH {
                        return true;
                    }
                    dirs.push((entry.path(), depth + 1));
                }
            }
        }
        false
    }

    fn in_shared_tmp(&self, path: &Path) -> bool {
        SHARED_TMP.iter().any(|d| path.starts_with(d))
            || path.ancestors().skip(1).any(|a| {
                std::fs::symlink_metadata(a)
                    .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o1002 == 0o1002)
            })
    }
}

/// Places system accounts name as their home that are no home.
const NOT_HOMES: [&str; 9] = [
    "/",
    "/bin",
    "/sbin",
    "/usr",
    "/dev",
    "/proc",
    "/nonexistent",
    "/var/empty",
    "/dev/null",
];

/// Every account's home in the passwd database (`/etc/passwd`; accounts
/// of NSS services such as LDAP are not listed there), resolved.
pub fn passwd_homes() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    homes_in(&text)
}

fn homes_in(text: &str) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(':').nth(5))
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .map(|h| h.canonicalize().unwrap_or(h))
        .filter(|h| {
            !NOT_HOMES.iter().any(|n| h == Path::new(n))
                && !h.starts_with("/usr")
                && !h.starts_with("/proc")
        })
        .collect();
    homes.sort();
    homes.dedup();
    homes
}

#[cfg(test)]
mod tests {
    #[test]
    fn homes_are_read_from_passwd_lines() {
        let text = "root:x:0:0:root:/root:/bin/bash\nbin:x:2:2:bin:/bin:/usr/sbin/nologin\n\
                    jenkins:x:999:999::/nowhere-srv/jenkins:/bin/sh\nbad line\nn:x:1:1::/nonexistent:/x\n";
        let homes = super::homes_in(text);
        assert_eq!(
            homes,
            ["/nowhere-srv/jenkins", "/root"].map(std::path::PathBuf::from)
        );
    }
}
