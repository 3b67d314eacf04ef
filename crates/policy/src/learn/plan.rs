//! Observations to a policy: a pure function of what the command used,
//! what the base already gives, and what exists on the host (asked through
//! [`Host`], so tests give a made-up host). Each path the base does not
//! give becomes a bind of the least that covers it, collapsed to its
//! directory when several of a directory's entries were used (never a
//! directory that holds a secret place, a home, or a top directory); a
//! path in a secret place is refused and said, never bound.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::secret::{
    all_homes, holds_secret, home_allowed, home_holding, never_written, secret_of, startup_file,
};
use super::{AccessKind, Observations};

/// How many used entries of one directory make it a bind of its own.
pub const COLLAPSE_AT: usize = 3;

/// Directories whose entries belong together (a toolchain, a cache, a
/// package): a path below one binds the whole of it. `~` is the home.
const ROOTS: [&str; 11] = [
    "~/.cargo/registry",
    "~/.cargo/git",
    "~/.cargo/bin",
    "~/.rustup/toolchains/*",
    "~/.npm/_cacache",
    "~/.cache/*",
    "~/.local/lib/*",
    "~/.nvm/versions/node/*",
    "/opt/*",
    "/usr/local/lib/*",
    "/var/cache/*",
];

/// What a path is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
}

/// The host as the plan sees it.
pub trait Host {
    /// What `path` is (following links), or none when absent.
    fn kind(&self, path: &Path) -> Option<EntryKind>;
    /// `path` with its links resolved (as far as it exists).
    fn resolve(&self, path: &Path) -> PathBuf;
    /// Whether the directory `dir` holds a Unix socket (a bounded scan;
    /// a scan cut short counts as holding one).
    fn holds_socket(&self, _dir: &Path) -> bool {
        false
    }
    /// Whether `dir` holds, a few levels down, an entry named as a
    /// credential store (`.ssh`, `.aws`...; a bounded scan, cut short
    /// counts as holding one).
    fn holds_credential_name(&self, _dir: &Path) -> bool {
        false
    }
    /// Whether `path` lies in a world-writable sticky directory, where
    /// another account can swap what it names (default: by name).
    fn in_shared_tmp(&self, path: &Path) -> bool {
        SHARED_TMP.iter().any(|d| path.starts_with(d))
    }
}

/// World-writable sticky directories of every host.
pub const SHARED_TMP: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"];

const WRITE_RUNS_LATER: &str =
    "a shell startup file or tool configuration (what is written there runs later)";

/// Runtime directories: every service's sockets live below them.
const RUNTIME_DIRS: [&str; 2] = ["/run", "/var/run"];

/// What the plan is made for.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The base policy's `extends` value (`worker`, or a file's path).
    pub base: String,
    /// The command, for the policy's comments.
    pub command: Vec<String>,
    /// The learner's home.
    pub home: Option<PathBuf>,
    /// Paths the base sandbox already has (bind targets, tmpfs, the
    /// workspace, /proc, /dev, /sys): nothing under them is added.
    pub covered: Vec<PathBuf>,
}

/// One bind the learned policy adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedBind {
    pub source: PathBuf,
    pub writable: bool,
    pub kinds: BTreeSet<AccessKind>,
    /// The used paths it covers (the first, in order, is the example).
    pub paths: BTreeSet<PathBuf>,
}

/// A path the command wanted and the policy does not give, with why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refusal {
    pub path: PathBuf,
    pub why: String,
}

/// The learned policy, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub binds: Vec<LearnedBind>,
    pub refused: Vec<Refusal>,
}

/// Whether the base already gives `path`. The home inside is the
/// sandbox's own (empty but for binds into it), so a mount above it (a
/// tmpfs /tmp holding a home there) does not give what lies in it.
fn covered(path: &Path, input: &PlanInput) -> bool {
    let home = input.home.as_deref();
    input.covered.iter().any(|c| {
        path.starts_with(c) && !home.is_some_and(|h| path.starts_with(h) && !c.starts_with(h))
    })
}

/// A name the policy language can hold as written: UTF-8, nothing a
/// person would misread, no `${` (a variable there).
fn representable(path: &Path) -> bool {
    let Some(text) = path.to_str() else {
        return false;
    };
    !text.contains("${") && crate::text::escape_text(text) == text
}

/// Where a write to an existing file may be granted (that one file, rw):
/// below the learner's own home, in a known-safe place, never where what
/// is written runs later. Elsewhere (outside the workspace, which the
/// base gives) a write is wanted, not granted.
fn writable_place(path: &Path, home: Option<&Path>) -> bool {
    home.is_some_and(|h| path.starts_with(h) && path != h && home_allowed(path, h))
        && !never_written(path, home)
}

/// The root of `ROOTS` holding `path`, when it exists on the host.
fn root_of(path: &Path, input: &PlanInput, host: &dyn Host) -> Option<PathBuf> {
    ROOTS.iter().find_map(|root| {
        let root = match root.strip_prefix("~/") {
            Some(rest) => input.home.as_ref()?.join(rest),
            None => PathBuf::from(root),
        };
        let depth = root.components().count();
        let candidate: PathBuf = path.components().take(depth).collect();
        let matches = candidate.components().count() == depth
            && candidate
                .components()
                .zip(root.components())
                .all(|(c, r)| r.as_os_str() == "*" || c == r);
        (matches
            && candidate != path
            && host.kind(&candidate) == Some(EntryKind::Dir)
            && !whole_dir_refused(&candidate, input, host))
        .then_some(candidate)
    })
}

