//! Taking a layer's changes into the host workspace.
//!
//! - Refused, listed and skipped whatever `--force` says: set-id bits,
//!   FIFOs, sockets and device nodes, symlinks that leave the workspace,
//!   and anything with a `.git` component (host git executes and trusts
//!   what is there; the agent's commits are taken with `git fetch`).
//! - A conflict is a path the host changed since the agent's base: its
//!   identity (inode, ctime) differs from the one recorded when the agent
//!   first changed it, or, unrecorded, its ctime is at or after the
//!   layer's base time. Any conflict stops the whole apply before a byte
//!   is written, unless forced.
//! - Each file is written whole to an unnamed file in its directory, then
//!   linked and renamed over its path: a kill at any moment leaves each
//!   path as it was or as the agent left it, never torn.
//! - Every path is opened beneath the workspace without following a
//!   symlink; what was applied leaves the layer.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use serde::Serialize;

use crate::LayerError;
use crate::beneath::split;
use crate::changes::{Change, ChangeKind, NodeKind};
use crate::host::HostTree;
use crate::store::{Identity, Layer, LayerLock};

/// Why apply never writes a change, whatever `--force` says.
pub fn refusal(c: &Change) -> Option<&'static str> {
    let git =
        has_git_component(&c.path) || c.renamed_from.as_deref().is_some_and(has_git_component);
    if git {
        return Some("git metadata: host git would run or trust it");
    }
    let layer = c.layer.as_ref()?;
    match &layer.kind {
        NodeKind::Special { what } => Some(match *what {
            "a FIFO" => "a FIFO",
            "a socket" => "a socket",
            _ => "a device node",
        }),
        // A directory's set-group-id only passes its group on (a new one
        // below a setgid host directory has it): masked when applied.
        NodeKind::Dir => None,
        _ if layer.mode & 0o6000 != 0 => Some("set-id bits"),
        NodeKind::Symlink { target } if !stays_inside(&c.path, target) => {
            Some("a symlink that points outside the workspace")
        }
        NodeKind::Symlink { target } if has_git_component(target) => {
            Some("a symlink into git metadata: host tools would write there through it")
        }
        _ => None,
    }
}

/// Whether `path` has a `.git` component, in any case.
fn has_git_component(path: &Path) -> bool {
    path.components()
        .any(|part| part.as_os_str().as_bytes().eq_ignore_ascii_case(b".git"))
}

