//! Whose host ids a sandbox runs as. Launched by an unprivileged user, the
//! sandbox is that user (root inside maps to it). Launched by root it is
//! never root: each running sandbox gets a uid and a gid of its own from
//! root's subordinate ranges (/etc/subuid, /etc/subgid), so a kernel bug in
//! an allowed system call gives an attacker an id that owns nothing on the
//! host's own mounts, not root. The binds are shown to it through idmapped
//! mounts (`stage`), where root's files are its own (read-only binds with
//! their flags locked), so the workspace stays its owner's.

use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use substrat_policy::subid::{RootSubordinates, SUBGID_FILE, SUBUID_FILE};

/// Where the claims of subordinate ids are kept (a lock file per uid),
/// outside every sandbox's view.
pub const CLAIM_DIR: &str = "/run/substrat/ids";

/// The ids a launch runs its sandbox as.
#[derive(Debug, Default)]
pub enum HostIds {
    /// The launcher's own (it is not root): nothing to change.
    #[default]
    Launcher,
    /// Claimed from root's subordinate ranges for this launch.
    Subordinate(SubordinateIds),
}

impl HostIds {
    /// The subordinate ids, when the sandbox runs as them.
    pub fn subordinate(&self) -> Option<&SubordinateIds> {
        match self {
            HostIds::Launcher => None,
            HostIds::Subordinate(ids) => Some(ids),
        }
    }
}

/// A uid and gid this launch holds until it ends: a lock on a file per
/// id, which the native holder and init inherit, and bwrap's processes
/// (its helper closes it before the command starts), so a killed
/// launcher's ids stay claimed until its sandbox is gone.
#[derive(Debug)]
pub struct SubordinateIds {
    pub uid: u32,
    pub gid: u32,
    /// The lock on the slot's claim file (named by the uid).
    claim: Flock<File>,
}

impl SubordinateIds {
    /// Makes the calling process these ids and nothing else: no
    /// supplementary groups, real, effective and saved ids changed, and
    /// checked that no capability is left (a securebit inherited from the
    /// launcher's parent could keep them). The process stays dumpable, so
    /// that it can still write its own user namespace's maps.
    pub(crate) fn become_them(&self) -> nix::Result<()> {
        use nix::unistd::{Gid, Uid};
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        nix::unistd::setgroups(&[])?;
        nix::unistd::setresgid(gid, gid, gid)?;
        nix::unistd::setresuid(uid, uid, uid)?;
        let none_left = [caps::CapSet::Permitted, caps::CapSet::Effective]
            .into_iter()
            .all(|set| caps::read(None, set).is_ok_and(|held| held.is_empty()));
        if !none_left {
            return Err(nix::errno::Errno::EPERM);
        }
        nix::sys::prctl::set_dumpable(true)
    }

    /// The claim's descriptor, for a process that must hold the claim as
    /// long as it lives (bwrap's pid 1, through `--sync-fd`).
    pub(crate) fn claim_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.claim.as_fd()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostIdError {
    #[error(
        "launched as root, the sandbox would run as host root: root has no subordinate \
         {which} range in {file} to run it as instead. Add one that no other account has (e.g. \
         `usermod --add-subuids 1000000-1065535 --add-subgids 1000000-1065535 root`), or launch \
         as an unprivileged user"
    )]
    NoRange {
        which: &'static str,
        file: &'static str,
    },
    #[error("cannot read root's subordinate ranges or this process's id maps: {0}")]
    Read(std::io::Error),
    #[error(
        "launched as root in a user namespace that maps root to host root, the sandbox would \
         run as host root; root's subordinate ids ({uid}, gid {gid}) are not mapped in this \
         namespace to run it as instead. Map them, or launch as an unprivileged user"
    )]
    NotMapped { uid: u32, gid: u32 },
    #[error("all {slots} subordinate ids of root are in use by running sandboxes")]
    AllInUse { slots: u64 },
    #[error("cannot claim a subordinate id in {}: {reason}", dir.display())]
    Claim {
        dir: PathBuf,
        reason: std::io::Error,
    },
}

/// The ids a launch by the current user runs as: a fresh claim when the
/// launcher is host root, else its own. Root of a user namespace that maps
/// it to another user (a rootless container) is that user on the host.
pub fn for_this_launch() -> Result<HostIds, HostIdError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(HostIds::Launcher);
    }
    let uid_map = fs::read_to_string("/proc/self/uid_map").map_err(HostIdError::Read)?;
    match outside_id(&uid_map, 0) {
        Some(0) => {}
        Some(_) => return Ok(HostIds::Launcher),
        // Our own uid always maps; a map that does not say so is not
        // taken for "not root".
        None => {
            return Err(HostIdError::Read(std::io::Error::other(
                "/proc/self/uid_map does not map this process's uid 0",
            )));
        }
    }
    let gid_map = fs::read_to_string("/proc/self/gid_map").map_err(HostIdError::Read)?;
    let ranges = RootSubordinates::read().map_err(HostIdError::Read)?;
    let ids = claim(&ranges, Path::new(CLAIM_DIR), u64::from(std::process::id()))?;
    // In a user namespace (root mapped to root), the ids must be mapped there too.
    if outside_id(&uid_map, ids.uid).is_none() || outside_id(&gid_map, ids.gid).is_none() {
        return Err(HostIdError::NotMapped {
            uid: ids.uid,
            gid: ids.gid,
        });
    }
    Ok(HostIds::Subordinate(ids))
}

