//! The daemon's Unix sockets: bound readable and writable by the owner
//! only, an agent's in a directory of its own.
//!
//! An agent's socket is bound when the agent is made, before anyone is
//! told it exists: a client that connects right after `agent create`, or
//! the agent's first turn started by the scheduler, finds it listening
//! (connections wait in the backlog until the daemon accepts them).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Binds a Unix socket at `path` (replacing a stale one) with mode 0600.
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    // Between bind and this chmod the socket has the umask's mode; the
    // directories above it (0700) keep others out of that window.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Binds an agent's socket, making its directory (0700) first.
pub fn bind_agent_socket(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    bind_private(path)
}
