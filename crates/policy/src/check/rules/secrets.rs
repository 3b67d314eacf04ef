//! The host's own secrets beside homes and service sockets: credential and
//! key files and directories of the system, of clusters and of container
//! engines, and who may become root. One table, each place with the rule
//! (and so the severity) its exposure is a finding of. A bind exposes a
//! place when its source is the place, lies in it or holds it (`/`, `/etc`
//! hold `/etc/shadow`); judged on the source as written and, where `check`
//! resolved it on this host, on the resolved path against the place's
//! resolved path (`/var/run/secrets` is `/run/secrets` on Debian).

use std::path::{Component, Path, PathBuf};

use super::Emit;
use super::filesystem::{bind_key, binds};
use crate::load::LoadedPolicy;

/// A secret place of the host: a path (a `*` in one component matches any
/// text there) and what it holds.
#[derive(Debug)]
pub(crate) struct SecretPlace {
    pub(crate) path: &'static str,
    pub(crate) holds: &'static str,
    /// The rule whose finding an exposure is.
    pub(crate) rule: &'static str,
}

const fn place(path: &'static str, holds: &'static str, rule: &'static str) -> SecretPlace {
    SecretPlace { path, holds, rule }
}

/// SBX044 (critical): password hashes and private keys of the host.
/// SBX045 (high): cloud, cluster and container credentials of the host.
/// SBX046 (medium): who may become root. Home credentials (`/root/.aws`,
/// `/root/.docker/config.json`...) are SBX042's, SSH and GPG SBX006's,
/// container runtime sockets and `/etc/containerd` SBX005's.
pub(crate) const HOST_SECRET_PLACES: &[SecretPlace] = &[
    place("/etc/shadow", "password hashes", "SBX044"),
    place("/etc/shadow-", "password hashes (backup)", "SBX044"),
    place("/etc/gshadow", "group password hashes", "SBX044"),
    place("/etc/gshadow-", "group password hashes (backup)", "SBX044"),
    place("/etc/security/opasswd", "old password hashes", "SBX044"),
    place("/etc/ssh/ssh_host_*_key", "SSH host private keys", "SBX044"),
    place("/etc/krb5.keytab", "the host's Kerberos keys", "SBX044"),
    place("/etc/ssl/private", "TLS private keys", "SBX044"),
    place("/etc/pki/tls/private", "TLS private keys", "SBX044"),
    place(
        "/etc/letsencrypt",
        "TLS private keys (Let's Encrypt)",
        "SBX044",
    ),
    place("/etc/wireguard", "WireGuard private keys", "SBX044"),
    place(
        "/etc/NetworkManager/system-connections",
        "Wi-Fi and VPN passwords and keys",
        "SBX044",
    ),
    place("/var/backups", "backups of the password hashes", "SBX044"),
    place(
        "/var/lib/sss/db",
        "cached domain credentials (sssd)",
        "SBX044",
    ),
    place(
        "/etc/kubernetes",
        "cluster admin credentials and CA keys",
        "SBX045",
    ),
    place("/var/lib/kubelet/pki", "kubelet client keys", "SBX045"),
    place(
        "/var/lib/kubelet/kubeconfig",
        "kubelet credentials",
        "SBX045",
    ),
    place("/etc/rancher", "k3s/rke2 credentials", "SBX045"),
    place(
        "/var/lib/rancher/k3s/server",
        "k3s server token and keys",
        "SBX045",
    ),
    place(
        "/run/secrets",
        "container and service account secrets",
        "SBX045",
    ),
    place(
        "/var/run/secrets",
        "container and service account secrets",
        "SBX045",
    ),
    place("/etc/docker", "Docker daemon TLS keys", "SBX045"),
    place(
        "/root/.config/gcloud",
        "root's Google Cloud credentials",
        "SBX045",
    ),
    place("/root/.azure", "root's Azure credentials", "SBX045"),
    place("/etc/sudoers", "who may become root", "SBX046"),
    place("/etc/sudoers.d", "who may become root", "SBX046"),
    place("/etc/doas.conf", "who may become root", "SBX046"),
];

/// One text component matches a place's (`*` once, anywhere in it).
pub(crate) fn component_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

fn parts(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// `source` (absolute, no `.` or `..`) is `place`, lies in it or holds it.
pub(crate) fn exposes(source: &Path, place: &Path) -> bool {
    let (s, p) = (parts(source), parts(place));
    let n = s.len().min(p.len());
    s[..n]
        .iter()
        .zip(&p[..n])
        .all(|(s, p)| component_matches(p, s))
}

/// The place as this host resolves it: its longest existing leading
/// directory canonicalized (the rest, a glob or a missing entry, kept).
pub(crate) fn resolved_place(place: &str) -> Option<PathBuf> {
    let path = Path::new(place);
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.retain(|a| !a.to_string_lossy().contains('*'));
    let existing = ancestors
        .into_iter()
        .find_map(|a| Some((a, a.canonicalize().ok()?)))?;
    let rest = path.strip_prefix(existing.0).ok()?;
    Some(existing.1.join(rest))
}

/// A place on this host as its filesystem knows it (device, path from the
/// filesystem's root): the same directory reached through a bind mount
/// has the same place.
fn fs_place_of(path: &Path) -> Option<(String, PathBuf)> {
    let existing = path
        .ancestors()
        .find(|a| !a.to_string_lossy().contains('*') && std::fs::symlink_metadata(a).is_ok())?;
    let (device, inside) = crate::place::fs_place(&existing.canonicalize().ok()?).ok()??;
    Some((device, inside.join(path.strip_prefix(existing).ok()?)))
}

/// The places of `rule` that the source exposes: as text, resolved, or
/// as places in a filesystem (a bind mount of `/etc` elsewhere exposes
/// `/etc`).
fn exposed_places(source: &Path, rule: &str) -> Vec<&'static SecretPlace> {
    let source_place = fs_place_of(source);
    HOST_SECRET_PLACES
        .iter()
        .filter(|p| p.rule == rule)
        .filter(|p| {
            exposes(source, Path::new(p.path))
                || resolved_place(p.path).is_some_and(|r| exposes(source, &r))
                || source_place.as_ref().is_some_and(|(device, inside)| {
                    fs_place_of(Path::new(p.path))
                        .is_some_and(|(d, place)| d == *device && exposes(inside, &place))
                })
        })
        .collect()
}

fn secret_places(rule: &str, p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p, e) {
        // Variables stay unexpanded in the text; `check` judges their
        // resolved paths too.
        if b.source.as_str().starts_with("${") {
            continue;
        }
        let places = exposed_places(Path::new(b.source.as_str()), rule);
        if places.is_empty() {
            continue;
        }
        let list: Vec<String> = places
            .iter()
            .map(|p| format!("{} ({})", p.path, p.holds))
            .collect();
        e.at(
            &bind_key(i),
            format!(
                "bind source `{}` exposes the host's {}",
                b.source,
                list.join(", ")
            ),
        );
    }
}

pub(super) fn host_secret_keys(p: &LoadedPolicy, e: &mut Emit<'_>) {
    secret_places("SBX044", p, e);
}

pub(super) fn host_service_credentials(p: &LoadedPolicy, e: &mut Emit<'_>) {
    secret_places("SBX045", p, e);
}

pub(super) fn host_privilege_config(p: &LoadedPolicy, e: &mut Emit<'_>) {
    secret_places("SBX046", p, e);
}
