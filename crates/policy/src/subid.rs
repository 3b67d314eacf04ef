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
    /// of a subuid/subgid file. Lines that do not parse, empty ranges and
    /// ranges that would run past the last id are ignored, as shadow's own
    /// tools ignore them.
    pub fn parse(text: &str, name: &str, id: u32) -> IdRanges {
        let id = id.to_string();
        let ranges = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.trim().split(':');
                let owner = fields.next()?;
                let start: u32 = fields.next()?.parse().ok()?;
                let count: u32 = fields.next()?.parse().ok()?;
                let fits = count > 0 && start.checked_add(count - 1).is_some();
                (fields.next().is_none() && (owner == name || owner == id) && fits)
                    .then_some(IdRange { start, count })
            })
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

/// Root's subordinate uids and gids, as read from the host's files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootSubordinates {
    pub uids: IdRanges,
    pub gids: IdRanges,
}

impl RootSubordinates {
    pub fn read() -> std::io::Result<RootSubordinates> {
        Ok(RootSubordinates {
            uids: IdRanges::read(Path::new(SUBUID_FILE), "root", 0)?,
            gids: IdRanges::read(Path::new(SUBGID_FILE), "root", 0)?,
        })
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
    fn the_last_id_fits_and_one_past_does_not() {
        let fits = IdRanges::parse("root:4294967294:2\n", "root", 0);
        assert_eq!(fits.nth(1), Some(u32::MAX));
        assert!(IdRanges::parse("root:4294967295:2\n", "root", 0).is_empty());
    }
}
