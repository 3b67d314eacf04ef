//! The files a turn needs outside the sandbox: the agent's chats
//! directory and its mcp.json in the daemon's state directory, and the
//! mount point in the workspace that the read-only mcp.json bind covers.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use serde_json::json;

use super::{RELAY_INSIDE, SOCKET_INSIDE, TurnError};
use crate::broker::Broker;

pub(super) struct AgentFiles {
    pub(super) chats: PathBuf,
    pub(super) mcp_json: PathBuf,
}

/// The agent's chats directory and its mcp.json (regenerated every turn),
/// both in the daemon's state directory; and the file in the workspace
/// that the read-only mcp.json bind covers.
pub(super) fn prepare_files(
    broker: &Broker,
    agent: &crate::store::Agent,
    workspace: &Path,
) -> Result<AgentFiles, TurnError> {
    let dir = broker.state_dir().join("agents").join(&agent.id);
    let chats = dir.join("chats");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&chats)
        .map_err(|source| TurnError::File {
            action: "create",
            path: chats.clone(),
            source,
        })?;
    let mcp_json = dir.join("mcp.json");
    let config = mcp_config(&agent.id);
    write_private(&mcp_json, config.as_bytes()).map_err(|source| TurnError::File {
        action: "write",
        path: mcp_json.clone(),
        source,
    })?;
    mount_point_in_workspace(workspace)?;
    Ok(AgentFiles { chats, mcp_json })
}

/// The mcp.json of seed 002: the broker's relay is the only server.
pub fn mcp_config(agent_id: &str) -> String {
    let config = json!({"mcpServers": {"substrat": {
        "command": RELAY_INSIDE,
        "args": ["--agent-id", agent_id],
        "env": {"SUBSTRAT_SOCKET": SOCKET_INSIDE},
    }}});
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    std::fs::rename(&tmp, path)
}

/// `W/.cursor/mcp.json` must exist for the bind to cover it. Created
/// without following symlinks anywhere on the path (a parent agent can
/// write above a child's workspace and swap a directory for a link), and
/// opened without blocking (a FIFO planted there must not hang the daemon);
/// anything but a regular file is refused.
fn mount_point_in_workspace(workspace: &Path) -> Result<(), TurnError> {
    let path = workspace.join(".cursor/mcp.json");
    let fail = |action: &'static str, errno: nix::Error| TurnError::MountPoint {
        path: path.clone(),
        action,
        errno,
    };
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let how = nix::fcntl::OpenHow::new()
        .flags(dir_flags)
        .resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS);
    let ws = nix::fcntl::openat2(nix::fcntl::AT_FDCWD, workspace, how)
        .map_err(|e| fail("open workspace", e))?;
    let cursor = match openat(&ws, ".cursor", dir_flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => {
            mkdirat(&ws, ".cursor", Mode::from_bits_truncate(0o755))
                .map_err(|e| fail("mkdir .cursor", e))?;
            openat(&ws, ".cursor", dir_flags, Mode::empty()).map_err(|e| fail("open .cursor", e))?
        }
        Err(e) => return Err(fail("open .cursor", e)),
    };
    let file = openat(
        &cursor,
        "mcp.json",
        OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| fail("create", e))?;
    let st = nix::sys::stat::fstat(&file).map_err(|e| fail("stat", e))?;
    let kind =
        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
    if kind != nix::sys::stat::SFlag::S_IFREG {
        return Err(TurnError::NotRegular(path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_json_names_only_the_relay() {
        let config: serde_json::Value = serde_json::from_str(&mcp_config("a1")).unwrap();
        assert_eq!(
            config,
            json!({"mcpServers": {"substrat": {"command": "/run/substrat/substrat-mcp-server",
                "args": ["--agent-id", "a1"], "env": {"SUBSTRAT_SOCKET": "/run/substrat/broker.sock"}}}})
        );
    }

    #[test]
    fn a_planted_symlink_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join(".cursor")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.path().join(".cursor/mcp.json")).unwrap();
        let err = mount_point_in_workspace(ws.path()).unwrap_err();
        assert!(
            matches!(
                err,
                TurnError::MountPoint {
                    errno: nix::Error::ELOOP,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("a symlink; refusing"), "{err}");
        let ws2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", ws2.path().join(".cursor")).unwrap();
        assert!(mount_point_in_workspace(ws2.path()).is_err());
        let ws3 = tempfile::tempdir().unwrap();
        mount_point_in_workspace(ws3.path()).unwrap();
        assert!(ws3.path().join(".cursor/mcp.json").is_file());
        // A FIFO does not hang the daemon, and is refused.
        let ws4 = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws4.path().join(".cursor")).unwrap();
        nix::unistd::mkfifo(
            &ws4.path().join(".cursor/mcp.json"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let err = mount_point_in_workspace(ws4.path()).unwrap_err();
        assert!(
            matches!(
                err,
                TurnError::MountPoint {
                    errno: nix::Error::ENXIO,
                    ..
                } | TurnError::NotRegular(_)
            ),
            "{err:?}"
        );
        // A directory above the workspace swapped for a link: refused.
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("child")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("a")).unwrap();
        assert!(mount_point_in_workspace(&root.path().join("a/child")).is_err());
        assert!(
            !outside.path().join("child/.cursor").exists(),
            "nothing made outside"
        );
    }
}
