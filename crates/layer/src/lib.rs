//! Workspace layers (`workspace_mode = overlay`): an agent's writes kept
//! above the host workspace in a directory of their own, one overlayfs
//! upper directory per turn, so that a person can see what the agent
//! changed (`changes`, `diff`), take it (`apply`), throw it away, or undo
//! the last turns (`Layer::rollback`).
//!
//! Everything here runs on the host, after the sandbox that wrote the
//! layer has ended, and treats both trees as hostile to path lookups: the
//! layer was written by the agent, the workspace may be written by other
//! agents. Host paths are opened beneath the workspace without following
//! any symlink; nothing is ever followed out of either tree.

#![forbid(unsafe_code)]

pub mod apply;
mod beneath;
pub mod changes;
pub mod diff;
mod host;
mod names;
mod prune;
mod remove;
mod scan;
mod store;
mod walk;

#[cfg(test)]
mod deep_tests;

use std::path::{Path, PathBuf};

pub use changes::{Change, ChangeKind, Node, NodeKind, Source, changes};
pub use host::copy_sparse;
pub use store::{Identity, Layer, LayerLock, MAX_TURNS, TurnDirs};

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a workspace layer (no layer.json)", .0.display())]
    NotALayer(PathBuf),
    #[error("workspace layer {}: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error(
        "the layer {} was made for workspace {}, not {}; use another layer directory",
        layer.display(),
        made_for.display(),
        given.display()
    )]
    OtherWorkspace {
        layer: PathBuf,
        made_for: PathBuf,
        given: PathBuf,
    },
    #[error(
        "the layer {} is in use (a sandbox running over it, or another apply, discard or rollback); try again when it has ended",
        .0.display()
    )]
    InUse(PathBuf),
    #[error(
        "the layer {} has {MAX_TURNS} turns, the most an overlay can stack here; apply or discard it",
        .0.display()
    )]
    TooManyTurns(PathBuf),
    #[error("the layer has no turn {turn} (its turns: {turns:?})")]
    NoSuchTurn { turn: u32, turns: Vec<u32> },
}

impl LayerError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> LayerError {
        LayerError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
