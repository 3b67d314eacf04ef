//! The agent's own git directory.
//!
//! Host git trusts everything in a repository's git dir: its config
//! (`core.fsmonitor`, `core.hooksPath`, `core.sshCommand`, filter drivers,
//! `include.path`), hooks, `commondir`, `worktrees/`, `modules/`,
//! `objects/info/alternates`. A program named there runs as whoever next
//! runs git in the workspace. Protecting a list of names inside `.git`
//! misses the next name git learns to read, so the sandboxed command never
//! sees the host's git dir at all:
//!
//! - inside, the workspace's `.git` is a git dir of the agent's own, kept
//!   outside the workspace (`<git state>/repo`), which starts as a copy of
//!   the host's HEAD, refs and index and reads the host's objects through
//!   `objects/info/alternates` (bound read-only, never written);
//! - a workspace whose `.git` is a file (a worktree, a submodule) gets a
//!   gitfile of ours pointing at the agent's git dir;
//! - the host's git dir is left as it was; the person takes the agent's
//!   commits with `git fetch <git state>/repo BRANCH`, which runs nothing
//!   the agent wrote (upload-pack ignores hook settings in a repository's
//!   own config).
//!
//! Between runs the agent's alternates name the host's objects directory
//! (so that fetch works on the host); during a run, the path where they are
//! bound inside. Both writes go through descriptors opened without
//! following symlinks: the agent's git dir is the agent's to change.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::gitfiles::{copy_regular, io, repository_format};
use crate::plan::{Access, AgentBind};

pub use crate::gitfiles::{
    GitDirError, HeadTarget, HostRepo, find_host_repo, loose_ref, minimal_config, packed_ref,
    parse_gitfile, parse_head,
};

/// Where the agent's git dir is bound when the workspace's `.git` is a file.
pub const GIT_DIR_INSIDE: &str = "/run/substrat/git";
/// Where the host repository's objects are bound, read-only.
pub const HOST_OBJECTS_INSIDE: &str = "/run/substrat/host-objects";

/// The binds that give the command the agent's git dir (`state` holds it
/// as `repo`, and the gitfile of ours as `gitfile`): a pure function.
pub fn binds(workspace: &Path, host: &HostRepo, state: &Path) -> Vec<AgentBind> {
    let repo = state.join("repo");
    let bind = |source: PathBuf, target: PathBuf, access| AgentBind {
        source,
        target,
        access,
    };
    let mut out = Vec::new();
    match host {
        HostRepo::None | HostRepo::Dir { .. } => {
            out.push(bind(repo, workspace.join(".git"), Access::Rw));
        }
        HostRepo::File { .. } => {
            out.push(bind(
                state.join("gitfile"),
                workspace.join(".git"),
                Access::Ro,
            ));
            out.push(bind(repo, GIT_DIR_INSIDE.into(), Access::Rw));
        }
    }
    if let Some((git_dir, common_dir)) = host.dirs() {
        out.push(bind(
            common_dir.join("objects"),
            HOST_OBJECTS_INSIDE.into(),
            Access::Ro,
        ));
        // A git dir inside the workspace but not at its `.git` (a gitfile
        // naming `sub/.gitdir`) would be writable through the workspace.
        let mut dirs = vec![git_dir];
        if common_dir != git_dir {
            dirs.push(common_dir);
        }
        for dir in dirs {
            if dir.starts_with(workspace) && dir != workspace.join(".git") {
                out.push(bind(dir.to_path_buf(), dir.to_path_buf(), Access::Ro));
            }
        }
    }
    out
}

/// The agent's git state for one launch: its binds, and what to restore
/// when the command has ended.
/// Dropped without `after_run`, it restores the alternates all the same
/// (an error path between prepare and launch), silently.
#[derive(Debug)]
pub struct AgentGit {
    pub state: PathBuf,
    pub host: HostRepo,
    pub binds: Vec<AgentBind>,
    restored: bool,
    /// Held shared for the launch: see `lock_state`.
    users: nix::fcntl::Flock<fs::File>,
}

