//! What a daemon keeps of the team's authorities in its own state dir,
//! out of a database writer's reach:
//!
//! STATE_DIR/tls/offered   the fingerprint of this daemon's own authority,
//!                         once the team holds it (its `ca.key` is removed)
//! STATE_DIR/tls/retired   the fingerprints of the retired authorities this
//!                         daemon has seen, one a line: never trusted again
//!
//! A line is exactly a fingerprint (64 lowercase hex digits) and its
//! newline, never trimmed: a line that is not is named in the log and
//! counts for nothing, and no such fingerprint is ever written.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::TeamCaError;

fn file(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("tls").join(name)
}

fn failed(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> TeamCaError {
    let context = format!("{what} {}", path.display());
    move |e| TeamCaError::Local(context, e)
}

fn read(path: &Path) -> Result<String, TeamCaError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(failed(path, "read")(e)),
    }
}

/// This daemon's own authority, held by the team now: its fingerprint
/// noted, its key file (the key in the clear) removed.
pub(super) fn forget_key(state_dir: &Path, fingerprint: &str) -> Result<(), TeamCaError> {
    let noted = file(state_dir, "offered");
    std::fs::write(&noted, format!("{fingerprint}\n")).map_err(failed(&noted, "write"))?;
    let key = file(state_dir, "ca.key");
    match std::fs::remove_file(&key) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed(&key, "remove")(e)),
        _ => Ok(()),
    }
}

/// The fingerprints of the lines of `text` that are exactly one; the
/// others are named in the log.
fn fingerprints<'a>(path: &Path, text: &'a str) -> impl Iterator<Item = &'a str> {
    let path = path.display().to_string();
    text.split_terminator('\n').filter(move |line| {
        let ok = crate::tls::is_fingerprint(line);
        if !ok {
            tracing::warn!(file = %path, line = ?line, "a line that is not a fingerprint: ignored");
        }
        ok
    })
}

/// The fingerprint of this daemon's own authority the team holds, if any.
pub(super) fn offered(state_dir: &Path) -> Result<Option<String>, TeamCaError> {
    let path = file(state_dir, "offered");
    let text = read(&path)?;
    Ok(fingerprints(&path, &text).next().map(String::from))
}

/// The retired authorities this daemon has seen.
pub(super) fn retired(state_dir: &Path) -> Result<HashSet<String>, TeamCaError> {
    let path = file(state_dir, "retired");
    let text = read(&path)?;
    Ok(fingerprints(&path, &text).map(String::from).collect())
}

/// Notes `fingerprints` as retired, for good. Each must be exactly a
/// fingerprint: anything else is refused, and nothing is written.
pub(super) fn add_retired(state_dir: &Path, fingerprints: &[String]) -> Result<(), TeamCaError> {
    if let Some(bad) = fingerprints.iter().find(|f| !crate::tls::is_fingerprint(f)) {
        return Err(TeamCaError::NotAFingerprint(bad.clone()));
    }
    let known = retired(state_dir)?;
    let new: Vec<&String> = fingerprints
        .iter()
        .filter(|f| !known.contains(*f))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let path = file(state_dir, "retired");
    std::fs::create_dir_all(state_dir.join("tls")).map_err(failed(&path, "create the dir of"))?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(failed(&path, "open"))?;
    let text: String = new.iter().map(|f| format!("{f}\n")).collect();
    out.write_all(text.as_bytes())
        .map_err(failed(&path, "write"))?;
    out.sync_all().map_err(failed(&path, "sync"))
}
