//! `substrat-sandbox learn`'s pure half (docs/learn.md): what the observer
//! recorded (`Observations`), the bytes it read from the observed
//! command's memory (`parse`), the secret places never granted
//! (`secret`), observations to binds (`plan`) and the policy's text
//! (`render`). The observer itself, which makes system calls, is the
//! CLI's (`crates/cli/src/learn`).

pub mod parse;
pub mod plan;
pub mod render;
pub mod secret;

#[cfg(test)]
mod attack_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub use parse::Destination;
pub use plan::{EntryKind, Host, LearnedBind, Plan, PlanInput, Refusal, SHARED_TMP, plan};
pub use render::render;

/// How a command used a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccessKind {
    /// Opened for reading.
    Read,
    /// Opened as a directory (to list it or to walk from it).
    List,
    /// Executed.
    Exec,
    /// Opened for writing, created, removed.
    Write,
    /// Looked at without opening (stat, access, readlink).
    Look,
}

impl AccessKind {
    pub fn word(self) -> &'static str {
        match self {
            AccessKind::Read => "read",
            AccessKind::List => "listed",
            AccessKind::Exec => "executed",
            AccessKind::Write => "written",
            AccessKind::Look => "looked up",
        }
    }
}

/// Most distinct paths one learning keeps; past it the run is marked
/// incomplete (a command flooding the observer gets no policy).
pub const MAX_PATHS: usize = 65_536;

/// Most bytes of path names one learning keeps (4,096-byte names would
/// otherwise make the 65,536 paths 256 MiB, and their copies more).
pub const MAX_PATH_BYTES: usize = 8 << 20;

/// Most distinct destinations kept.
pub const MAX_DESTINATIONS: usize = 4_096;

/// What the observer saw the command do, deduplicated and bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    pub paths: BTreeMap<PathBuf, BTreeSet<AccessKind>>,
    pub destinations: BTreeSet<Destination>,
    /// Calls of the command the observer was told of.
    pub calls: u64,
    /// Events not recorded: past a bound, or unreadable (the process gone).
    pub dropped: u64,
    /// A bound was reached: the record is incomplete.
    pub truncated: bool,
    /// Bytes of the path names kept.
    pub path_bytes: usize,
}

impl Observations {
    pub fn record_path(&mut self, path: PathBuf, kind: AccessKind) {
        if let Some(kinds) = self.paths.get_mut(&path) {
            kinds.insert(kind);
        } else if self.paths.len() < MAX_PATHS
            && self.path_bytes + path.as_os_str().len() <= MAX_PATH_BYTES
        {
            self.path_bytes += path.as_os_str().len();
            self.paths.insert(path, BTreeSet::from([kind]));
        } else {
            self.truncated = true;
            self.dropped += 1;
        }
    }

    pub fn record_destination(&mut self, destination: Destination) {
        if self.destinations.len() < MAX_DESTINATIONS || self.destinations.contains(&destination) {
            self.destinations.insert(destination);
        } else {
            self.truncated = true;
            self.dropped += 1;
        }
    }

    /// Adds another run's observations.
    pub fn merge(&mut self, other: Observations) {
        for (path, kinds) in other.paths {
            for kind in kinds {
                self.record_path(path.clone(), kind);
            }
        }
        for d in other.destinations {
            self.record_destination(d);
        }
        self.calls += other.calls;
        self.dropped += other.dropped;
        self.truncated |= other.truncated;
    }
}