/// Why binding `dir` whole is refused: it would give a secret place, a
/// home, a runtime directory or sockets, or what a home holds beyond its
/// known-safe places.
fn dir_refusal(dir: &Path, input: &PlanInput, host: &dyn Host) -> Option<&'static str> {
    let home = input.home.as_deref();
    if holds_secret(dir, home)
        || all_homes(home).iter().any(|h| h.starts_with(dir))
        || host.holds_credential_name(dir)
    {
        return Some(
            "a directory holding secret places or homes (only its entries can be granted)",
        );
    }
    if RUNTIME_DIRS.iter().any(|d| dir.starts_with(d)) || host.holds_socket(dir) {
        return Some(
            "a directory of service sockets (read-only does not stop a connect; only files can be granted)",
        );
    }
    if let Some(h) = home_holding(dir, home)
        && !home_allowed(dir, &h)
    {
        return Some("a place in a home that is not known-safe configuration or a toolchain");
    }
    None
}

fn whole_dir_refused(dir: &Path, input: &PlanInput, host: &dyn Host) -> bool {
    dir_refusal(dir, input, host).is_some()
}

/// Whether `dir` may become one bind for several entries.
fn collapsible(dir: &Path, input: &PlanInput, host: &dyn Host) -> bool {
    let home = input.home.as_deref();
    dir.components().count() >= 3
        && host.kind(dir) == Some(EntryKind::Dir)
        && secret_of(dir, home).is_none()
        && !host.in_shared_tmp(dir)
        && !whole_dir_refused(dir, input, host)
}

/// Binds and refusals for what was observed.
pub fn plan(observed: &Observations, input: &PlanInput, host: &dyn Host) -> Plan {
    let mut refused = BTreeSet::new();
    let mut wants: BTreeMap<PathBuf, LearnedBind> = BTreeMap::new();
    for (path, kinds) in &observed.paths {
        match decide(path, kinds, input, host) {
            Decision::Nothing => {}
            Decision::Refuse(why) => {
                refused.insert(Refusal {
                    path: path.clone(),
                    why: why.to_string(),
                });
            }
            Decision::Bind {
                source,
                writable,
                refused_write,
            } => {
                if let Some(why) = refused_write {
                    refused.insert(Refusal {
                        path: path.clone(),
                        why: why.to_string(),
                    });
                }
                // A written file stays a bind of its own; only what is
                // read widens to its root (read-only).
                let source = match writable {
                    true => source,
                    false => root_of(&source, input, host).unwrap_or(source),
                };
                add(&mut wants, source, writable, kinds, path);
            }
        }
    }
    collapse(&mut wants, input, host);
    Plan {
        binds: wants.into_values().collect(),
        refused: refused.into_iter().collect(),
    }
}

/// What one used path asks of the policy.
enum Decision {
    Nothing,
    Refuse(String),
    /// A bind of `source`; a write wanted and not granted said beside it.
    Bind {
        source: PathBuf,
        writable: bool,
        refused_write: Option<&'static str>,
    },
}

fn decide(
    path: &Path,
    kinds: &BTreeSet<AccessKind>,
    input: &PlanInput,
    host: &dyn Host,
) -> Decision {
    let home = input.home.as_deref();
    // Said even when the base gives the place: what was wanted there.
    if let Some(why) = secret_of(path, home).or_else(|| secret_of(&host.resolve(path), home)) {
        return Decision::Refuse(why);
    }
    let look_only = kinds.iter().all(|k| *k == AccessKind::Look);
    // A directory above a mount inside exists there: looking it up works.
    if look_only && input.covered.iter().any(|c| c.starts_with(path)) {
        return Decision::Nothing;
    }
    // A link the base gives may lead where it does not (a link in the
    // workspace to /opt/x): then what it leads to is wanted.
    let path = if covered(path, input) {
        let target = host.resolve(path);
        if target == path || covered(&target, input) || host.kind(&target).is_none() {
            return Decision::Nothing;
        }
        target
    } else {
        path.to_path_buf()
    };
    let path = path.as_path();
    let kind = host.kind(path);
    // A write to a directory is no write (open(O_WRONLY) of one fails
    // with EISDIR): the claim is dropped, never a writable directory.
    let write = kinds.contains(&AccessKind::Write) && kind != Some(EntryKind::Dir);
    if kind == Some(EntryKind::Dir) && kinds.iter().all(|k| *k == AccessKind::Write) {
        return Decision::Nothing;
    }
    let source = match kind {
        Some(_) => path.to_path_buf(),
        // The sandbox's home is private and writable: a new file there
        // needs nothing from the host.
        None if write && home.is_some_and(|h| path.starts_with(h)) => return Decision::Nothing,
        // A new file elsewhere would need its directory writable: never.
        None if write => {
            return Decision::Refuse(
                "a new file outside the workspace and the home (a directory is never made writable)"
                    .into(),
            );
        }
        None => return Decision::Nothing, // nothing on the host to give
    };
    if covered(&source, input) {
        return Decision::Nothing;
    }
    if let Some(decision) = source_refused(&source, kind, look_only, write, input, host) {
        return decision;
    }
    let writable = write && writable_place(&source, home);
    let refused_write = (write && !writable).then(|| {
        if startup_file(&source, home) || never_written(&source, home) {
            WRITE_RUNS_LATER
        } else {
            "a write outside the workspace and the known-safe places of the home"
        }
    });
    if let Some(why) = refused_write
        && kinds.iter().all(|k| *k == AccessKind::Write)
    {
        return Decision::Refuse(why.to_string());
    }
    Decision::Bind {
        source,
        writable,
        refused_write,
    }
}

