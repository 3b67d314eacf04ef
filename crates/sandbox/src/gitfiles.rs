//! Reading a host repository's git files without being led elsewhere:
//! what the workspace's `.git` is (a git dir, a gitfile of a worktree or
//! submodule that names the workspace back), and small files opened
//! without following symlinks and never blocking on a FIFO. The workspace
//! may be below another agent's, which can write all of it.

use std::fs;
use std::path::{Path, PathBuf};

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

pub(crate) fn io(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> GitDirError + use<> {
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
    pub(crate) fn dirs(&self) -> Option<(&Path, &Path)> {
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
    } else if let Some(worktree) = read_small(&git_dir.join("config"))
        .ok()
        .and_then(|text| config_value(&text, "core", "worktree"))
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
pub(crate) fn read_small(path: &Path) -> Result<String, GitDirError> {
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
pub(crate) fn open_regular(path: &Path) -> Result<fs::File, GitDirError> {
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

/// `section.key` from the text of a git config file (simple form only:
/// no includes, no subsections; the last one wins, as in git; trimmed).
pub(crate) fn config_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut current = String::new();
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_ascii_lowercase();
        } else if current == section
            && let Some((k, v)) = line.split_once('=')
            && k.trim().eq_ignore_ascii_case(key)
        {
            found = Some(v.trim().to_string());
        }
    }
    found
}

/// The path a gitfile names (`gitdir: PATH`, one line).
pub fn parse_gitfile(text: &str) -> Option<&str> {
    let path = text.strip_prefix("gitdir:")?.trim();
    (!path.is_empty() && !path.contains('\0')).then_some(path)
}

/// A worktree's git dir names the repository's common dir in `commondir`;
/// git puts a worktree's git dir inside it (`<common>/worktrees/<name>`),
/// and only such a common dir is taken: one elsewhere would be a path of
/// its writer's choosing (another repository's objects).
fn common_dir_of(git_dir: &Path) -> Result<PathBuf, GitDirError> {
    let file = git_dir.join("commondir");
    let text = match read_small(&file) {
        Ok(text) => text,
        Err(GitDirError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(git_dir.to_path_buf());
        }
        Err(e) => return Err(e),
    };
    let common_dir = git_dir
        .join(text.trim())
        .canonicalize()
        .map_err(io("resolve the common dir named by", &file))?;
    if !git_dir.starts_with(&common_dir) {
        return Err(GitDirError::Unsupported {
            path: file,
            why: format!(
                "names {}, which does not hold this git dir (git keeps a worktree's git dir in \
                 its repository's)",
                common_dir.display()
            ),
        });
    }
    Ok(common_dir)
}

/// The agent repo's config: the host's repository format (object format),
/// nothing else of the host's config. Refs stored otherwise than as files
/// are refused (the launcher copies them as files).
pub(crate) fn repository_format(common_dir: &Path) -> Result<String, GitDirError> {
    let path = common_dir.join("config");
    let format = Format::of(&read_small(&path).unwrap_or_default());
    if let Some(storage) = format.ref_storage.as_deref().filter(|s| *s != "files") {
        return Err(GitDirError::Unsupported {
            path,
            why: format!("refs stored as `{storage}` are not supported yet (only `files`)"),
        });
    }
    Ok(format.config())
}

/// Copies a regular file without following a symlink at `from` (it may be
/// in a workspace another agent writes) into a new file `to`.
pub(crate) fn copy_regular(from: &Path, to: &Path) -> Result<(), GitDirError> {
    let mut source = open_regular(from)?;
    let mut target = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io("create", to))?;
    std::io::copy(&mut source, &mut target).map_err(io("copy", from))?;
    Ok(())
}

/// A minimal config for a repository whose config was `text`: only the
/// repository format (see `Format`).
pub fn minimal_config(text: &str) -> String {
    Format::of(text).config()
}

/// A repository's format, read from its config: the object format and the
/// ref storage, values limited to letters and digits and never empty
/// (found by the git_files fuzz target: an empty `objectformat =` made a
/// config git refuses).
struct Format {
    object_format: Option<String>,
    ref_storage: Option<String>,
}

