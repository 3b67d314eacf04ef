//! The files a turn needs outside the sandbox, in the daemon's state
//! directory: the agent's home (its CLI's sessions and state, bound
//! read-write), its chats directory, and the provider's configuration
//! files (regenerated every turn, bound read-only); and the mount points
//! those binds cover in the workspace or the home.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use substrat_provider::ConfigFile;

use super::TurnError;
use crate::broker::Broker;

pub(super) struct AgentFiles {
    /// The agent's home on the host (bound at the sandbox's HOME).
    pub(super) home: PathBuf,
    pub(super) chats: PathBuf,
    /// Each configuration file: where it is on the host, where inside.
    pub(super) configs: Vec<(PathBuf, PathBuf)>,
}

/// Where the turn's paths are inside the sandbox.
pub(super) struct Inside<'a> {
    pub(super) workspace: &'a Path,
    pub(super) home: &'a Path,
}

fn made_dir(path: &Path) -> Result<(), TurnError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| TurnError::File {
            action: "create",
            path: path.to_path_buf(),
            source,
        })
}

pub(super) fn prepare_files(
    broker: &Broker,
    agent: &crate::store::Agent,
    inside: &Inside<'_>,
    configs: Vec<ConfigFile>,
) -> Result<AgentFiles, TurnError> {
    let dir = broker.state_dir().join("agents").join(&agent.id);
    let (home, chats, config_dir) = (dir.join("home"), dir.join("chats"), dir.join("config"));
    for path in [&home, &chats, &config_dir] {
        made_dir(path)?;
    }
    let mut bound = Vec::new();
    for (index, file) in configs.into_iter().enumerate() {
        let name = file
            .inside
            .file_name()
            .map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
        let host = config_dir.join(format!("{index}-{name}"));
        write_private(&host, file.contents.as_bytes()).map_err(|source| TurnError::File {
            action: "write",
            path: host.clone(),
            source,
        })?;
        // A file in the workspace or the home needs a mount point there;
        // one under /run/substrat is made by the launcher's plan.
        if let Ok(relative) = file.inside.strip_prefix(inside.workspace) {
            mount_point_in(inside.workspace, "workspace", relative)?;
        } else if let Ok(relative) = file.inside.strip_prefix(inside.home) {
            mount_point_in(&home, "home", relative)?;
        }
        bound.push((host, file.inside));
    }
    Ok(AgentFiles {
        home,
        chats,
        configs: bound,
    })
}

/// Written in place (the same inode): a warm sandbox binds this file at
/// its start, and sees each turn's new contents through that bind (a
/// renamed-over file would leave it the old one). No turn of the agent
/// runs while its files are written (one turn per agent at a time); the
/// directory is the daemon's, never bound writable into a sandbox, and a
/// link there is refused all the same.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    file.write_all(bytes)
}

/// `base/relative` must exist for a bind to cover it. Created without
/// following symlinks anywhere on the path (an agent writes its workspace
/// and its home between turns, and a parent agent can write above a
/// child's workspace, so a directory may have been swapped for a link),
/// and opened without blocking (a FIFO planted there must not hang the
/// daemon); anything but a regular file is refused.
fn mount_point_in(base: &Path, base_name: &str, relative: &Path) -> Result<(), TurnError> {
    let path = base.join(relative);
    let fail = |action: &str, errno: nix::Error| TurnError::MountPoint {
        path: path.clone(),
        action: action.to_string(),
        errno,
    };
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .map(|c| match c {
            Component::Normal(part) => Ok(part),
            _ => Err(fail("resolve", nix::Error::EINVAL)),
        })
        .collect::<Result<_, _>>()?;
    let Some((file, dirs)) = parts.split_last() else {
        return Err(fail("resolve", nix::Error::EINVAL));
    };
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let how = nix::fcntl::OpenHow::new()
        .flags(dir_flags)
        .resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS);
    let mut dir = nix::fcntl::openat2(nix::fcntl::AT_FDCWD, base, how)
        .map_err(|e| fail(&format!("open {base_name}"), e))?;
    for part in dirs {
        dir = match openat(&dir, *part, dir_flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => {
                // Made meanwhile by another launch on this workspace (the
                // pool builds beside an agent's turn): fine, it is opened
                // as any other, never through a link.
                match mkdirat(&dir, *part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(nix::Error::EEXIST) => {}
                    Err(e) => return Err(fail("mkdir", e)),
                }
                openat(&dir, *part, dir_flags, Mode::empty()).map_err(|e| fail("open", e))?
            }
            Err(e) => return Err(fail("open", e)),
        };
    }
    let made = openat(
        &dir,
        *file,
        OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| fail("create", e))?;
    let st = nix::sys::stat::fstat(&made).map_err(|e| fail("stat", e))?;
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

    fn mcp_json(ws: &Path) -> Result<(), TurnError> {
        mount_point_in(ws, "workspace", Path::new(".cursor/mcp.json"))
    }

    /// Two launches on one workspace at once (an agent's turn and the warm
    /// pool's build beside it) both get the mount point: the one that
    /// finds the directory made meanwhile goes on.
    #[test]
    fn launches_making_one_mount_point_at_once_all_get_it() {
        for _ in 0..50 {
            let ws = tempfile::tempdir().unwrap();
            let start = std::sync::Barrier::new(4);
            std::thread::scope(|scope| {
                let racers: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            mount_point_in(ws.path(), "workspace", Path::new("a/b/c/mcp.json"))
                        })
                    })
                    .collect();
                for racer in racers {
                    let made = racer.join().unwrap();
                    assert!(made.is_ok(), "{made:?}");
                }
            });
            assert!(ws.path().join("a/b/c/mcp.json").is_file());
        }
    }

    #[test]
    fn a_planted_symlink_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join(".cursor")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.path().join(".cursor/mcp.json")).unwrap();
        let err = mcp_json(ws.path()).unwrap_err();
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
        assert!(mcp_json(ws2.path()).is_err());
        let ws3 = tempfile::tempdir().unwrap();
        mcp_json(ws3.path()).unwrap();
        assert!(ws3.path().join(".cursor/mcp.json").is_file());
        // Deeper paths, as in an agent's home (`.codex/config.toml`).
        mount_point_in(ws3.path(), "home", Path::new("a/b/c.toml")).unwrap();
        assert!(ws3.path().join("a/b/c.toml").is_file());
        assert!(mount_point_in(ws3.path(), "home", Path::new("../x")).is_err());
        // A FIFO does not hang the daemon, and is refused.
        let ws4 = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws4.path().join(".cursor")).unwrap();
        nix::unistd::mkfifo(
            &ws4.path().join(".cursor/mcp.json"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let err = mcp_json(ws4.path()).unwrap_err();
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
        assert!(mcp_json(&root.path().join("a/child")).is_err());
        assert!(
            !outside.path().join("child/.cursor").exists(),
            "nothing made outside"
        );
    }
}
