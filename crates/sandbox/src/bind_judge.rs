//! A caller's judgement of each bind's source as the launch opened it: the
//! path of the opened descriptor, the object that is then mounted, so a
//! path swapped between a check and the mount cannot bring in another
//! (`substrat-oci` refuses protected host places this way, issue 44).
//!
//! The judge also says how a source launched by root is shown (`BindView`):
//! idmapped, where the sandbox acts as host root on the tree, or as it is,
//! where the sandbox is its subordinate uid, a stranger to the host's files.

use std::path::{Path, PathBuf};

use crate::mounts::{MountError, Source, fd_path};
use crate::plan::{Access, MountStep};

/// What the judge is told of one bind.
#[derive(Debug)]
pub struct JudgedBind<'a> {
    /// The source as the plan has it.
    pub source: &'a Path,
    pub target: &'a Path,
    /// Where the opened source is (`/proc/self/fd/N`'s link).
    pub resolved: &'a Path,
    /// What the opened source really is on the host, by its mount
    /// (`mount_origin`): empty when its mount is not in this namespace.
    pub origins: &'a [PathBuf],
    pub read_only: bool,
    /// The opened source's device and inode (what is mounted).
    pub dev: u64,
    pub ino: u64,
    /// The opened source is a Unix socket.
    pub socket: bool,
}

/// How a bind's source is shown to a sandbox launched by root (`stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BindView {
    /// Through an idmapped copy: root's files are the sandbox's, so the
    /// sandbox acts on the tree as host root would (its own files: the
    /// workspace, an engine's files made for this container).
    #[default]
    Idmapped,
    /// As it is: the sandbox acts on the tree as its subordinate uid, an
    /// unprivileged stranger (root's sockets, 0600 files and directories
    /// are closed to it by the kernel's own permission checks).
    AsIs,
}

type Judge = dyn Fn(&JudgedBind<'_>) -> Result<BindView, String> + Send + Sync;

/// Refuses a bind by returning why, or says how it is shown
/// (`RunOptions::bind_judge`).
pub struct BindJudge(Box<Judge>);

impl BindJudge {
    pub fn new(
        judge: impl Fn(&JudgedBind<'_>) -> Result<BindView, String> + Send + Sync + 'static,
    ) -> Self {
        Self(Box::new(judge))
    }
}

impl std::fmt::Debug for BindJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BindJudge")
    }
}

/// A bind the judge refused.
#[derive(Debug, thiserror::Error)]
#[error("bind source {path} (opened as {resolved}) into {target} is refused: {reason}")]
pub struct BindRefused {
    pub path: PathBuf,
    pub resolved: PathBuf,
    pub target: PathBuf,
    pub reason: String,
}

/// Judges `step`'s opened source; a missing one is refused, never judged
/// by its text. Without a judge every source is idmapped.
pub(crate) fn judge(
    judge: Option<&BindJudge>,
    step: &MountStep,
    opened: Option<&Source>,
) -> Result<BindView, MountError> {
    let (
        Some(judge),
        MountStep::Bind {
            source,
            target,
            access,
            optional,
            ..
        },
    ) = (judge, step)
    else {
        return Ok(BindView::Idmapped);
    };
    let Some(opened) = opened else {
        if *optional {
            return Ok(BindView::Idmapped);
        }
        return Err(MountError::MissingSource {
            path: source.clone(),
        });
    };
    let link = fd_path(&opened.fd);
    let resolved = std::fs::read_link(&link).map_err(|e| MountError::Sys {
        what: "readlink",
        path: link,
        errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    })?;
    let st = nix::sys::stat::fstat(&opened.fd).map_err(|errno| MountError::Sys {
        what: "fstat",
        path: source.clone(),
        errno,
    })?;
    let kind =
        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
    let origins = crate::mount_origin::origins_of_fd(&opened.fd, &resolved);
    let bind = JudgedBind {
        source,
        target,
        resolved: &resolved,
        origins: &origins,
        read_only: *access == Access::Ro,
        dev: st.st_dev,
        ino: st.st_ino,
        socket: kind == nix::sys::stat::SFlag::S_IFSOCK,
    };
    (judge.0)(&bind).map_err(|reason| {
        MountError::Judged(BindRefused {
            path: source.clone(),
            resolved: resolved.clone(),
            target: target.clone(),
            reason,
        })
    })
}
