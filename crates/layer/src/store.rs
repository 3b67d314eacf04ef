//! The layer directory: one per agent (or per `run --keep-layer DIR`),
//! on the host, outside every sandbox's view.
//!
//! ```text
//! LAYER/layer.json     format, the workspace it lies over, its base time
//! LAYER/lock           held while a sandbox uses the layer, and by apply,
//!                      discard and rollback (overlayfs forbids changing a
//!                      layer under a mounted overlay)
//! LAYER/base.json      the host identity of each changed path as the agent
//!                      found it (conflict detection)
//! LAYER/turns/N/upper  what launch (turn) N wrote; earlier turns are
//!                      read-only layers below the next one: a checkpoint
//!                      per turn, rolled back by removing it
//! LAYER/turns/N/work   overlayfs's work directory, removed after the turn
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::LayerError;
use crate::names::{decode_path, encode_path};
use crate::trust::Expect;

const FORMAT: u32 = 1;

/// What `layer.json` says.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    format: u32,
    workspace: PathBuf,
    /// Host files whose ctime is at or after this changed after the layer
    /// was made (nanoseconds since the epoch, the kernel's file clock).
    base_ns: i128,
    /// The git directory the runs over the layer commit to (the agent's
    /// own), recorded by the last run: `diff` shows its commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_repo: Option<PathBuf>,
    /// The workspace directory's device and inode when the layer was
    /// made: a workspace path that names another directory since (a
    /// parent renamed, a link put in its place) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace_id: Option<FileId>,
}

/// A directory's identity on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn of(meta: &fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// The files of a layer `apply` reads besides its turns: checked as the
/// directory is (`trust`).
pub(crate) const RECORDS: &[(&str, Expect)] = &[
    ("layer.json", Expect::File),
    ("base.json", Expect::File),
    ("lock", Expect::File),
    (crate::review::RECORD, Expect::File),
];

/// A host path's identity: changed when either differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub ino: u64,
    pub ctime_ns: i128,
}

impl Identity {
    pub fn of(meta: &fs::Metadata) -> Identity {
        Identity {
            ino: meta.ino(),
            ctime_ns: ctime_ns(meta),
        }
    }
}

pub(crate) fn ctime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

/// A layer directory, opened.
#[derive(Debug)]
pub struct Layer {
    dir: PathBuf,
    meta: Meta,
}

/// Held while the layer is used; released on drop.
#[derive(Debug)]
pub struct LayerLock {
    file: File,
}

impl Drop for LayerLock {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.file, rustix::fs::FlockOperation::Unlock);
    }
}