impl Format {
    fn of(text: &str) -> Self {
        let value = |key| {
            config_value(text, "extensions", key)
                .map(|v| v.to_ascii_lowercase())
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric()))
        };
        Format {
            object_format: value("objectformat"),
            ref_storage: value("refstorage"),
        }
    }

    /// The config that says this format and nothing else.
    fn config(&self) -> String {
        let mut config = String::from("[core]\n\tbare = false\n\tfilemode = true\n");
        if self.object_format.is_none() && self.ref_storage.is_none() {
            config.push_str("\trepositoryformatversion = 0\n");
            return config;
        }
        config.push_str("\trepositoryformatversion = 1\n[extensions]\n");
        if let Some(format) = &self.object_format {
            config.push_str(&format!("\tobjectformat = {format}\n"));
        }
        if let Some(storage) = &self.ref_storage {
            config.push_str(&format!("\trefstorage = {storage}\n"));
        }
        config
    }
}

/// What a git dir's HEAD file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadTarget<'a> {
    /// A detached commit id (40 hex digits).
    Commit(&'a str),
    /// A branch: `refs/...`, no empty or `..` component.
    Ref(&'a str),
}

fn is_commit_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A HEAD file's text, as git reads it; `None` for anything else. The
/// agent writes its own git dir: nothing here leads outside `refs/`.
pub fn parse_head(text: &str) -> Option<HeadTarget<'_>> {
    let head = text.trim_end_matches('\n');
    match head.strip_prefix("ref: ") {
        Some(name) => {
            let plain = name.starts_with("refs/")
                && name
                    .split('/')
                    .all(|c| !c.is_empty() && c != ".." && c != ".")
                && !name.bytes().any(|b| b.is_ascii_control() || b == b'\\');
            plain.then_some(HeadTarget::Ref(name))
        }
        None => is_commit_id(head).then_some(HeadTarget::Commit(head)),
    }
}

/// The commit `name` has in a `packed-refs` file's text (its first
/// line naming it).
pub fn packed_ref<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (id, refname) = line.split_once(' ')?;
        (refname == name && is_commit_id(id)).then_some(id)
    })
}

/// A loose ref file's commit.
pub fn loose_ref(text: &str) -> Option<&str> {
    let id = text.trim_end_matches('\n');
    is_commit_id(id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_refs_parse_strictly() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(parse_head(&format!("{id}\n")), Some(HeadTarget::Commit(id)));
        assert_eq!(
            parse_head("ref: refs/heads/main\n"),
            Some(HeadTarget::Ref("refs/heads/main"))
        );
        for bad in [
            "ref: refs/../../etc/passwd",
            "ref: /etc/passwd",
            "ref: refs//x",
            "ref: refs/heads/./x",
            "0123",
            "",
        ] {
            assert_eq!(parse_head(bad), None, "{bad}");
        }
        assert_eq!(loose_ref(&format!("{id}\n")), Some(id));
        assert_eq!(loose_ref("zz"), None);
        let packed = format!("# pack-refs with: peeled\n{id} refs/heads/main\n^{id}\n");
        assert_eq!(packed_ref(&packed, "refs/heads/main"), Some(id));
        assert_eq!(packed_ref(&packed, "refs/heads/other"), None);
    }

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
    fn minimal_config_keeps_the_format_alone() {
        let agent = "[core]\n\tfsmonitor = touch x\n\thooksPath = h\n[extensions]\n\tobjectFormat = SHA256\n\
                     \tpartialClone = origin\n[remote \"origin\"]\n\tpromisor = true\n";
        assert_eq!(
            minimal_config(agent),
            "[core]\n\tbare = false\n\tfilemode = true\n\trepositoryformatversion = 1\n\
             [extensions]\n\tobjectformat = sha256\n"
        );
        // An empty or odd value is dropped (fuzzing found the empty one).
        for odd in [
            "[extensions]\n\tobjectformat = \n",
            "[extensions]\n\tobjectformat = a b\n",
        ] {
            assert_eq!(
                minimal_config(odd),
                "[core]\n\tbare = false\n\tfilemode = true\n\trepositoryformatversion = 0\n"
            );
        }
    }
}