/// What refuses a source outright (a name the policy cannot hold, a
/// shared temporary directory, a directory bound whole that holds too
/// much, a home's place beyond its known-safe ones); none when it may be
/// bound. A refused place only looked up needs nothing.
fn source_refused(
    source: &Path,
    kind: Option<EntryKind>,
    look_only: bool,
    write: bool,
    input: &PlanInput,
    host: &dyn Host,
) -> Option<Decision> {
    let home = input.home.as_deref();
    if !representable(source) {
        return Some(Decision::Refuse(
            "a name a policy cannot hold as written (control characters, `${`, not UTF-8)".into(),
        ));
    }
    if host.in_shared_tmp(source) || host.in_shared_tmp(&host.resolve(source)) {
        return Some(Decision::Refuse(
            "in a world-writable sticky directory (/tmp, /var/tmp, /dev/shm): another account can swap it"
                .into(),
        ));
    }
    // A directory is bound whole: never one that holds secret places,
    // homes or sockets (`ls /etc`, `ls ~`, `ls /run/systemd`).
    if kind == Some(EntryKind::Dir)
        && let Some(why) = dir_refusal(source, input, host)
    {
        if look_only {
            return Some(Decision::Nothing); // only its existence was asked
        }
        return Some(Decision::Refuse(why.into()));
    }
    if let Some(h) = home_holding(source, home)
        && !home_allowed(source, &h)
    {
        if look_only {
            return Some(Decision::Nothing);
        }
        if write && never_written(source, home) {
            return Some(Decision::Refuse(WRITE_RUNS_LATER.into()));
        }
        return Some(Decision::Refuse(
            "a file in a home that is not known-safe configuration or a toolchain".into(),
        ));
    }
    None
}

fn add(
    wants: &mut BTreeMap<PathBuf, LearnedBind>,
    source: PathBuf,
    writable: bool,
    kinds: &BTreeSet<AccessKind>,
    path: &Path,
) {
    let entry = wants.entry(source.clone()).or_insert_with(|| LearnedBind {
        source,
        writable: false,
        kinds: BTreeSet::new(),
        paths: BTreeSet::new(),
    });
    entry.writable |= writable;
    entry.kinds.extend(kinds.iter().copied());
    entry.paths.insert(path.to_path_buf());
}

/// Merges read-only binds below another read-only bind into it, and
/// directories with `COLLAPSE_AT` or more read-only bound entries into
/// one read-only bind, until nothing moves. A written file is never
/// widened: it stays a bind of its own (mounted after the directory
/// holding it, whose bind sorts first).
fn collapse(wants: &mut BTreeMap<PathBuf, LearnedBind>, input: &PlanInput, host: &dyn Host) {
    loop {
        let sources: Vec<PathBuf> = wants
            .values()
            .filter(|b| !b.writable)
            .map(|b| b.source.clone())
            .collect();
        let mut parents: BTreeMap<PathBuf, usize> = BTreeMap::new();
        for s in &sources {
            if let Some(p) = s.parent() {
                *parents.entry(p.to_path_buf()).or_default() += 1;
            }
        }
        let target = parents
            .into_iter()
            .find(|(dir, n)| *n >= COLLAPSE_AT && collapsible(dir, input, host))
            .map(|(dir, _)| dir);
        // A bind below another: found through its ancestors (a lookup
        // each), not by comparing every pair.
        let inner = || {
            sources.iter().find_map(|s| {
                s.ancestors()
                    .skip(1)
                    .find(|a| wants.get(*a).is_some_and(|b| !b.writable))
                    .map(Path::to_path_buf)
            })
        };
        let Some(dir) = target.or_else(inner) else {
            return;
        };
        let moved: Vec<PathBuf> = sources
            .into_iter()
            .filter(|s| s.starts_with(&dir) && *s != dir)
            .collect();
        for source in moved {
            if let Some(bind) = wants.remove(&source) {
                for path in &bind.paths {
                    add(wants, dir.clone(), false, &bind.kinds, path);
                }
            }
        }
        wants.entry(dir.clone()).or_insert_with(|| LearnedBind {
            source: dir,
            writable: false,
            kinds: BTreeSet::new(),
            paths: BTreeSet::new(),
        });
    }
}