/// Whether a link at `path` (relative) to `target` resolves to a path below
/// the workspace's root. `..` counts only at the start of the target, where
/// it climbs the link's own directories (real ones: apply makes them, and
/// never follows a link on the host); after a name, which may itself be a
/// symlink (`a -> .` then `a/a/../..`), it is refused.
fn stays_inside(path: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: usize = path.components().count().saturating_sub(1);
    let mut named = false;
    for part in target.components() {
        match part {
            Component::Normal(_) => {
                depth += 1;
                named = true;
            }
            Component::CurDir => {}
            Component::ParentDir if named => return false,
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// The mode apply gives what it writes: never set-id, sticky or
/// world-writable, whatever the agent set (a shared host's other users
/// must not be handed a writable file in the tree).
const APPLIED_MODE_BITS: u32 = 0o775;

/// The umask of whoever applies (read from /proc/self/status, which
/// setting and restoring it would race with other threads; 022 when it
/// cannot be read): what it removes, apply removes, as a file the owner
/// made would have.
fn owner_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022)
}

/// What an apply did, path by path.
#[derive(Debug, Default, Serialize)]
pub struct ApplyReport {
    pub applied: Vec<PathBuf>,
    /// Refused kinds, with why.
    pub skipped: Vec<(PathBuf, &'static str)>,
    /// Host paths changed since the agent's base (nothing applied).
    pub conflicts: Vec<(PathBuf, String)>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions {
    /// Take the agent's side where the host changed too.
    pub force: bool,
}

/// Applies `changes` (all of a layer's, or those chosen) to the host.
/// `repositories`: the host workspace's bare repositories (their
/// directories, relative), below which nothing is written (git runs their
/// hooks and reads their config as it does a `.git`'s).
pub fn apply(
    layer: &Layer,
    lock: &LayerLock,
    changes: &[Change],
    options: ApplyOptions,
    repositories: &[PathBuf],
) -> Result<ApplyReport, LayerError> {
    apply_with_progress(layer, lock, changes, options, repositories, &mut |_, _| {})
}

/// `apply`, telling `written(path, total)` before each of the `total`
/// changes written to the host (a person's progress line).
pub fn apply_with_progress(
    layer: &Layer,
    lock: &LayerLock,
    changes: &[Change],
    options: ApplyOptions,
    repositories: &[PathBuf],
    written: &mut dyn FnMut(&Path, usize),
) -> Result<ApplyReport, LayerError> {
    let host = layer.host()?;
    let mut base = layer.base()?;
    let all = crate::changes(layer)?;
    let mut report = ApplyReport::default();
    let mut todo = Vec::new();
    let in_repository = |p: &Path| repositories.iter().any(|r| p.starts_with(r));
    for c in changes {
        let below_repository =
            in_repository(&c.path) || c.renamed_from.as_deref().is_some_and(in_repository);
        let why = match below_repository {
            true => Some("inside a bare git repository: host git would run or trust it"),
            false => refusal(c),
        };
        match why {
            Some(why) => report.skipped.push((c.path.clone(), why)),
            None => todo.push(c),
        }
    }
    for c in &todo {
        if let Some(why) = conflict(&host, layer, &base, c)? {
            report.conflicts.push((c.path.clone(), why));
        }
    }
    if !report.conflicts.is_empty() && !options.force {
        return Ok(report);
    }
    // Deletions deepest first (a directory after what it held), then what
    // is made, parents first, then directory modes deepest first (a
    // read-only directory last of all).
    // A file that becomes a link (or a link a file) is not deleted first:
    // the new one is renamed over it, so a kill leaves one or the other.
    let is_dir =
        |n: &Option<crate::changes::Node>| n.as_ref().is_some_and(|n| n.kind == NodeKind::Dir);
    let mut deletions: Vec<&Path> = todo
        .iter()
        .filter(|c| match c.kind {
            ChangeKind::Deleted => true,
            ChangeKind::TypeChanged => is_dir(&c.host) || is_dir(&c.layer),
            _ => false,
        })
        .map(|c| c.path.as_path())
        .collect();
    deletions.sort_by(|a, b| b.cmp(a));
    for path in deletions {
        remove_host(&host, path)?;
    }
    let allowed = APPLIED_MODE_BITS & !owner_umask();
    let writes = todo.iter().filter(|c| c.kind != ChangeKind::Deleted);
    let total = writes.clone().count();
    for c in writes {
        written(&c.path, total);
        write_host(layer, &host, c, allowed)?;
    }
    let mut dirs: Vec<&&Change> = todo
        .iter()
        .filter(|c| c.layer.as_ref().is_some_and(|n| n.kind == NodeKind::Dir))
        .collect();
    dirs.sort_by(|a, b| b.path.cmp(&a.path));
    for c in dirs {
        if let Some(n) = &c.layer {
            chmod_host(&host, &c.path, n.mode & allowed)?;
        }
    }
    for c in &todo {
        match host.lookup(&c.path)? {
            Some(now) => base.insert(c.path.clone(), now.identity),
            None => base.remove(&c.path),
        };
        report.applied.push(c.path.clone());
    }
    layer.save_base(&base)?;
    // Looked up by order, not equality: two paths of a deep chain are
    // compared for equality name by name from their ends.
    let applied: std::collections::BTreeSet<&Path> =
        todo.iter().map(|t| t.path.as_path()).collect();
    let pending: Vec<Change> = all
        .into_iter()
        .filter(|c| !applied.contains(c.path.as_path()))
        .collect();
    crate::prune::forget_applied(layer, lock, &todo, &pending)?;
    Ok(report)
}

/// Why `c` would overwrite something the host changed since the base.
fn conflict(
    host: &HostTree,
    layer: &Layer,
    base: &BTreeMap<PathBuf, Identity>,
    c: &Change,
) -> Result<Option<String>, LayerError> {
    let now = host.lookup(&c.path)?;
    let changed = match (base.get(&c.path), &now) {
        (Some(recorded), Some(now)) => now.identity != *recorded,
        (Some(_), None) => return Ok(Some("deleted on the host since the agent's base".into())),
        (None, Some(now)) => now.identity.ctime_ns >= layer.base_ns(),
        (None, None) => false,
    };
    if changed {
        return Ok(Some("changed on the host since the agent's base".into()));
    }
    // A changes's own source (a renamed file) must be unchanged too.
    if let Some(from) = &c.renamed_from
        && let Some(now) = host.lookup(from)?
    {
        let recorded = base.get(from);
        if recorded.is_some_and(|r| *r != now.identity)
            || (recorded.is_none() && now.identity.ctime_ns >= layer.base_ns())
        {
            return Ok(Some(format!(
                "its source {} changed on the host since the agent's base",
                crate::diff::quote(from)
            )));
        }
    }
    Ok(None)
}

/// The directory `rel` beneath the workspace, made (with the layer's
/// directories' modes applied later) where absent.
fn dir_at(host: &HostTree, rel: &Path) -> Result<OwnedFd, LayerError> {
    host.open_at(rel, OFlags::PATH | OFlags::DIRECTORY)?
        .ok_or_else(|| {
            LayerError::io(
                "open the directory",
                &host.root.join(rel),
                std::io::ErrorKind::NotFound.into(),
            )
        })
}

fn remove_host(host: &HostTree, path: &Path) -> Result<(), LayerError> {
    let Some(now) = host.lookup(path)? else {
        return Ok(());
    };
    let (parent, name) = split(path);
    let dir = dir_at(host, parent)?;
    let flags = if now.node.kind == NodeKind::Dir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    rustix::fs::unlinkat(&dir, name, flags)
        .map_err(|e| LayerError::io("remove", &host.root.join(path), e.into()))
}

/// Writes `c` to the host, its mode masked with `allowed`.
fn write_host(layer: &Layer, host: &HostTree, c: &Change, allowed: u32) -> Result<(), LayerError> {
    let Some(node) = &c.layer else {
        return Ok(());
    };
    let full = host.root.join(&c.path);
    let (parent, name) = split(&c.path);
    let dir = dir_at(host, parent)?;
    let full = &full;
    let err = |what| move |e: rustix::io::Errno| LayerError::io(what, full, e.into());
    match &node.kind {
        NodeKind::Dir => match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(err("make the directory")(e)),
        },
        NodeKind::File => {
            let mode = Mode::from_raw_mode(node.mode & allowed);
            let tmp = rustix::fs::openat(
                &dir,
                ".",
                OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
                mode,
            )
            .map_err(err("make a file in the directory of"))?;
            // The agent's file: its last component never followed, a
            // regular file or an error; its holes kept.
            let from = crate::host::open_node_content(layer, node)?;
            let to = std::fs::File::from(tmp);
            crate::host::copy_sparse(&from, &to).map_err(|e| LayerError::io("write", full, e))?;
            rustix::fs::fchmod(&to, mode).map_err(err("set the mode of"))?;
            to.sync_all()
                .map_err(|e| LayerError::io("write", full, e))?;
            let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&to));
            let temp = temp_name(name);
            rustix::fs::linkat(
                rustix::fs::CWD,
                proc_path.as_str(),
                &dir,
                &temp,
                AtFlags::SYMLINK_FOLLOW,
            )
            .map_err(err("link the new file for"))?;
            rustix::fs::renameat(&dir, &temp, &dir, name).map_err(err("rename into place"))
        }
        NodeKind::Symlink { target } => {
            let temp = temp_name(name);
            rustix::fs::symlinkat(target.as_os_str(), &dir, &temp).map_err(err("make the link"))?;
            rustix::fs::renameat(&dir, &temp, &dir, name).map_err(err("rename into place"))
        }
        NodeKind::Special { .. } => Ok(()),
    }
}

