//! The secret places `check` knows, asked of one path a command touched:
//! the host's key and credential files (`HOST_SECRET_PLACES`), the
//! credential stores of a home (`CREDENTIAL_PATHS`, in the learner's home,
//! `/root` and every `/home/NAME`), and container runtime, SSH and GPG
//! names (SBX005's and SBX006's). A path in one is wanted, never granted.

use std::path::{Component, Path, PathBuf};

use crate::check::rules::filesystem::{CONTAINER_NEEDLES, SSH_GPG_NEEDLES};
use crate::check::rules::secrets::{HOST_SECRET_PLACES, component_matches};
use crate::workspace_risk::{CREDENTIAL_PATHS, STARTUP_FILES};

fn parts(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// `path` is `place` or lies in it (`*` in a component of `place`
/// matching any text there).
fn lies_in(path: &Path, place: &Path) -> bool {
    let (p, q) = (parts(path), parts(place));
    p.len() >= q.len() && q.iter().zip(&p).all(|(q, p)| component_matches(q, p))
}

/// The homes a path may lie in: the learner's, root's, and `/home/NAME`
/// when the path is below one.
fn homes_of(path: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = home.into_iter().map(Path::to_path_buf).collect();
    homes.push(PathBuf::from("/root"));
    if let [first, name, ..] = parts(path).as_slice()
        && first == "home"
    {
        homes.push(Path::new("/home").join(name));
    }
    homes
}

/// Why `path` is a secret place (what it holds and where), or none.
pub fn secret_of(path: &Path, home: Option<&Path>) -> Option<String> {
    if let Some(place) = HOST_SECRET_PLACES
        .iter()
        .find(|p| lies_in(path, Path::new(p.path)))
    {
        return Some(format!("the host's {} ({})", place.holds, place.path));
    }
    for home in homes_of(path, home) {
        if let Some(entry) = CREDENTIAL_PATHS
            .iter()
            .find(|entry| lies_in(path, &home.join(entry)))
        {
            return Some(format!("credentials (~/{entry} of {})", home.display()));
        }
    }
    let text = path.to_string_lossy();
    if let Some(needle) = CONTAINER_NEEDLES.iter().find(|n| text.contains(**n)) {
        return Some(format!("a container runtime's socket or state ({needle})"));
    }
    if let Some(needle) = SSH_GPG_NEEDLES.iter().find(|n| text.contains(**n)) {
        return Some(format!("SSH or GPG keys or agents ({needle})"));
    }
    None
}

/// Whether `dir` holds a secret place below it (so it is never granted
/// whole: `/etc` holds `/etc/shadow`).
pub fn holds_secret(dir: &Path, home: Option<&Path>) -> bool {
    let host = HOST_SECRET_PLACES
        .iter()
        .any(|p| lies_in(Path::new(p.path), dir));
    let homes = [home.map(Path::to_path_buf), Some(PathBuf::from("/root"))];
    let creds = homes.iter().flatten().any(|h| {
        lies_in(h, dir)
            || CREDENTIAL_PATHS
                .iter()
                .any(|entry| lies_in(&h.join(entry), dir))
    });
    // Every home lies in /home.
    host || creds || lies_in(Path::new("/home/*"), dir)
}

/// Whether a write to `path` would plant what a shell of the user runs.
pub fn startup_file(path: &Path, home: Option<&Path>) -> bool {
    homes_of(path, home).iter().any(|h| {
        STARTUP_FILES
            .iter()
            .any(|entry| lies_in(path, &h.join(entry)) || lies_in(&h.join(entry), path))
    })
}
