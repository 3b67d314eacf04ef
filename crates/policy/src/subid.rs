//! Subordinate id ranges (`/etc/subuid`, `/etc/subgid`, see subuid(5)):
//! the host ids an administrator set aside for a user's namespaces. A
//! sandbox launched by root runs as one id from root's ranges, never as
//! root (the launcher claims it; the broker accepts it as root's agent).

use std::path::Path;

/// The files and the account whose ranges are read.
pub const SUBUID_FILE: &str = "/etc/subuid";
pub const SUBGID_FILE: &str = "/etc/subgid";

/// `count` ids from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub start: u32,
    pub count: u32,
}

impl IdRange {
    pub fn contains(&self, id: u32) -> bool {
        id >= self.start && id - self.start < self.count
    }
}

/// The ranges of one account, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdRanges(pub Vec<IdRange>);

impl IdRanges {
    /// The ranges of the account named `name` or numbered `id` in the text
    /// of a subuid/subgid file, in order and merged where they overlap or
    /// touch (so each id appears once). Lines that do not parse, empty
    /// ranges and ranges that would run past the last id are ignored, as
    /// shadow's own tools ignore them.
    pub fn parse(text: &str, name: &str, id: u32) -> IdRanges {
        let id = id.to_string();
        IdRanges::of_owners(text, |owner| owner == name || owner == id)
    }

    /// The ranges of every other account in the same text.
    pub fn parse_others(text: &str, name: &str, id: u32) -> IdRanges {
        let id = id.to_string();
        IdRanges::of_owners(text, |owner| owner != name && owner != id)
    }

    /// The valid ranges of the lines whose owner `wanted` accepts, merged.
    fn of_owners(text: &str, wanted: impl Fn(&str) -> bool) -> IdRanges {
        let ranges: Vec<IdRange> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.trim().split(':');
                let owner = fields.next()?;
                let start: u32 = fields.next()?.parse().ok()?;
                let count: u32 = fields.next()?.parse().ok()?;
                let fits = count > 0 && start.checked_add(count - 1).is_some();
                (fields.next().is_none() && !owner.is_empty() && wanted(owner) && fits)
                    .then_some(IdRange { start, count })
            })
            .collect();
        IdRanges(merged(ranges))
    }

    /// The ids of the accounts in an /etc/passwd or /etc/group text (the
    /// third field), each as a range of one.
    pub fn parse_accounts(text: &str) -> IdRanges {
        let ranges = text
            .lines()
            .filter_map(|line| line.split(':').nth(2)?.parse().ok())
            .map(|start| IdRange { start, count: 1 })
            .collect();
        IdRanges(ranges)
    }

    /// Reads `file`; a missing file is no ranges.
    pub fn read(file: &Path, name: &str, id: u32) -> std::io::Result<IdRanges> {
        match std::fs::read_to_string(file) {
            Ok(text) => Ok(IdRanges::parse(&text, name, id)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(IdRanges::default()),
            Err(e) => Err(e),
        }
    }

    /// How many ids the ranges hold together.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|r| u64::from(r.count)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `n`th id across the ranges, in order.
    pub fn nth(&self, mut n: u64) -> Option<u32> {
        for range in &self.0 {
            if n < u64::from(range.count) {
                return Some(range.start + n as u32);
            }
            n -= u64::from(range.count);
        }
        None
    }

    pub fn contains(&self, id: u32) -> bool {
        self.0.iter().any(|r| r.contains(id))
    }
}

/// `ranges` sorted, overlapping or adjacent ones joined.
fn merged(mut ranges: Vec<IdRange>) -> Vec<IdRange> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<IdRange> = Vec::new();
    for range in ranges {
        let end = u64::from(range.start) + u64::from(range.count);
        match out.last_mut() {
            Some(last)
                if u64::from(range.start) <= u64::from(last.start) + u64::from(last.count) =>
            {
                let last_end = u64::from(last.start) + u64::from(last.count);
                let joined = last_end.max(end) - u64::from(last.start);
                last.count = u32::try_from(joined).unwrap_or(u32::MAX);
            }
            _ => out.push(range),
        }
    }
    out
}

