//! What a layer changes in the workspace: the turns merged as overlayfs
//! merges them (the newest entry at a path wins; a whiteout, an opaque
//! directory or a non-directory hides everything below it in older
//! turns), then compared with what the host has now.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::LayerError;
use crate::host::{HostNode, HostTree, digest, open_node_content, same_bytes};
use crate::scan::{Entry, scan_upper};
use crate::store::Layer;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum NodeKind {
    File,
    Dir,
    Symlink {
        target: PathBuf,
    },
    /// A FIFO, socket or device node: listed, never applied.
    Special {
        what: &'static str,
    },
}

/// A file system object in one of the two trees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    #[serde(flatten)]
    pub kind: NodeKind,
    /// Permission bits, set-id and sticky included.
    pub mode: u32,
    pub size: u64,
    /// Where its bytes are read from (in the layer, or on the host).
    #[serde(skip)]
    pub source: Source,
}

/// Where a node is: its tree, and its path relative to that tree's root.
/// Never one full host path: a tree an agent made can be deeper than the
/// kernel takes a path (PATH_MAX); the node is opened beneath its tree's
/// root, by descriptors, at any depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// In the upper directory of the layer's turn `turn`.
    Turn { turn: u32, path: PathBuf },
    /// In the host workspace.
    Host { path: PathBuf },
}

impl Source {
    /// The full path, for messages only (it may be too long to open).
    pub fn display(&self, layer: &Layer) -> PathBuf {
        match self {
            Source::Turn { turn, path } => layer.upper(*turn).join(path),
            Source::Host { path } => layer.workspace().join(path),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    /// Only the permission bits differ.
    ModeChanged,
    /// A file became a directory, a link a file...
    TypeChanged,
    /// Added with the content of a file deleted elsewhere in the change.
    Renamed,
}

/// One path the layer changes.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub path: PathBuf,
    pub kind: ChangeKind,
    /// What the host has now.
    pub host: Option<Node>,
    /// What the agent left (none: deleted).
    pub layer: Option<Node>,
    /// For `Renamed`: the deleted path whose content this is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<PathBuf>,
}

/// The turns of `layer` merged: the entry each path shows, newest first.
pub(crate) fn merged(layer: &Layer) -> Result<BTreeMap<PathBuf, Entry>, LayerError> {
    let mut merged: BTreeMap<PathBuf, Entry> = BTreeMap::new();
    for turn in layer.turns()?.into_iter().rev() {
        // Judged against newer turns only: an opaque directory hides what
        // is below it in older turns, not what its own turn put there.
        let visible = visible(&merged, scan_upper(&layer.upper(turn), turn)?);
        merged.extend(visible);
    }
    Ok(merged)
}

/// What of an older turn's `scanned` entries no newer turn decides: an
/// entry at the same path, or one above it that lower layers do not show
/// through. One pass, in path order: a directory comes before everything
/// below it (an upper holds every parent of what it holds), and what is
/// below it comes right after it, so one path at a time hides a run.
fn visible(
    merged: &BTreeMap<PathBuf, Entry>,
    scanned: Vec<(PathBuf, Entry)>,
) -> Vec<(PathBuf, Entry)> {
    let mut out = Vec::new();
    let mut hiding: Option<PathBuf> = None;
    for (path, entry) in scanned {
        if let Some(above) = &hiding {
            if path.starts_with(above) {
                continue;
            }
            hiding = None;
        }
        match merged.get(&path) {
            Some(newer) if !newer.merges_below() => hiding = Some(path),
            Some(_) => {}
            None => out.push((path, entry)),
        }
    }
    out
}

/// Every change of `layer` against the host workspace now, by path.
pub fn changes(layer: &Layer) -> Result<Vec<Change>, LayerError> {
    let host = layer.host()?;
    let merged = merged(layer)?;
    let mut out: BTreeMap<PathBuf, Change> = BTreeMap::new();
    for (path, entry) in &merged {
        let host_node = host.lookup(path)?;
        match entry {
            Entry::Whiteout => {
                if let Some(h) = host_node {
                    delete_with_subtree(&host, path, h, &mut out)?;
                }
            }
            Entry::OpaqueDir(node) => {
                // Everything the host has below it and the layer does not.
                if host_node
                    .as_ref()
                    .is_some_and(|h| h.node.kind == NodeKind::Dir)
                {
                    for (below, h) in host.subtree(path)? {
                        let kept = matches!(
                            merged.get(&below),
                            Some(Entry::Present(_) | Entry::OpaqueDir(_))
                        );
                        if !kept && !out.contains_key(&below) {
                            out.insert(below.clone(), deleted(below, h));
                        }
                    }
                }
                compare(layer, &host, path, node, host_node, &mut out)?;
            }
            Entry::Present(node) => compare(layer, &host, path, node, host_node, &mut out)?,
        }
    }
    let mut changes: Vec<Change> = out.into_values().collect();
    find_renames(layer, &host, &mut changes)?;
    Ok(changes)
}

fn deleted(path: PathBuf, host: HostNode) -> Change {
    Change {
        path,
        kind: ChangeKind::Deleted,
        host: Some(host.node),
        layer: None,
        renamed_from: None,
    }
}

fn delete_with_subtree(
    host: &HostTree,
    path: &Path,
    node: HostNode,
    out: &mut BTreeMap<PathBuf, Change>,
) -> Result<(), LayerError> {
    if node.node.kind == NodeKind::Dir {
        for (below, h) in host.subtree(path)? {
            out.insert(below.clone(), deleted(below, h));
        }
    }
    out.insert(path.to_path_buf(), deleted(path.to_path_buf(), node));
    Ok(())
}

/// The layer's `node` at `path` against the host's.
fn compare(
    layer: &Layer,
    host: &HostTree,
    path: &Path,
    node: &Node,
    host_node: Option<HostNode>,
    out: &mut BTreeMap<PathBuf, Change>,
) -> Result<(), LayerError> {
    let kind = match &host_node {
        None => ChangeKind::Added,
        Some(h) if std::mem::discriminant(&h.node.kind) != std::mem::discriminant(&node.kind) => {
            // A directory replaced: everything it held is gone too.
            if h.node.kind == NodeKind::Dir {
                for (below, hn) in host.subtree(path)? {
                    out.insert(below.clone(), deleted(below, hn));
                }
            }
            ChangeKind::TypeChanged
        }
        Some(h) => {
            let same_content = match (&h.node.kind, &node.kind) {
                (NodeKind::File, NodeKind::File) => {
                    h.node.size == node.size
                        && same_bytes(host.open_file(path)?, open_node_content(layer, node)?, path)?
                }
                (a, b) => a == b,
            };
            match (same_content, h.node.mode == node.mode) {
                (true, true) => return Ok(()),
                (true, false) => ChangeKind::ModeChanged,
                (false, _) => ChangeKind::Modified,
            }
        }
    };
    out.insert(
        path.to_path_buf(),
        Change {
            path: path.to_path_buf(),
            kind,
            host: host_node.map(|h| h.node),
            layer: Some(node.clone()),
            renamed_from: None,
        },
    );
    Ok(())
}

/// An added file whose bytes are those of a deleted file is that file
/// renamed (git's view too); each deleted file pairs with one at most.
fn find_renames(layer: &Layer, host: &HostTree, changes: &mut [Change]) -> Result<(), LayerError> {
    let mut deleted_by_size: BTreeMap<u64, Vec<(PathBuf, [u8; 32])>> = BTreeMap::new();
    let added_sizes: std::collections::BTreeSet<u64> = changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Added)
        .filter_map(|c| c.layer.as_ref())
        .filter(|n| n.kind == NodeKind::File && n.size > 0)
        .map(|n| n.size)
        .collect();
    for c in changes.iter().filter(|c| c.kind == ChangeKind::Deleted) {
        if let Some(h) = &c.host
            && h.kind == NodeKind::File
            && added_sizes.contains(&h.size)
        {
            let digest = digest(host.open_file(&c.path)?, &c.path)?;
            deleted_by_size
                .entry(h.size)
                .or_default()
                .push((c.path.clone(), digest));
        }
    }
    if deleted_by_size.is_empty() {
        return Ok(());
    }
    for c in changes.iter_mut().filter(|c| c.kind == ChangeKind::Added) {
        let Some(node) = c.layer.as_ref().filter(|n| n.kind == NodeKind::File) else {
            continue;
        };
        let Some(candidates) = deleted_by_size.get_mut(&node.size) else {
            continue;
        };
        let digest = digest(open_node_content(layer, node)?, &c.path)?;
        if let Some(i) = candidates.iter().position(|(_, d)| *d == digest) {
            let (from, _) = candidates.swap_remove(i);
            c.kind = ChangeKind::Renamed;
            c.renamed_from = Some(from);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::Layer;

    fn whiteout(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0),
            0,
        )
        .unwrap();
    }

