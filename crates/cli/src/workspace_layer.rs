//! `run --workspace-mode overlay [--keep-layer DIR]` and `workspace
//! diff|apply|discard|rollback|turns DIR`: the workspace seen through a
//! layer of the command's own (substrat_layer), so the host tree stays as
//! it was until someone reviews and applies.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use substrat_layer::{Layer, LayerLock, TurnDirs};
use substrat_policy::text;
use substrat_sandbox::plan::{Access, LaunchPlan, LayerDirs, MountStep};
use substrat_sandbox::{LaunchError, RunOutcome};

use crate::layer_dir::Made;

/// How the command sees its workspace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceMode {
    /// The host tree, read-write: what the command writes is there at once.
    #[default]
    Direct,
    /// Through a layer of the command's own: the host tree is not written; review with `workspace diff`, take with `workspace apply`.
    Overlay,
}

impl WorkspaceMode {
    /// The command line's choice, else the policy's.
    pub fn chosen(
        arg: Option<WorkspaceMode>,
        policy: &substrat_policy::LoadedPolicy,
    ) -> WorkspaceMode {
        arg.unwrap_or(match policy.policy.filesystem.workspace_mode {
            substrat_policy::model::WorkspaceMode::Direct => WorkspaceMode::Direct,
            substrat_policy::model::WorkspaceMode::Overlay => WorkspaceMode::Overlay,
        })
    }
}

/// The layer of one launch: locked for the run, its turn made.
#[derive(Debug)]
pub struct RunLayer {
    layer: Layer,
    lock: LayerLock,
    turn: TurnDirs,
    /// No `--keep-layer`: a layer in a temporary directory, gone after.
    scratch: Option<tempfile::TempDir>,
    /// What this turn may write (the quota less what earlier turns hold).
    quota: Option<u64>,
    /// What the launch made of the layer: taken back unless it finishes.
    made: Made,
    finished: bool,
    /// Files the overlay cannot change (an unprivileged launch's unmapped
    /// ids, crate::overlay_ids).
    unmapped: substrat_sandbox::unmapped::Unmapped,
}

/// What a launch asks of its layer.
#[derive(Debug, Clone, Copy)]
pub struct LayerRequest<'a> {
    pub mode: WorkspaceMode,
    /// `--keep-layer DIR`.
    pub keep: Option<&'a Path>,
    pub workspace: &'a Path,
    /// The policy's `layer_quota`, in bytes.
    pub quota: Option<u64>,
    /// Wait for the layer while someone applies or rolls it back (the
    /// daemon's turns), instead of failing at once.
    pub wait: bool,
}

/// How long a daemon's turn waits for its layer (an operator's apply).
const LAYER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The layer a launch uses, when its workspace mode is overlay.
pub fn prepare(request: LayerRequest<'_>) -> Result<Option<RunLayer>> {
    let LayerRequest {
        mode,
        keep,
        workspace,
        quota,
        wait,
    } = request;
    if mode == WorkspaceMode::Direct {
        if keep.is_some() {
            bail!("--keep-layer needs --workspace-mode overlay");
        }
        return Ok(None);
    }
    let (dir, made, scratch) = match keep {
        Some(dir) => {
            let (dir, made) = crate::layer_dir::resolve(dir)?;
            (dir, made, None)
        }
        None => {
            // 0700: a layer open to others is not trusted (substrat_layer).
            let scratch = tempfile::Builder::new()
                .prefix("substrat-layer-")
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir()
                .context("cannot make a temporary layer directory")?;
            (scratch.path().to_path_buf(), Made::Turn, Some(scratch))
        }
    };
    // Judged as the kernel sees the tree (links, `..`, bind mounts).
    if substrat_sandbox::place::within(&dir, workspace)
        .with_context(|| format!("cannot tell whether {} is in the workspace", dir.display()))?
    {
        bail!(
            "the layer {} is inside the workspace {}: the command would see (and could change) its own layer; keep it elsewhere",
            dir.display(),
            workspace.display()
        );
    }
    let layer = Layer::open_or_create(&dir, workspace);
    let layer = match layer {
        Ok(layer) => layer,
        Err(e) => {
            // Only a directory this launch made is taken back.
            if made != Made::Turn {
                let _ = crate::layer_dir::take_back(&dir, &made, &dir);
            }
            return Err(e.into());
        }
    };
    let lock = if wait {
        layer.lock_waiting(LAYER_WAIT)?
    } else {
        layer.lock()?
    };
    let turn = layer.begin_turn(&lock)?;
    let mut run = RunLayer {
        layer,
        lock,
        turn,
        scratch,
        quota: None,
        made,
        finished: false,
        unmapped: Default::default(),
    };
    if let Some(quota) = quota {
        run.quota = Some(quota.saturating_sub(run.layer.size()?));
    }
    Ok(Some(run))
}

