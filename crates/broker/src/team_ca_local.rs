//! What a daemon keeps of the team's authorities in its own state dir,
//! out of a database writer's reach:
//!
//! STATE_DIR/tls/offered   the fingerprint of this daemon's own authority,
//!                         once the team holds it (its `ca.key` is removed)
//! STATE_DIR/tls/retired   the fingerprints of the retired authorities this
//!                         daemon has seen, one a line: never trusted again

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

/// The fingerprint of this daemon's own authority the team holds, if any.
pub(super) fn offered(state_dir: &Path) -> Result<Option<String>, TeamCaError> {
    let text = read(&file(state_dir, "offered"))?;
    Ok(Some(text.trim().to_string()).filter(|f| !f.is_empty()))
}

/// The retired authorities this daemon has seen.
pub(super) fn retired(state_dir: &Path) -> Result<HashSet<String>, TeamCaError> {
    let text = read(&file(state_dir, "retired"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Notes `fingerprints` as retired, for good.
pub(super) fn add_retired(state_dir: &Path, fingerprints: &[String]) -> Result<(), TeamCaError> {
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
