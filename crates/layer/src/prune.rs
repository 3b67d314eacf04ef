//! After an apply, what was applied leaves the layer: the host has it
//! now, so the layer keeps only what is still the agent's alone. Files,
//! links and whiteouts at applied paths are removed from every turn;
//! directories that are then empty, not opaque, and match the host's
//! directory go too.

use std::fs;
use std::path::Path;

use crate::LayerError;
use crate::changes::{Change, ChangeKind, NodeKind};
use crate::host::HostTree;
use crate::scan::{Entry, clear_opaque, scan_upper};
use crate::store::{Layer, LayerLock};

pub(crate) fn forget_applied(
    layer: &Layer,
    _lock: &LayerLock,
    applied: &[&Change],
    pending: &[Change],
) -> Result<(), LayerError> {
    let host = layer.host()?;
    for upper in layer.uppers()? {
        // An opaque directory whose deletions are all applied hides nothing
        // the host still has: its mark goes, and the host shows through
        // again. One with deletions still pending keeps its mark, and with
        // it everything below it (the host's copies would stay hidden).
        let mut still_opaque = Vec::new();
        for (path, entry) in scan_upper(&upper)? {
            if !matches!(entry, Entry::OpaqueDir(_)) {
                continue;
            }
            let blocked = pending
                .iter()
                .any(|c| c.kind == ChangeKind::Deleted && c.path.starts_with(&path));
            if blocked {
                still_opaque.push(path);
            } else {
                clear_opaque(&upper.join(&path))?;
            }
        }
        for c in applied {
            if still_opaque.iter().any(|o| c.path.starts_with(o)) {
                continue;
            }
            let at = upper.join(&c.path);
            match fs::symlink_metadata(&at) {
                Ok(meta) if !meta.is_dir() => {
                    fs::remove_file(&at).map_err(|e| LayerError::io("remove", &at, e))?
                }
                _ => {}
            }
        }
        prune_dirs(&host, &upper)?;
    }
    Ok(())
}

/// Removes the directories of `upper` that carry nothing, deepest first.
fn prune_dirs(host: &HostTree, upper: &Path) -> Result<(), LayerError> {
    let entries = scan_upper(upper)?;
    for (path, entry) in entries.iter().rev() {
        let Entry::Present(node) = entry else {
            continue;
        };
        if node.kind != NodeKind::Dir {
            continue;
        }
        let at = upper.join(path);
        let empty = fs::read_dir(&at)
            .map_err(|e| LayerError::io("read", &at, e))?
            .next()
            .is_none();
        let same_on_host = host
            .lookup(path)?
            .is_some_and(|h| h.node.kind == NodeKind::Dir && h.node.mode == node.mode);
        if empty && same_on_host {
            fs::remove_dir(&at).map_err(|e| LayerError::io("remove", &at, e))?;
        }
    }
    Ok(())
}