/// The directories of one turn, made for a launch.
#[derive(Debug, Clone)]
pub struct TurnDirs {
    pub number: u32,
    pub root: PathBuf,
    /// Earlier turns' upper directories, newest first.
    pub frozen: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl Layer {
    /// Opens the layer at `dir`, or makes it (0700) for `workspace`
    /// (absolute, resolved) when `dir` is absent or empty. A layer made for
    /// another workspace is refused: its changes mean nothing over this
    /// one; so is a directory someone else could write (`trust`).
    pub fn open_or_create(dir: &Path, workspace: &Path) -> Result<Layer, LayerError> {
        crate::trust::check_links(dir)?;
        let empty = match fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(LayerError::io("read", dir, e)),
        };
        if !empty {
            let layer = Layer::open(dir)?;
            if layer.meta.workspace != workspace {
                return Err(LayerError::OtherWorkspace {
                    layer: dir.to_path_buf(),
                    made_for: layer.meta.workspace.clone(),
                    given: workspace.to_path_buf(),
                });
            }
            return Ok(layer);
        }
        if let Ok(meta) = fs::symlink_metadata(dir) {
            if !meta.is_dir() {
                return Err(LayerError::Untrusted {
                    path: dir.to_path_buf(),
                    why: "not a directory".into(),
                });
            }
            crate::trust::check_new_layer_dir(dir)?;
        }
        let existing = dir
            .ancestors()
            .find(|a| fs::symlink_metadata(a).is_ok())
            .unwrap_or(Path::new("/"));
        crate::trust::check_parents(existing)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("turns"))
            .map_err(|e| LayerError::io("make", dir, e))?;
        let dir = resolved(dir)?;
        // Made now: a directory someone else made meanwhile is refused.
        crate::trust::check_layer_dir(&dir)?;
        let workspace_meta =
            fs::metadata(workspace).map_err(|e| LayerError::io("stat", workspace, e))?;
        let meta_path = dir.join("layer.json");
        let mut meta = Meta {
            format: FORMAT,
            workspace: workspace.to_path_buf(),
            base_ns: 0,
            agent_repo: None,
            workspace_id: Some(FileId::of(&workspace_meta)),
        };
        // The base time is the file clock's own: the ctime of the file that
        // records it, taken before anything is written there.
        write_json(&meta_path, &meta)?;
        let written =
            fs::metadata(&meta_path).map_err(|e| LayerError::io("stat", &meta_path, e))?;
        meta.base_ns = ctime_ns(&written);
        write_json(&meta_path, &meta)?;
        Ok(Layer { dir, meta })
    }

    /// Opens an existing layer: resolved, and only when its owner is the
    /// caller and nobody else could have written it (`trust`).
    pub fn open(dir: &Path) -> Result<Layer, LayerError> {
        crate::trust::check_links(dir)?;
        let dir = match resolved(dir) {
            Ok(dir) => dir,
            Err(LayerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(LayerError::NotALayer(dir.to_path_buf()));
            }
            Err(e) => return Err(e),
        };
        crate::trust::check_layer(&dir)?;
        let path = dir.join("layer.json");
        let text = read_record(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LayerError::NotALayer(dir.clone()),
            _ => LayerError::io("read", &path, e),
        })?;
        let meta: Meta = serde_json::from_slice(&text).map_err(|e| LayerError::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        if meta.format != FORMAT {
            return Err(LayerError::Corrupt {
                path,
                why: format!("format {} (this build reads {FORMAT})", meta.format),
            });
        }
        Ok(Layer { dir, meta })
    }

    /// The workspace, opened for reading or writing beneath it: refused
    /// when its path names another directory than the one the layer was
    /// made over.
    pub(crate) fn host(&self) -> Result<crate::host::HostTree, LayerError> {
        let host = crate::host::HostTree::open(&self.meta.workspace)?;
        if let Some(made_over) = self.meta.workspace_id {
            let st = rustix::fs::fstat(&host.fd)
                .map_err(|e| LayerError::io("stat", &self.meta.workspace, e.into()))?;
            let now = FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            };
            if now != made_over {
                return Err(LayerError::WorkspaceReplaced(self.meta.workspace.clone()));
            }
        }
        Ok(host)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn workspace(&self) -> &Path {
        &self.meta.workspace
    }

    pub fn base_ns(&self) -> i128 {
        self.meta.base_ns
    }

    /// The agent's git directory, as the last run recorded it.
    pub fn agent_repo(&self) -> Option<&Path> {
        self.meta.agent_repo.as_deref()
    }

    /// Records the agent's git directory (under the lock the caller holds).
    pub fn set_agent_repo(&mut self, repo: &Path, _lock: &LayerLock) -> Result<(), LayerError> {
        if self.meta.agent_repo.as_deref() == Some(repo) {
            return Ok(());
        }
        self.meta.agent_repo = Some(repo.to_path_buf());
        write_json(&self.dir.join("layer.json"), &self.meta)
    }

    /// Takes the layer for this process, or says who has it.
    pub fn lock(&self) -> Result<LayerLock, LayerError> {
        let path = self.dir.join("lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(
                (rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOFOLLOW).bits() as i32,
            )
            .open(&path)
            .map_err(|e| LayerError::io("open", &path, e))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(LayerLock { file }),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(LayerError::InUse(self.dir.clone())),
            Err(e) => Err(LayerError::io("lock", &path, e.into())),
        }
    }

    /// `lock`, retried until `patience` has passed.
    pub fn lock_waiting(&self, patience: std::time::Duration) -> Result<LayerLock, LayerError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match self.lock() {
                Err(LayerError::InUse(_)) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// The turns recorded, oldest first.
    pub fn turns(&self) -> Result<Vec<u32>, LayerError> {
        let dir = self.dir.join("turns");
        let mut turns = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| LayerError::io("read", &dir, e))? {
            let entry = entry.map_err(|e| LayerError::io("read", &dir, e))?;
            let name = entry.file_name();
            match name.to_str().and_then(|n| n.parse::<u32>().ok()) {
                Some(n) if n > 0 => turns.push(n),
                _ => {
                    return Err(LayerError::Corrupt {
                        path: entry.path(),
                        why: "not a turn of the layer".into(),
                    });
                }
            }
        }
        turns.sort_unstable();
        Ok(turns)
    }

    pub fn upper(&self, turn: u32) -> PathBuf {
        self.dir.join("turns").join(turn.to_string()).join("upper")
    }

    /// Upper directories of every turn, newest first (the overlay's order).
    pub fn uppers(&self) -> Result<Vec<PathBuf>, LayerError> {
        Ok(self
            .turns()?
            .into_iter()
            .rev()
            .map(|t| self.upper(t))
            .collect())
    }

    /// Makes the next turn's directories (under the lock the caller holds),
    /// after tidying what a launch that ended before `finish_turn` left:
    /// its work directory, and its upper when empty.
    pub fn begin_turn(&self, _lock: &LayerLock) -> Result<TurnDirs, LayerError> {
        for turn in self.turns()? {
            let dir = self.dir.join("turns").join(turn.to_string());
            crate::remove::remove_tree(&dir.join("work"))?;
            let upper = dir.join("upper");
            let empty = fs::read_dir(&upper)
                .map(|mut entries| entries.next().is_none())
                .unwrap_or(true);
            if empty {
                crate::remove::remove_tree(&dir)?;
            }
        }
        let frozen = self.uppers()?;
        if frozen.len() >= MAX_TURNS {
            return Err(LayerError::TooManyTurns(self.dir.clone()));
        }
        let number = self.turns()?.last().copied().unwrap_or(0) + 1;
        let turn = self.dir.join("turns").join(number.to_string());
        let builder = {
            let mut b = fs::DirBuilder::new();
            b.mode(0o700);
            b
        };
        builder
            .create(&turn)
            .map_err(|e| LayerError::io("make", &turn, e))?;
        for sub in ["upper", "work"] {
            builder
                .create(turn.join(sub))
                .map_err(|e| LayerError::io("make", &turn.join(sub), e))?;
        }
        Ok(TurnDirs {
            number,
            root: self.dir.join("turns"),
            frozen,
            upper: turn.join("upper"),
            work: turn.join("work"),
        })
    }

    /// After the turn's sandbox has ended: overlayfs's work directory is
    /// removed, and a turn that wrote nothing leaves no checkpoint. The
    /// host identity of every path the turn changed is recorded when it
    /// was still the base's (`base.json`).
    pub fn finish_turn(&self, turn: &TurnDirs, _lock: &LayerLock) -> Result<(), LayerError> {
        crate::remove::remove_tree(&turn.work)?;
        let upper_empty = fs::read_dir(&turn.upper)
            .map_err(|e| LayerError::io("read", &turn.upper, e))?
            .next()
            .is_none();
        if upper_empty {
            let dir = turn.upper.parent().unwrap_or(&turn.upper);
            crate::remove::remove_tree(dir)?;
            return Ok(());
        }
        let entries = crate::scan::scan_upper(&turn.upper, turn.number)?;
        let mut base = self.base()?;
        let host = self.host()?;
        for (path, _) in &entries {
            if base.contains_key(path) {
                continue;
            }
            if let Some(now) = host.lookup(path)?
                && now.identity.ctime_ns < self.meta.base_ns
            {
                base.insert(path.clone(), now.identity);
            }
        }
        self.save_base(&base)
    }

    /// The recorded base identities.
    pub fn base(&self) -> Result<BTreeMap<PathBuf, Identity>, LayerError> {
        let path = self.dir.join("base.json");
        let text = match read_record(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(LayerError::io("read", &path, e)),
        };
        let stored: BTreeMap<String, Identity> =
            serde_json::from_slice(&text).map_err(|e| LayerError::Corrupt {
                path: path.clone(),
                why: e.to_string(),
            })?;
        stored
            .into_iter()
            .map(|(k, v)| match decode_path(&k) {
                Some(p) => Ok((p, v)),
                None => Err(LayerError::Corrupt {
                    path: path.clone(),
                    why: format!("bad path {k:?}"),
                }),
            })
            .collect()
    }

    pub(crate) fn save_base(&self, base: &BTreeMap<PathBuf, Identity>) -> Result<(), LayerError> {
        let stored: BTreeMap<String, Identity> =
            base.iter().map(|(k, v)| (encode_path(k), *v)).collect();
        write_json(&self.dir.join("base.json"), &stored)
    }

    /// The bytes the layer's turns hold on the disk.
    pub fn size(&self) -> Result<u64, LayerError> {
        let mut total = 0;
        for upper in self.uppers()? {
            total += crate::remove::disk_usage(&upper)?;
        }
        Ok(total)
    }

    /// Removes turns `from` and later (a rollback to before turn `from`).
    pub fn rollback(&self, from: u32, _lock: &LayerLock) -> Result<Vec<u32>, LayerError> {
        let turns = self.turns()?;
        if !turns.contains(&from) {
            return Err(LayerError::NoSuchTurn {
                turn: from,
                turns: turns.clone(),
            });
        }
        let removed: Vec<u32> = turns.into_iter().filter(|t| *t >= from).collect();
        // Newest first: a crash in the middle leaves a consistent stack.
        for turn in removed.iter().rev() {
            crate::remove::remove_tree(&self.dir.join("turns").join(turn.to_string()))?;
        }
        Ok(removed)
    }

    /// Removes every turn: the workspace is again what the host has.
    pub fn discard(&self, lock: &LayerLock) -> Result<Vec<u32>, LayerError> {
        let turns = self.turns()?;
        let Some(first) = turns.first() else {
            return Ok(Vec::new());
        };
        let removed = self.rollback(*first, lock)?;
        let base = self.dir.join("base.json");
        if base.exists() {
            fs::remove_file(&base).map_err(|e| LayerError::io("remove", &base, e))?;
        }
        Ok(removed)
    }
}

/// overlayfs stacks at most 500 layers, and the mount options must fit
/// one page: each turn's upper is one layer named by a descriptor path.
pub const MAX_TURNS: usize = 128;

/// `dir` with every link and `..` resolved.
fn resolved(dir: &Path) -> Result<PathBuf, LayerError> {
    dir.canonicalize()
        .map_err(|e| LayerError::io("resolve", dir, e))
}

/// A record of the layer: a regular file, its last component never
/// followed, at most 64 MiB (a record is small; a bigger one is not ours).
pub(crate) fn read_record(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(64 << 20).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Written whole to a new file, then renamed over the old one.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), LayerError> {
    let text = serde_json::to_vec_pretty(value).map_err(|e| LayerError::Corrupt {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let tmp = path.with_extension("json.new");
    // A name left there (by a crash) is removed, never written through.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LayerError::io("remove", &tmp, e)),
    }
    let mut file = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)
        .map_err(|e| LayerError::io("write", &tmp, e))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(|e| LayerError::io("write", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| LayerError::io("rename", path, e))
}
