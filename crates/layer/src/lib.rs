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
pub mod review;
mod scan;
mod store;
mod trust;
mod walk;

#[cfg(test)]
mod deep_tests;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use substrat_policy::text::{escape_path, escape_text};

pub use changes::{Change, ChangeKind, Node, NodeKind, Source, changes};
pub use host::copy_sparse;
pub use store::{FileId, Identity, Layer, LayerLock, MAX_TURNS, TurnDirs};

/// A path in an error, as people may see it: the names in a layer are
/// the agent's choice (issue 40), so no control character is shown raw.
fn shown(path: &Path) -> Cow<'_, str> {
    escape_path(path)
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("cannot {what} {}: {source}", shown(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a workspace layer (no layer.json)", shown(.0))]
    NotALayer(PathBuf),
    #[error("workspace layer {}: {}", shown(path), escape_text(why))]
    Corrupt { path: PathBuf, why: String },
    #[error(
        "the layer {} was made for workspace {}, not {}; use another layer directory",
        shown(layer),
        shown(made_for),
        shown(given)
    )]
    OtherWorkspace {
        layer: PathBuf,
        made_for: PathBuf,
        given: PathBuf,
    },
    #[error(
        "the layer {} is in use (a sandbox running over it, or another apply, discard or rollback); try again when it has ended",
        shown(.0)
    )]
    InUse(PathBuf),
    #[error(
        "the layer {} has {MAX_TURNS} turns, the most an overlay can stack here; apply or discard it",
        shown(.0)
    )]
    TooManyTurns(PathBuf),
    #[error(
        "the layer {} cannot be trusted: {why} (a layer and its parents must be yours and writable by nobody else, as ssh wants of its keys)",
        shown(path)
    )]
    Untrusted { path: PathBuf, why: String },
    #[error(
        "the workspace {} is not the directory the layer was made over (moved, or replaced by another): nothing is read or written there",
        shown(.0)
    )]
    WorkspaceReplaced(PathBuf),
    #[error("nothing applied: {0}")]
    NotReviewed(String),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn an_agent_chosen_name_in_an_error_is_escaped() {
        let name = std::ffi::OsStr::from_bytes(b"ws/a\x1b]0;t\x07\xff\xe2\x80\xae");
        let e = LayerError::io("read", Path::new(name), std::io::ErrorKind::NotFound.into());
        assert!(
            e.to_string()
                .starts_with("cannot read ws/a\\x1b]0;t\\x07\\xff\\u{202e}: "),
            "{e}"
        );
    }
}