/// What `id` of this user namespace is in its parent, by the text of a
/// /proc/PID/uid_map or gid_map (lines of inside, outside, count).
pub fn outside_id(map: &str, id: u32) -> Option<u32> {
    map.lines().find_map(|line| {
        let mut fields = line.split_whitespace().map(str::parse::<u32>);
        let (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        let offset = id.checked_sub(inside).filter(|&offset| offset < count)?;
        outside.checked_add(offset)
    })
}

/// Claims the first free slot at or after `hint` (wrapping): slot n is the
/// nth subordinate uid with the nth gid, skipped when either is 0 or
/// another's (`RootSubordinates::usable`). Starting from a hint (the pid)
/// rather than 0 keeps an id just released by a killed launcher, whose
/// sandbox may take a moment to end, from being the next one handed out.
/// Each id is in one slot only (the ranges are merged as they are read),
/// so the slot's lock, on a file named by its uid, holds its gid too.
pub fn claim(
    ranges: &RootSubordinates,
    dir: &Path,
    hint: u64,
) -> Result<SubordinateIds, HostIdError> {
    for (which, file, empty) in [
        ("uid", SUBUID_FILE, ranges.uids.is_empty()),
        ("gid", SUBGID_FILE, ranges.gids.is_empty()),
    ] {
        if empty {
            return Err(HostIdError::NoRange { which, file });
        }
    }
    let claim_error = |reason| HostIdError::Claim {
        dir: dir.to_path_buf(),
        reason,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(claim_error)?;
    let slots = ranges.slots();
    for step in 0..slots {
        let slot = (hint + step) % slots;
        let (Some(uid), Some(gid)) = (ranges.uids.nth(slot), ranges.gids.nth(slot)) else {
            continue;
        };
        if !ranges.usable(uid, gid) {
            continue;
        }
        let Some(claim) = try_lock(&dir.join(format!("uid-{uid}"))).map_err(claim_error)? else {
            continue;
        };
        return Ok(SubordinateIds { uid, gid, claim });
    }
    Err(HostIdError::AllInUse { slots })
}

/// An exclusive lock on `file` (made if absent), or `None` when another
/// launch holds it.
fn try_lock(file: &Path) -> std::io::Result<Option<Flock<File>>> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(errno.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_policy::subid::IdRanges;

    fn ranges(uids: &str, gids: &str) -> RootSubordinates {
        RootSubordinates {
            uids: IdRanges::parse(uids, "root", 0),
            gids: IdRanges::parse(gids, "root", 0),
            ..RootSubordinates::default()
        }
    }

    #[test]
    fn ids_that_are_root_or_anothers_are_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        // 0 and 1000 (an account's uid) are in root's uid ranges.
        let mut subs = ranges("root:0:3\nroot:1000:2\n", "root:500:5\n");
        subs.taken_uids = IdRanges::parse_accounts("alice:x:1000:1000::/:/bin/sh\n");
        let claims: Vec<_> = (0..3)
            .map(|_| claim(&subs, dir.path(), 0).unwrap())
            .collect();
        let ids: Vec<_> = claims.iter().map(|c| (c.uid, c.gid)).collect();
        assert_eq!(ids, [(1, 501), (2, 502), (1001, 504)]);
        assert!(matches!(
            claim(&subs, dir.path(), 0),
            Err(HostIdError::AllInUse { slots: 5 })
        ));
    }

    #[test]
    fn overlapping_gid_ranges_never_give_two_sandboxes_one_gid() {
        let dir = tempfile::tempdir().unwrap();
        // Two lines of one range: two slots, not four.
        let subs = ranges("root:1:4\n", "root:500:2\nroot:500:2\n");
        let first = claim(&subs, dir.path(), 0).unwrap();
        let second = claim(&subs, dir.path(), 0).unwrap();
        assert_eq!([first.gid, second.gid], [500, 501]);
        assert!(matches!(
            claim(&subs, dir.path(), 0),
            Err(HostIdError::AllInUse { slots: 2 })
        ));
    }

    #[test]
    fn each_claim_gets_its_own_ids_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let claims = dir.path().join("ids");
        let subs = ranges("root:1000:3\n", "root:2000:2\n");
        let first = claim(&subs, &claims, 1).unwrap();
        assert_eq!((first.uid, first.gid), (1001, 2001));
        // Two slots (the smaller range): the next is slot 0, then none.
        let second = claim(&subs, &claims, 1).unwrap();
        assert_eq!((second.uid, second.gid), (1000, 2000));
        assert!(matches!(
            claim(&subs, &claims, 1),
            Err(HostIdError::AllInUse { slots: 2 })
        ));
        drop(first);
        assert_eq!(claim(&subs, &claims, 0).unwrap().uid, 1001);
    }

    #[test]
    fn outside_ids_by_the_maps() {
        let initial = "         0          0 4294967295\n";
        assert_eq!(outside_id(initial, 0), Some(0));
        assert_eq!(outside_id(initial, 100_000), Some(100_000));
        let rootless = "0 1000 1\n1 100000 65536\n";
        assert_eq!(outside_id(rootless, 0), Some(1000));
        assert_eq!(outside_id(rootless, 1), Some(100_000));
        assert_eq!(outside_id(rootless, 65536), Some(165_535));
        assert_eq!(outside_id(rootless, 65537), None);
        assert_eq!(outside_id("0 0 1\n", 100_000), None);
        assert_eq!(
            outside_id("garbage\n4294967295 4294967295 1\n", u32::MAX),
            Some(u32::MAX)
        );
    }

    #[test]
    fn no_range_names_the_file_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let err = claim(&ranges("", "root:1:1\n"), dir.path(), 0).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/etc/subuid") && text.contains("usermod"),
            "{text}"
        );
        let err = claim(&ranges("root:1:1\n", ""), dir.path(), 0).unwrap_err();
        assert!(err.to_string().contains("/etc/subgid"));
    }
}