/// Makes `state` (and the agent's git dir in it, the first time: a copy of
/// the host's HEAD, refs and index over the host's objects) and points the
/// alternates at the objects' place inside.
pub fn prepare(workspace: &Path, state: &Path) -> Result<AgentGit, GitDirError> {
    let host = find_host_repo(workspace)?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)
        .map_err(io("create", state))?;
    let _mutex = lock_state(state, "lock", nix::fcntl::FlockArg::LockExclusive)?;
    let users = lock_state(state, "users", nix::fcntl::FlockArg::LockShared)?;
    let repo = state.join("repo");
    match fs::symlink_metadata(&repo) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(GitDirError::Symlink { path: repo }),
        Err(_) => init_repo(&repo, &host)?,
    }
    if let HostRepo::File { .. } = host {
        let gitfile = state.join("gitfile");
        fs::write(&gitfile, format!("gitdir: {GIT_DIR_INSIDE}\n"))
            .map_err(io("write", &gitfile))?;
    }
    if host.dirs().is_some() {
        write_alternates(&repo, Path::new(HOST_OBJECTS_INSIDE))?;
    }
    let binds = binds(workspace, &host, state);
    Ok(AgentGit {
        state: state.to_path_buf(),
        host,
        binds,
        restored: false,
        users,
    })
}

/// Opens and locks `state/NAME` (`how`): `lock` is the mutex of prepare
/// and after-run (short, exclusive); `users` is held shared by every launch
/// for its whole run, so launches on one git state run side by side and
/// the last to end knows it is (`after_run`).
fn lock_state(
    state: &Path,
    name: &str,
    how: nix::fcntl::FlockArg,
) -> Result<nix::fcntl::Flock<fs::File>, GitDirError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = state.join(name);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io("open", &path))?;
    nix::fcntl::Flock::lock(file, how).map_err(|(_, e)| io("lock", &path)(e.into()))
}

impl AgentGit {
    /// After the run, by the last launch on this git state to end (the
    /// others leave the repository as the running ones need it): the agent
    /// repository is made plain and its alternates name the host's objects
    /// again, so a person can fetch from it.
    pub fn after_run(&mut self) -> Result<(), GitDirError> {
        self.restored = true;
        let _mutex = lock_state(&self.state, "lock", nix::fcntl::FlockArg::LockExclusive)?;
        let last = self
            .users
            .relock(nix::fcntl::FlockArg::LockExclusiveNonblock)
            .is_ok();
        if !last {
            return Ok(());
        }
        make_plain(&self.state.join("repo"))?;
        match self.host.dirs() {
            Some((_, common_dir)) => {
                write_alternates(&self.state.join("repo"), &common_dir.join("objects"))
            }
            None => Ok(()),
        }
    }
}

impl Drop for AgentGit {
    fn drop(&mut self) {
        if !self.restored {
            let _ = self.after_run();
        }
    }
}

