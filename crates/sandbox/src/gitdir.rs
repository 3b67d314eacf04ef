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

use crate::plan::{Access, AgentBind};

/// Where the agent's git dir is bound when the workspace's `.git` is a file.
pub const GIT_DIR_INSIDE: &str = "/run/substrat/git";
/// Where the host repository's objects are bound, read-only.
pub const HOST_OBJECTS_INSIDE: &str = "/run/substrat/host-objects";

#[derive(Debug, thiserror::Error)]
pub enum GitDirError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is a symlink; the sandbox gives the workspace a git directory of its own and will not follow one (remove it)"
    )]
    Symlink { path: PathBuf },
    #[error("{path}: {why}")]
    Unsupported { path: PathBuf, why: String },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> GitDirError + use<> {
    let path = path.to_path_buf();
    move |source| GitDirError::Io { what, path, source }
}

/// What the host has at the workspace's `.git`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRepo {
    /// Nothing, or a directory that is no git dir (an empty mount point).
    None,
    /// `.git` is the git dir.
    Dir {
        git_dir: PathBuf,
        common_dir: PathBuf,
    },
    /// `.git` is a gitfile naming the git dir (worktree, submodule).
    File {
        git_dir: PathBuf,
        common_dir: PathBuf,
    },
}

impl HostRepo {
    fn dirs(&self) -> Option<(&Path, &Path)> {
        match self {
            HostRepo::None => None,
            HostRepo::Dir {
                git_dir,
                common_dir,
            }
            | HostRepo::File {
                git_dir,
                common_dir,
            } => Some((git_dir, common_dir)),
        }
    }
}

/// Reads the workspace's `.git` without following a symlink there.
pub fn find_host_repo(workspace: &Path) -> Result<HostRepo, GitDirError> {
    let dot_git = workspace.join(".git");
    let meta = match fs::symlink_metadata(&dot_git) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HostRepo::None),
        Err(e) => return Err(io("stat", &dot_git)(e)),
    };
    if meta.file_type().is_symlink() {
        return Err(GitDirError::Symlink { path: dot_git });
    }
    if meta.is_dir() {
        if !is_regular_file(&dot_git.join("HEAD")) {
            return Ok(HostRepo::None);
        }
        // A `.git` directory is the repository itself. One naming a common
        // dir elsewhere, or whose objects are a link, would make the
        // launcher bind a host path of its writer's choosing into the
        // sandbox (another agent may have written it).
        if fs::symlink_metadata(dot_git.join("commondir")).is_ok() {
            return Err(GitDirError::Unsupported {
                path: dot_git,
                why: "is a directory naming a common dir (`commondir`); not supported".into(),
            });
        }
        require_real_dir(&dot_git.join("objects"))?;
        return Ok(HostRepo::Dir {
            git_dir: dot_git.clone(),
            common_dir: dot_git,
        });
    }
    if !meta.is_file() {
        return Err(GitDirError::Unsupported {
            path: dot_git,
            why: "is neither a directory nor a gitfile".into(),
        });
    }
    let text = read_small(&dot_git)?;
    let named = parse_gitfile(&text).ok_or_else(|| GitDirError::Unsupported {
        path: dot_git.clone(),
        why: "is a file but not a gitfile (`gitdir: PATH`)".into(),
    })?;
    let git_dir = workspace.join(named);
    let git_dir = git_dir
        .canonicalize()
        .map_err(io("resolve the git dir named by", &dot_git))?;
    names_back(&git_dir, workspace)?;
    let common_dir = common_dir_of(&git_dir)?;
    require_real_dir(&common_dir.join("objects"))?;
    Ok(HostRepo::File {
        git_dir,
        common_dir,
    })
}

/// A gitfile is followed only to a git dir that git made for this
/// workspace and that names it back: a worktree's `gitdir` file, or a
/// submodule's `core.worktree`. Anything else (a gitfile planted by another
/// agent pointing at someone's repository) would have its objects bound
/// into the sandbox.
fn names_back(git_dir: &Path, workspace: &Path) -> Result<(), GitDirError> {
    let same = |path: PathBuf, want: &Path| {
        path.canonicalize()
            .ok()
            .zip(want.canonicalize().ok())
            .is_some_and(|(a, b)| a == b)
    };
    if let Ok(text) = read_small(&git_dir.join("gitdir")) {
        if same(git_dir.join(text.trim()), &workspace.join(".git")) {
            return Ok(());
        }
    } else if let Some(worktree) = config_value(git_dir, "core", "worktree")
        && same(git_dir.join(worktree), workspace)
    {
        return Ok(());
    }
    Err(GitDirError::Unsupported {
        path: workspace.join(".git"),
        why: format!(
            "names the git dir {}, which does not name this workspace back (not a worktree or \
             submodule git made for it); refusing to give the sandbox its objects",
            git_dir.display()
        ),
    })
}

fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

fn require_real_dir(path: &Path) -> Result<(), GitDirError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) if m.file_type().is_symlink() => Err(GitDirError::Symlink {
            path: path.to_path_buf(),
        }),
        Ok(_) => Err(GitDirError::Unsupported {
            path: path.to_path_buf(),
            why: "is not a directory".into(),
        }),
        Err(e) => Err(io("stat", path)(e)),
    }
}