/// Root's subordinate uids and gids, as read from the host's files, and
/// the ids that are another's: other accounts' subordinate ranges, and
/// the accounts and groups themselves. A sandbox never runs as one of
/// those, nor as 0, even where root's ranges overlap them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootSubordinates {
    pub uids: IdRanges,
    pub gids: IdRanges,
    pub taken_uids: IdRanges,
    pub taken_gids: IdRanges,
}

impl RootSubordinates {
    pub fn read() -> std::io::Result<RootSubordinates> {
        let text = |file: &str| match std::fs::read_to_string(file) {
            Ok(text) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(e),
        };
        let (subuid, subgid) = (text(SUBUID_FILE)?, text(SUBGID_FILE)?);
        let mut taken_uids = IdRanges::parse_others(&subuid, "root", 0);
        taken_uids
            .0
            .extend(IdRanges::parse_accounts(&text("/etc/passwd")?).0);
        let mut taken_gids = IdRanges::parse_others(&subgid, "root", 0);
        taken_gids
            .0
            .extend(IdRanges::parse_accounts(&text("/etc/group")?).0);
        Ok(RootSubordinates {
            uids: IdRanges::parse(&subuid, "root", 0),
            gids: IdRanges::parse(&subgid, "root", 0),
            taken_uids,
            taken_gids,
        })
    }

    /// Whether a sandbox may run as `uid` and `gid`.
    pub fn usable(&self, uid: u32, gid: u32) -> bool {
        uid != 0 && gid != 0 && !self.taken_uids.contains(uid) && !self.taken_gids.contains(gid)
    }

    /// How many sandboxes can run at once, each with a uid and a gid of its own.
    pub fn slots(&self) -> u64 {
        self.uids.len().min(self.gids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_of_one_account_by_name_or_number() {
        let text = "alice:100000:65536\nroot:200000:10\n# comment\n0:300000:5\n\
                    root:bad:1\nroot:1:0\nroot:4294967295:2\nroot:5:1:extra\n";
        let root = IdRanges::parse(text, "root", 0);
        assert_eq!(
            root,
            IdRanges(vec![
                IdRange {
                    start: 200000,
                    count: 10
                },
                IdRange {
                    start: 300000,
                    count: 5
                },
            ])
        );
        assert_eq!(root.len(), 15);
        assert_eq!(root.nth(0), Some(200000));
        assert_eq!(root.nth(9), Some(200009));
        assert_eq!(root.nth(10), Some(300000));
        assert_eq!(root.nth(15), None);
        assert!(root.contains(300004) && !root.contains(300005) && !root.contains(100000));
        assert!(IdRanges::parse(text, "bob", 1000).is_empty());
    }

    #[test]
    fn ids_of_others_are_taken() {
        let subuid = "root:100000:10\nalice:100005:10\n1000:200000:5\n";
        let others = IdRanges::parse_others(subuid, "root", 0);
        assert!(others.contains(100005) && others.contains(200004));
        assert!(!others.contains(100004) && !others.contains(200005));
        let passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbad\n";
        let accounts = IdRanges::parse_accounts(passwd);
        assert!(accounts.contains(0) && accounts.contains(1000) && !accounts.contains(1));
        let subs = RootSubordinates {
            uids: IdRanges::parse(subuid, "root", 0),
            gids: IdRanges::parse(subuid, "root", 0),
            taken_uids: others.clone(),
            taken_gids: IdRanges::default(),
        };
        assert!(subs.usable(100004, 100004));
        assert!(!subs.usable(100005, 100004) && !subs.usable(0, 5) && !subs.usable(5, 0));
    }

    #[test]
    fn overlapping_ranges_are_merged_so_each_id_is_one_slot() {
        let text = "root:500:2\nroot:100:10\nroot:500:5\nroot:110:3\n";
        let ranges = IdRanges::parse(text, "root", 0);
        assert_eq!(
            ranges,
            IdRanges(vec![
                IdRange {
                    start: 100,
                    count: 13
                },
                IdRange {
                    start: 500,
                    count: 5
                },
            ])
        );
    }

    #[test]
    fn the_last_id_fits_and_one_past_does_not() {
        let fits = IdRanges::parse("root:4294967294:2\n", "root", 0);
        assert_eq!(fits.nth(1), Some(u32::MAX));
        assert!(IdRanges::parse("root:4294967295:2\n", "root", 0).is_empty());
    }
}