/// A new agent git dir. With a host repository: its format, HEAD, refs,
/// packed refs, shallow list and index, and the host's objects as
/// alternates; without one, an empty directory the agent may `git init`.
fn init_repo(repo: &Path, host: &HostRepo) -> Result<(), GitDirError> {
    let mkdir = |dir: &Path| {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("create", dir))
    };
    let Some((git_dir, common_dir)) = host.dirs() else {
        return mkdir(repo);
    };
    let format = repository_format(common_dir)?;
    // Built beside, then renamed: a half-made repo is never left in place.
    let building = repo.with_extension("new");
    let _ = fs::remove_dir_all(&building);
    for dir in ["objects/info", "objects/pack", "refs/heads", "refs/tags"] {
        mkdir(&building.join(dir))?;
    }
    let copy = |from: &Path, to: &str| match fs::symlink_metadata(from) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        _ => copy_regular(from, &building.join(to)),
    };
    copy(&git_dir.join("HEAD"), "HEAD")?;
    copy(&git_dir.join("index"), "index")?;
    copy(&common_dir.join("packed-refs"), "packed-refs")?;
    copy(&common_dir.join("shallow"), "shallow")?;
    for kind in ["heads", "tags"] {
        copy_tree(
            &common_dir.join("refs").join(kind),
            &building.join("refs").join(kind),
        )?;
    }
    let config = building.join("config");
    fs::write(&config, format).map_err(io("write", &config))?;
    fs::rename(&building, repo).map_err(io("rename into place", repo))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), GitDirError> {
    // A directory that is a link (to ~/.ssh, say) is not followed.
    match fs::symlink_metadata(from) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("stat", from)(e)),
    }
    let entries = match fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("read", from)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io("read", from))?;
        let kind = entry.file_type().map_err(io("stat", &entry.path()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            fs::create_dir_all(&target).map_err(io("create", &target))?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            copy_regular(&entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Writes `objects/info/alternates` in the agent's git dir (see
/// `write_beneath`).
fn write_alternates(repo: &Path, objects: &Path) -> Result<(), GitDirError> {
    let text = format!("{}\n", objects.display());
    write_beneath(repo, Path::new("objects/info"), "alternates", &text)
}

/// Replaces `dir/name` below `repo`, the agent's git dir, which the agent
/// may have filled with symlinks and FIFOs: the directory is opened beneath
/// `repo` without following any link, the new content goes into a fresh
/// file (O_EXCL: never an existing FIFO or link), renamed over the old.
fn write_beneath(repo: &Path, dir: &Path, name: &str, text: &str) -> Result<(), GitDirError> {
    let path = repo.join(dir).join(name);
    let fail = |e: nix::errno::Errno| io("write", &path)(e.into());
    let root: OwnedFd = nix::fcntl::open(
        repo,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail)?;
    let dir_fd = if dir.as_os_str().is_empty() {
        root
    } else {
        crate::mounts::open_beneath(&root, dir, OFlag::O_DIRECTORY).map_err(fail)?
    };
    let temp = format!("{name}.substrat-new");
    let _ = nix::unistd::unlinkat(
        dir_fd.as_fd(),
        temp.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    let file = nix::fcntl::openat(
        dir_fd.as_fd(),
        temp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(fail)?;
    fs::File::from(file)
        .write_all(text.as_bytes())
        .map_err(io("write", &path))?;
    nix::fcntl::renameat(dir_fd.as_fd(), temp.as_str(), dir_fd.as_fd(), name).map_err(fail)
}

/// After a run: the agent's git dir is left as a plain repository that a
/// `git fetch` from it reads only objects and refs of. Its config is
/// replaced by a minimal one (the object and ref formats kept: a partial
/// clone's promisor remote would have a fetch run a lazy fetch with the
/// agent's settings), and what would redirect git elsewhere is renamed
/// aside: `.git` (tried before the repository itself), `commondir`,
/// `config.worktree`.
fn make_plain(repo: &Path) -> Result<(), GitDirError> {
    let config = crate::gitfiles::read_small(&repo.join("config")).unwrap_or_default();
    if config.is_empty() && fs::symlink_metadata(repo.join("HEAD")).is_err() {
        return Ok(()); // not a repository (yet): nothing to fetch from
    }
    write_beneath(
        repo,
        Path::new(""),
        "config",
        &crate::gitfiles::minimal_config(&config),
    )?;
    let root: OwnedFd = nix::fcntl::open(
        repo,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open", repo)(e.into()))?;
    for name in [".git", "commondir", "config.worktree"] {
        let present =
            nix::sys::stat::fstatat(root.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok();
        if present {
            crate::gitscan::rename_aside(&root, std::ffi::OsStr::new(name))
                .map_err(io("rename aside", &repo.join(name)))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_as_a_whole() {
        let ws = Path::new("/ws");
        let state = Path::new("/state/git");
        let rw = |s: &str, t: &str| AgentBind {
            source: s.into(),
            target: t.into(),
            access: Access::Rw,
        };
        let ro = |s: &str, t: &str| AgentBind {
            source: s.into(),
            target: t.into(),
            access: Access::Ro,
        };
        assert_eq!(
            binds(ws, &HostRepo::None, state),
            vec![rw("/state/git/repo", "/ws/.git")]
        );
        let dir = HostRepo::Dir {
            git_dir: "/ws/.git".into(),
            common_dir: "/ws/.git".into(),
        };
        assert_eq!(
            binds(ws, &dir, state),
            vec![
                rw("/state/git/repo", "/ws/.git"),
                ro("/ws/.git/objects", HOST_OBJECTS_INSIDE),
            ]
        );
        // A worktree: our gitfile over the host's, the agent's git dir at a
        // fixed place, the objects of the main repository.
        let worktree = HostRepo::File {
            git_dir: "/main/.git/worktrees/ws".into(),
            common_dir: "/main/.git".into(),
        };
        assert_eq!(
            binds(ws, &worktree, state),
            vec![
                ro("/state/git/gitfile", "/ws/.git"),
                rw("/state/git/repo", GIT_DIR_INSIDE),
                ro("/main/.git/objects", HOST_OBJECTS_INSIDE),
            ]
        );
        // A git dir kept inside the workspace is read-only there.
        let inside = HostRepo::File {
            git_dir: "/ws/sub/.gitdir".into(),
            common_dir: "/ws/sub/.gitdir".into(),
        };
        assert_eq!(
            binds(ws, &inside, state),
            vec![
                ro("/state/git/gitfile", "/ws/.git"),
                rw("/state/git/repo", GIT_DIR_INSIDE),
                ro("/ws/sub/.gitdir/objects", HOST_OBJECTS_INSIDE),
                ro("/ws/sub/.gitdir", "/ws/sub/.gitdir"),
            ]
        );
    }
}
