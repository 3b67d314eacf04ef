//! Observations to a policy: a pure function of what the command used,
//! what the base already gives, and what exists on the host (asked through
//! [`Host`], so tests give a made-up host). Each path the base does not
//! give becomes a bind of the least that covers it, collapsed to its
//! directory when several of a directory's entries were used (never a
//! directory that holds a secret place, a home, or a top directory); a
//! path in a secret place is refused and said, never bound.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::secret::{holds_secret, secret_of, startup_file};
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
}

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

/// Where a write may be granted: below the home (not a startup file) or
/// /var/tmp. Elsewhere a write is wanted, not granted.
fn writable_place(path: &Path, home: Option<&Path>) -> bool {
    let in_home = home.is_some_and(|h| path.starts_with(h) && path != h);
    (in_home || path.starts_with("/var/tmp")) && !startup_file(path, home)
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
        (matches && candidate != path && host.kind(&candidate) == Some(EntryKind::Dir))
            .then_some(candidate)
    })
}

/// Whether binding `dir` whole would give a secret place or a home.
fn whole_dir_refused(dir: &Path, home: Option<&Path>) -> bool {
    holds_secret(dir, home) || home.is_some_and(|h| h.starts_with(dir))
}

/// Whether `dir` may become one bind for several entries.
fn collapsible(dir: &Path, input: &PlanInput, host: &dyn Host) -> bool {
    let home = input.home.as_deref();
    dir.components().count() >= 3
        && home.is_none_or(|h| !h.starts_with(dir))
        && !holds_secret(dir, home)
        && host.kind(dir) == Some(EntryKind::Dir)
        && secret_of(dir, home).is_none()
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
                let source = root_of(&source, input, host).unwrap_or(source);
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
    let write = kinds.contains(&AccessKind::Write);
    let source = match host.kind(path) {
        Some(_) => path.to_path_buf(),
        // The sandbox's home is private and writable: a new file there
        // needs nothing from the host.
        None if write && home.is_some_and(|h| path.starts_with(h)) => return Decision::Nothing,
        None if write => match path.parent() {
            Some(parent) if host.kind(parent) == Some(EntryKind::Dir) => parent.to_path_buf(),
            _ => return Decision::Nothing,
        },
        None => return Decision::Nothing, // nothing on the host to give
    };
    if covered(&source, input) {
        return Decision::Nothing;
    }
    if !representable(&source) {
        return Decision::Refuse(
            "a name a policy cannot hold as written (control characters, `${`, not UTF-8)".into(),
        );
    }
    let writable = write && writable_place(&source, home);
    let refused_write = (write && !writable).then(|| {
        if startup_file(&source, home) || startup_file(path, home) {
            "a shell startup file (what is written there runs in the user's next shell)"
        } else {
            "a write outside the workspace, /tmp, /var/tmp and the home"
        }
    });
    if let Some(why) = refused_write
        && kinds.iter().all(|k| *k == AccessKind::Write)
    {
        return Decision::Refuse(why.to_string());
    }
    // A directory is bound whole: never one that holds secret places or
    // homes (`ls /etc`, `ls ~` would give /etc/shadow, ~/.ssh).
    if host.kind(&source) == Some(EntryKind::Dir) && whole_dir_refused(&source, home) {
        if look_only {
            return Decision::Nothing; // only its existence was asked
        }
        return Decision::Refuse(
            "a directory holding secret places or homes (only its entries can be granted)".into(),
        );
    }
    Decision::Bind {
        source,
        writable,
        refused_write,
    }
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

/// Merges binds below another bind into it, and directories with
/// `COLLAPSE_AT` or more bound entries into one bind, until nothing moves.
fn collapse(wants: &mut BTreeMap<PathBuf, LearnedBind>, input: &PlanInput, host: &dyn Host) {
    loop {
        let sources: Vec<PathBuf> = wants.keys().cloned().collect();
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
        let inner = sources.iter().find_map(|s| {
            sources
                .iter()
                .find(|o| *o != s && s.starts_with(o))
                .cloned()
        });
        let Some(dir) = target.or(inner) else {
            return;
        };
        let moved: Vec<PathBuf> = sources
            .into_iter()
            .filter(|s| s.starts_with(&dir) && *s != dir)
            .collect();
        for source in moved {
            if let Some(bind) = wants.remove(&source) {
                for path in &bind.paths {
                    add(wants, dir.clone(), bind.writable, &bind.kinds, path);
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
