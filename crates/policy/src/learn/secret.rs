//! The secret places `check` knows, asked of one path a command touched:
//! the host's key and credential files (`HOST_SECRET_PLACES`), the
//! credential stores of a home (`CREDENTIAL_PATHS`, in the learner's home,
//! `/root` and every `/home/NAME`), and container runtime, SSH and GPG
//! names (SBX005's and SBX006's). A path in one is wanted, never granted.

use std::path::{Component, Path, PathBuf};

use crate::check::rules::filesystem::{CONTAINER_NEEDLES, SSH_GPG_NEEDLES};
use crate::check::rules::secrets::{HOST_SECRET_PLACES, component_matches};
use crate::workspace_risk::{CREDENTIAL_PATHS, HOME_TOKEN_PATHS, STARTUP_FILES};

/// Credential stores and tokens of a home: `check`'s SBX042 lists.
fn home_secrets() -> impl Iterator<Item = &'static str> {
    CREDENTIAL_PATHS
        .iter()
        .chain(HOME_TOKEN_PATHS.iter())
        .copied()
}

/// Places in the learner's home never written from a claim: what runs
/// later (tool and shell configuration, toolchains, autostart), beside
/// `STARTUP_FILES`.
pub const NEVER_WRITTEN: [&str; 19] = [
    ".config",
    ".local",
    ".cargo",
    ".rustup",
    ".nvm",
    ".bash_logout",
    ".zlogin",
    ".zlogout",
    ".zshrc.d",
    ".bashrc.d",
    ".profile.d",
    ".xprofile",
    ".xsessionrc",
    ".xinitrc",
    ".pam_environment",
    ".gitconfig",
    ".ssh",
    ".npmrc",
    ".pythonrc",
];

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

/// Every home known: the learner's, root's, and those of the passwd
/// database (`set_homes`).
static HOMES: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// Tells the secret places every account's home (from the passwd
/// database), so a home outside /home (`/srv/svc`, `/var/lib/jenkins`) is
/// judged as one. Only the first call counts.
pub fn set_homes(homes: Vec<PathBuf>) {
    let _ = HOMES.set(homes);
}

/// The homes of every account (`set_homes`), `/root` included.
pub fn all_homes(home: Option<&Path>) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = home.into_iter().map(Path::to_path_buf).collect();
    homes.push(PathBuf::from("/root"));
    homes.extend(
        HOMES
            .get()
            .into_iter()
            .flatten()
            .filter(|h| h.components().count() >= 2)
            .cloned(),
    );
    homes
}

/// The homes a path may lie in: every account's, and `/home/NAME`
/// when the path is below one.
fn homes_of(path: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let mut homes = all_homes(home);
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
        if let Some(entry) = home_secrets().find(|entry| lies_in(path, &home.join(entry))) {
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
    let creds = all_homes(home)
        .iter()
        .any(|h| lies_in(h, dir) || home_secrets().any(|entry| lies_in(&h.join(entry), dir)));
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

/// Whether `path` is a place in a home never written from a claim
/// (tool configuration, toolchains, autostart: what runs later).
pub fn never_written(path: &Path, home: Option<&Path>) -> bool {
    startup_file(path, home)
        || homes_of(path, home).iter().any(|h| {
            NEVER_WRITTEN
                .iter()
                .any(|entry| lies_in(path, &h.join(entry)))
        })
}

/// The home `path` lies in (any account's), if any.
pub fn home_holding(path: &Path, home: Option<&Path>) -> Option<PathBuf> {
    homes_of(path, home)
        .into_iter()
        .find(|h| path.starts_with(h))
}

/// Known-safe configuration and toolchain places of a home, granted
/// read-only (relative to the home); anything else in a home is wanted,
/// not granted.
pub const HOME_ALLOWED: [&str; 14] = [
    ".gitconfig",
    ".config/git/config",
    ".config/git/ignore",
    ".gitignore_global",
    ".cargo/registry",
    ".cargo/git",
    ".cargo/bin",
    ".cargo/config.toml",
    ".rustup/toolchains",
    ".rustup/settings.toml",
    ".npm/_cacache",
    ".cache",
    ".local/lib",
    ".nvm/versions",
];

/// Whether `path` in a home is known-safe to grant (`HOME_ALLOWED`).
pub fn home_allowed(path: &Path, home: &Path) -> bool {
    HOME_ALLOWED
        .iter()
        .any(|entry| lies_in(path, &home.join(entry)))
}
