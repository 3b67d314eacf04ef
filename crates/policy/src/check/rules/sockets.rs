//! Host Unix sockets a bind puts in the view (SBX047-049). Landlock before
//! ABI 9 has no right for connect(2) to a pathname socket: a socket in the
//! view is reachable whatever the rules say. Judged on each bind's source
//! as `check` resolved it on this host (a link to a socket is a socket),
//! with the bounded scan the launchers use (`crate::sockets`).

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::Emit;
use super::filesystem::bind_key;
use crate::load::LoadedPolicy;
use crate::sockets::{SCAN_DEPTH, SCAN_ENTRIES, unix_sockets_at};

/// The Landlock ABI that has the right for connecting to a pathname socket.
pub const LANDLOCK_UNIX_CONNECT_ABI: u32 = 9;

/// Well-known services by their socket's file name.
const SERVICES: &[(&str, &str)] = &[
    ("docker.sock", "the Docker engine (root on the host)"),
    ("podman.sock", "Podman"),
    ("containerd.sock", "containerd (root on the host)"),
    ("system_bus_socket", "the system D-Bus"),
];

fn service(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match SERVICES.iter().find(|(file, _)| *file == name) {
        Some((_, what)) => format!("{what} at `{}`", path.display()),
        None => format!("the service at `{}`", path.display()),
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// SBX047 (high): a bind's source is a socket the policy does not mark;
/// the launch refuses it.
pub(super) fn socket_bind_unmarked(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in p.policy.filesystem.binds.iter().enumerate() {
        let Some(resolved) = e.resolved(i).map(Path::to_path_buf) else {
            continue;
        };
        if b.socket || !is_socket(&resolved) {
            continue;
        }
        e.at(
            &bind_key(i),
            format!(
                "bind source `{}` is a Unix socket and the bind is not marked `socket = true`: \
                 the launch refuses it (it would reach {})",
                b.source,
                service(&resolved)
            ),
        );
    }
}

/// SBX048 (low): a bind marked `socket = true`: the command can connect
/// to the service behind it (the sockets found in it, for a directory).
pub(super) fn socket_bind_reachable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in p.policy.filesystem.binds.iter().enumerate() {
        if !b.socket {
            continue;
        }
        let resolved = e.resolved(i).map(Path::to_path_buf);
        let services: Vec<String> = match &resolved {
            Some(r) => unix_sockets_at(r)
                .sockets
                .iter()
                .map(|s| service(s))
                .collect(),
            None => Vec::new(),
        };
        let what = if services.is_empty() {
            format!("the service at `{}`", b.source)
        } else {
            services.join(", ")
        };
        e.at(
            &bind_key(i),
            format!("reachable: the command can connect to {what}"),
        );
    }
}

/// SBX049 (medium): a directory bind, not marked, holds sockets, which
/// Landlock cannot keep the command from connecting to before ABI 9.
pub(super) fn bind_holds_sockets(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let abi = e.landlock_abi();
    if abi.is_some_and(|abi| abi >= LANDLOCK_UNIX_CONNECT_ABI) {
        return;
    }
    let kernel = match abi {
        Some(abi) => format!("on this kernel (Landlock ABI {abi})"),
        None => format!("before Landlock ABI {LANDLOCK_UNIX_CONNECT_ABI}"),
    };
    for (i, b) in p.policy.filesystem.binds.iter().enumerate() {
        let Some(resolved) = e.resolved(i).map(Path::to_path_buf) else {
            continue;
        };
        if b.socket || is_socket(&resolved) {
            continue;
        }
        let scan = unix_sockets_at(&resolved);
        if scan.sockets.is_empty() {
            continue;
        }
        let names: Vec<String> = scan
            .sockets
            .iter()
            .map(|s| format!("`{}`", s.display()))
            .collect();
        let cut = if scan.cut {
            format!(
                " (the scan stopped at {SCAN_DEPTH} levels or {SCAN_ENTRIES} entries: there may be more)"
            )
        } else {
            String::new()
        };
        e.at(
            &bind_key(i),
            format!(
                "bind source `{}` holds Unix sockets: {}{cut}; Landlock cannot stop a connect {kernel}",
                b.source,
                names.join(", ")
            ),
        );
    }
}