    /// Three turns stacked by hand as overlayfs leaves them: what each
    /// path shows is the newest turn's, and what a whiteout or an opaque
    /// directory hides below stays hidden.
    #[test]
    fn turns_merge_as_overlayfs_merges_them() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/host"), "h\n").unwrap();
        std::fs::write(ws.join("kept"), "k\n").unwrap();
        let layer = Layer::open_or_create(&dir.path().join("layer"), &ws).unwrap();
        let lock = layer.lock().unwrap();
        let t1 = layer.begin_turn(&lock).unwrap();
        std::fs::write(t1.upper.join("a"), "1\n").unwrap();
        std::fs::write(t1.upper.join("b"), "1\n").unwrap();
        std::fs::create_dir(t1.upper.join("d")).unwrap();
        std::fs::write(t1.upper.join("d/one"), "1\n").unwrap();
        layer.finish_turn(&t1, &lock).unwrap();
        let t2 = layer.begin_turn(&lock).unwrap();
        assert_eq!(t2.frozen, vec![t1.upper.clone()]);
        std::fs::write(t2.upper.join("a"), "2\n").unwrap();
        whiteout(&t2.upper.join("b"));
        // d recreated in turn 2: opaque, so turn 1's d/one and the host's
        // d/host are gone; its own d/two shows.
        std::fs::create_dir(t2.upper.join("d")).unwrap();
        rustix::fs::setxattr(
            t2.upper.join("d").as_path(),
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        std::fs::write(t2.upper.join("d/two"), "2\n").unwrap();
        layer.finish_turn(&t2, &lock).unwrap();
        let summary: Vec<(String, ChangeKind)> = changes(&layer)
            .unwrap()
            .into_iter()
            .map(|c| (c.path.display().to_string(), c.kind))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a".to_string(), ChangeKind::Added),
                ("d/host".to_string(), ChangeKind::Deleted),
                ("d/two".to_string(), ChangeKind::Added),
            ]
        );
        let merged = merged(&layer).unwrap();
        assert!(matches!(merged.get(Path::new("b")), Some(Entry::Whiteout)));
        assert!(!merged.contains_key(Path::new("d/one")));
        match merged.get(Path::new("a")) {
            Some(Entry::Present(node)) => assert_eq!(
                node.source,
                Source::Turn {
                    turn: t2.number,
                    path: "a".into()
                }
            ),
            other => panic!("a: {other:?}"),
        }
    }
}
