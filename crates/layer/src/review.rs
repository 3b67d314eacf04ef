//! What the owner reviewed is what `apply` writes: `diff` shows a digest
//! of the change set it showed and records it in the layer; `apply
//! --expect DIGEST` checks the change set against the digest the owner
//! read, and a plain `apply` against the last diff's record, so a turn
//! that ran after the review (or anything else that changed the layer)
//! makes `apply` refuse instead of writing what nobody read.
//!
//! The digest covers the layer whole, its turns merged: every path with
//! what is there (a deletion, an opaque directory, or a node: its kind,
//! link target, mode, size, the SHA-256 of a file's bytes). The host's
//! side is not in it: the owner's own edits after the review are for
//! `apply`'s conflict check to find.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::LayerError;
use crate::changes::{Node, NodeKind};
use crate::host::{digest as file_digest, open_node_content};
use crate::scan::Entry;
use crate::store::{Layer, LayerLock, read_record, write_json};

/// The file in the layer that holds the last review.
pub const RECORD: &str = "reviewed.json";

/// The fewest hex digits `--expect` may give.
pub const MIN_EXPECT_DIGITS: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reviewed {
    digest: String,
    turns: Vec<u32>,
}

/// What `apply` checks the change set against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect<'a> {
    /// The digest the owner gives (`--expect`), whole or its first digits.
    Digest(&'a str),
    /// The last `diff`'s record, when there is one.
    LastReview,
}

/// The digest of what the layer would change, in hex: its turns merged
/// as overlayfs merges them, each path with what the layer has there.
pub fn digest(layer: &Layer) -> Result<String, LayerError> {
    use std::os::unix::ffi::OsStrExt;
    let mut hasher = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    for (path, entry) in crate::changes::merged(layer)? {
        field(path.as_os_str().as_bytes());
        match entry {
            Entry::Whiteout => field(b"whiteout"),
            Entry::OpaqueDir(node) => {
                field(b"opaque");
                field(&node_bytes(layer, &node)?);
            }
            Entry::Present(node) => {
                field(b"present");
                field(&node_bytes(layer, &node)?);
            }
        }
    }
    let sum: [u8; 32] = hasher.finalize().into();
    Ok(sum.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the layer has at a path as bytes; a file's content by its SHA-256.
fn node_bytes(layer: &Layer, node: &Node) -> Result<Vec<u8>, LayerError> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    match &node.kind {
        NodeKind::File => {
            out.extend_from_slice(b"file\0");
            let file = open_node_content(layer, node)?;
            out.extend_from_slice(&file_digest(file, &node.source.display(layer))?);
        }
        NodeKind::Dir => out.extend_from_slice(b"dir\0"),
        NodeKind::Symlink { target } => {
            out.extend_from_slice(b"symlink\0");
            out.extend_from_slice(target.as_os_str().as_bytes());
        }
        NodeKind::Special { what } => {
            out.extend_from_slice(b"special\0");
            out.extend_from_slice(what.as_bytes());
        }
    }
    out.push(0);
    out.extend_from_slice(&node.mode.to_le_bytes());
    out.extend_from_slice(&node.size.to_le_bytes());
    Ok(out)
}

/// Records that the owner was shown the change set `digest` (under the
/// layer's lock, which the caller holds).
pub fn record(layer: &Layer, digest: &str, _lock: &LayerLock) -> Result<(), LayerError> {
    let record = Reviewed {
        digest: digest.to_string(),
        turns: layer.turns()?,
    };
    write_json(&layer.dir().join(RECORD), &record)
}

/// Forgets the last review (the layer was discarded).
pub fn forget(layer: &Layer, _lock: &LayerLock) -> Result<(), LayerError> {
    let path = layer.dir().join(RECORD);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LayerError::io("remove", &path, e)),
    }
}

/// Checks what the layer would change against what the owner reviewed,
/// before `apply` writes any of it: the digest given, or else the last
/// diff's record (none on record: refused).
pub fn check(layer: &Layer, expect: Expect<'_>, _lock: &LayerLock) -> Result<(), LayerError> {
    let now = digest(layer)?;
    match expect {
        Expect::Digest(given) => {
            let given = given.trim().to_ascii_lowercase();
            let well_formed = given.len() >= MIN_EXPECT_DIGITS
                && given.len() <= now.len()
                && given.bytes().all(|b| b.is_ascii_hexdigit());
            if !well_formed {
                return Err(LayerError::NotReviewed(format!(
                    "--expect takes the digest `diff` printed (at least {MIN_EXPECT_DIGITS} hex digits)"
                )));
            }
            if !now.starts_with(&given) {
                return Err(LayerError::NotReviewed(format!(
                    "the layer's changes are not the ones reviewed: their digest is {now}, not {given}; run diff again"
                )));
            }
            Ok(())
        }
        Expect::LastReview => {
            let Some(last) = last_review(layer)? else {
                return Err(LayerError::NotReviewed(
                    "no diff of this layer is on record: run diff first (apply writes what it shows), or apply --expect DIGEST".into(),
                ));
            };
            if last.digest == now {
                return Ok(());
            }
            let turns = layer.turns()?;
            let why = if turns != last.turns {
                format!(
                    "a turn ran after the last diff (the layer's turns then: {:?}, now: {turns:?})",
                    last.turns
                )
            } else {
                "the layer changed after the last diff".to_string()
            };
            Err(LayerError::NotReviewed(format!(
                "{why}: what would be applied is not what was shown; run diff again (or apply --expect DIGEST)"
            )))
        }
    }
}

fn last_review(layer: &Layer) -> Result<Option<Reviewed>, LayerError> {
    let path = layer.dir().join(RECORD);
    let text = match read_record(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LayerError::io("read", &path, e)),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| LayerError::Corrupt {
            path: Path::new(&path).to_path_buf(),
            why: e.to_string(),
        })
}