/// A name beside `name` for the instant between link and rename: the
/// start of `name` (whole when short; a name may be 255 bytes, and the
/// temporary one must fit too) and this process.
fn temp_name(name: &OsStr) -> std::ffi::OsString {
    let bytes = name.as_bytes();
    let start = &bytes[..bytes.len().min(200)];
    let mut temp = std::ffi::OsString::from(".");
    temp.push(OsStr::from_bytes(start));
    temp.push(format!(".substrat-apply-{}", std::process::id()));
    temp
}

fn chmod_host(host: &HostTree, path: &Path, mode: u32) -> Result<(), LayerError> {
    let Some(fd) = host.open_at(path, OFlags::RDONLY | OFlags::DIRECTORY)? else {
        return Ok(());
    };
    rustix::fs::fchmod(fd.as_fd(), Mode::from_raw_mode(mode))
        .map_err(|e| LayerError::io("set the mode of", &host.root.join(path), e.into()))
}

#[cfg(test)]
mod tests {
    use super::stays_inside;
    use std::path::Path;

    #[test]
    fn links_are_judged_from_where_they_sit() {
        let inside = |path: &str, target: &str| stays_inside(Path::new(path), Path::new(target));
        assert!(inside("link", "src/a.txt"));
        assert!(inside("a/b/link", "../../c"));
        // `..` after a name is refused: the name may be a link (`a -> .`).
        assert!(!inside("a/link", "./x/../y"));
        assert!(!inside("l", "a/a/a/a/../../../../../etc/passwd"));
        assert!(!inside("link", "../x"));
        assert!(!inside("a/b/link", "../../../x"));
        assert!(!inside("link", "/etc/passwd"));
        assert!(!inside("link", "a/../../x"));
    }
}