impl RunLayer {
    /// What the plan mounts.
    pub fn dirs(&self) -> LayerDirs {
        LayerDirs {
            root: self.turn.root.clone(),
            frozen: self.turn.frozen.clone(),
            upper: self.turn.upper.clone(),
            work: self.turn.work.clone(),
            quota: self.quota,
        }
    }

    /// A layer inside a tree the sandbox can write is refused: the command
    /// could rewrite earlier turns, or the upper under the mounted overlay.
    /// A layer needs the pid namespace: the layer's lock is released, and
    /// a quota's writes copied out, once every process of the sandbox is
    /// gone, which only its end ensures (a process left running could
    /// change the upper while `apply` reads it).
    pub fn refuse_if_visible(&self, plan: &LaunchPlan) -> Result<()> {
        if !plan.namespaces.pid {
            bail!(
                "an overlay workspace needs the pid namespace (`namespaces.pid = true`): the layer is handed to `workspace apply` once every process of the sandbox has ended, which only the end of its pid namespace ensures"
            );
        }
        let dir = self.layer.dir();
        for step in &plan.mounts {
            if let MountStep::Bind {
                source,
                access: Access::Rw,
                ..
            } = step
                && substrat_sandbox::place::within(dir, source).unwrap_or(true)
            {
                bail!(
                    "the layer {} is inside {}, which the sandbox can write; keep the layer elsewhere",
                    dir.display(),
                    source.display()
                );
            }
        }
        Ok(())
    }

    /// Before the launch: the files of `workspace` the command cannot
    /// change through the overlay, said when there are any.
    pub fn tell_unmapped(
        &mut self,
        workspace: &Path,
        host_ids: &substrat_sandbox::hostid::HostIds,
        program: &str,
    ) {
        self.unmapped = crate::overlay_ids::tell(workspace, host_ids, program);
    }

    /// The turn's upper directory is empty (or unreadable: nothing to keep).
    pub fn wrote_nothing(&self) -> bool {
        std::fs::read_dir(&self.turn.upper).map_or(true, |mut e| e.next().is_none())
    }

    /// After the launch: `finish`, unless the sandbox did not start, or its
    /// command was not found or could not be executed (126, 127) and wrote
    /// nothing. That is no turn: the layer is dropped, what it made taken
    /// back.
    pub fn after_launch(
        self,
        launched: &Result<(RunOutcome, String), LaunchError>,
        agent_repo: Option<&Path>,
        program: &str,
    ) -> Result<()> {
        let exit_code = match launched {
            Ok((outcome, _)) => outcome.exit_code,
            Err(_) => return Ok(()),
        };
        if matches!(exit_code, 126 | 127) && self.wrote_nothing() {
            return Ok(());
        }
        self.finish(agent_repo, exit_code, program)
    }

    /// After the sandbox has ended: the turn kept (or the scratch layer
    /// dropped), the agent's git directory recorded (its commits are shown
    /// with the layer's changes), and one line saying what changed (and,
    /// when nothing did and the command failed, what is known of why).
    pub fn finish(
        mut self,
        agent_repo: Option<&Path>,
        exit_code: i32,
        program: &str,
    ) -> Result<()> {
        self.finished = true;
        self.layer.finish_turn(&self.turn, &self.lock)?;
        if let Some(repo) = agent_repo {
            self.layer.set_agent_repo(repo, &self.lock)?;
        }
        let changes = substrat_layer::changes(&self.layer)?;
        let dir = text::escape_path(self.layer.dir());
        match (&self.scratch, changes.len()) {
            (Some(_), 0) => {}
            (Some(_), n) => eprintln!(
                "{program}: the command changed {n} path(s) in its layer, discarded (no --keep-layer); the workspace is as it was"
            ),
            (None, 0) => eprintln!(
                "{program}: workspace layer {dir}: no changes{}",
                crate::overlay_ids::no_changes_reason(exit_code, &self.unmapped)
            ),
            (None, n) => eprintln!(
                "{program}: workspace layer {dir}: {n} path(s) changed; review with `substrat-sandbox workspace diff {dir}`, take with `workspace apply`"
            ),
        }
        // A scratch layer's turns go by descriptors (any depth, any mode
        // the agent left) before its directory is dropped.
        if self.scratch.is_some() {
            self.layer.discard(&self.lock)?;
        }
        Ok(())
    }
}

/// A launch that failed (its layer never finished): what it made of the
/// layer is taken back, a layer that was there before left as it was.
impl Drop for RunLayer {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let dir = self.layer.dir();
        let turn = self.turn.upper.parent().unwrap_or(&self.turn.upper);
        if let Err(e) = crate::layer_dir::take_back(dir, &self.made, turn) {
            eprintln!(
                "warning: the launch failed, and what it made of the layer {} cannot be removed: {}",
                text::escape_path(dir),
                text::escape_text(&e.to_string())
            );
        }
    }
}