/// A small regular file, not followed if it is a symlink, never a FIFO.
fn read_small(path: &Path) -> Result<String, GitDirError> {
    use std::io::Read;
    let mut text = String::new();
    open_regular(path)?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(io("read", path))?;
    Ok(text)
}

/// Opens `path` for reading only if it is a regular file: a symlink is not
/// followed (O_NOFOLLOW) and a FIFO does not block (O_NONBLOCK, then the
/// type is checked).
fn open_regular(path: &Path) -> Result<fs::File, GitDirError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io("open", path))?;
    let meta = file.metadata().map_err(io("stat", path))?;
    if !meta.is_file() {
        return Err(GitDirError::Unsupported {
            path: path.to_path_buf(),
            why: "is not a regular file".into(),
        });
    }
    Ok(file)
}

/// `section.key` from a git config file in `git_dir` (simple form only:
/// no includes, no subsections).
fn config_value(git_dir: &Path, section: &str, key: &str) -> Option<String> {
    let text = read_small(&git_dir.join("config")).ok()?;
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_ascii_lowercase();
        } else if current == section
            && let Some((k, v)) = line.split_once('=')
            && k.trim().eq_ignore_ascii_case(key)
        {
            return Some(v.trim().to_string());
        }
    }
    None
}

/// The path a gitfile names (`gitdir: PATH`, one line).
pub fn parse_gitfile(text: &str) -> Option<&str> {
    let path = text.strip_prefix("gitdir:")?.trim();
    (!path.is_empty() && !path.contains('\0')).then_some(path)
}

/// A worktree's git dir names the repository's common dir in `commondir`.
fn common_dir_of(git_dir: &Path) -> Result<PathBuf, GitDirError> {
    let file = git_dir.join("commondir");
    match fs::read_to_string(&file) {
        Ok(text) => git_dir
            .join(text.trim())
            .canonicalize()
            .map_err(io("resolve the common dir named by", &file)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(git_dir.to_path_buf()),
        Err(e) => Err(io("read", &file)(e)),
    }
}

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
    })
}

impl AgentGit {
    /// After the run: the alternates name the host's objects again, so a
    /// person can fetch from the agent's git dir.
    pub fn after_run(&mut self) -> Result<(), GitDirError> {
        self.restored = true;
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

/// The agent repo's config: the host's repository format (object format),
/// nothing else of the host's config.
fn repository_format(common_dir: &Path) -> Result<String, GitDirError> {
    let path = common_dir.join("config");
    let text = read_small(&path).unwrap_or_default();
    let mut section = String::new();
    let mut object_format = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_ascii_lowercase();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim().to_string());
        match (section.as_str(), key.as_str()) {
            ("extensions", "objectformat") => object_format = Some(value),
            ("extensions", "refstorage") if value != "files" => {
                return Err(GitDirError::Unsupported {
                    path,
                    why: format!("refs stored as `{value}` are not supported yet (only `files`)"),
                });
            }
            _ => {}
        }
    }
    let mut config = String::from("[core]\n\tbare = false\n\tfilemode = true\n");
    match object_format {
        Some(format) => config.push_str(&format!(
            "\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = {format}\n"
        )),
        None => config.push_str("\trepositoryformatversion = 0\n"),
    }
    Ok(config)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), GitDirError> {
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

/// Copies a regular file without following a symlink at `from` (it may be
/// in a workspace another agent writes) into a new file `to`.
fn copy_regular(from: &Path, to: &Path) -> Result<(), GitDirError> {
    let mut source = open_regular(from)?;
    let mut target = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io("create", to))?;
    std::io::copy(&mut source, &mut target).map_err(io("copy", from))?;
    Ok(())
}

/// Writes `objects/info/alternates` in the agent's git dir, which the agent
/// may have filled with symlinks: every component is opened beneath `repo`
/// without following one, and the file itself is not followed either.
fn write_alternates(repo: &Path, objects: &Path) -> Result<(), GitDirError> {
    let root: OwnedFd = nix::fcntl::open(
        repo,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open", repo)(e.into()))?;
    let info_path = repo.join("objects/info");
    let info = crate::mounts::open_beneath(&root, Path::new("objects/info"), OFlag::O_DIRECTORY)
        .map_err(|e| io("open", &info_path)(e.into()))?;
    let file = nix::fcntl::openat(
        info.as_fd(),
        "alternates",
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| io("open", &info_path.join("alternates"))(e.into()))?;
    let mut file = fs::File::from(file);
    writeln!(file, "{}", objects.display()).map_err(io("write", &info_path.join("alternates")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitfiles_parse_strictly() {
        assert_eq!(
            parse_gitfile("gitdir: ../.git/modules/a\n"),
            Some("../.git/modules/a")
        );
        assert_eq!(parse_gitfile("gitdir:/x"), Some("/x"));
        assert_eq!(parse_gitfile("gitdir: \n"), None);
        assert_eq!(parse_gitfile("[core]\n"), None);
    }

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
