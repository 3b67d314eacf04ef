//! `run --workspace-mode overlay [--keep-layer DIR]` and `workspace
//! diff|apply|discard|rollback|turns DIR`: the workspace seen through a
//! layer of the command's own (substrat_layer), so the host tree stays as
//! it was until someone reviews and applies.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use substrat_layer::apply::{ApplyOptions, ApplyReport};
use substrat_layer::{Change, Layer, LayerLock, TurnDirs};
use substrat_policy::text;
use substrat_sandbox::gitscan::{RootGit, find_nested};
use substrat_sandbox::plan::{Access, LaunchPlan, LayerDirs, MountStep};

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
            let scratch = tempfile::Builder::new()
                .prefix("substrat-layer-")
                .tempdir()
                .context("cannot make a temporary layer directory")?;
            (scratch.path().to_path_buf(), Made::Turn, Some(scratch))
        }
    };
    // Both resolved (the workspace is canonical): a name compared, not text.
    if dir.starts_with(workspace) {
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
                && dir.starts_with(source)
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

    /// The turn's upper directory is empty (or unreadable: nothing to keep).
    pub fn wrote_nothing(&self) -> bool {
        std::fs::read_dir(&self.turn.upper).map_or(true, |mut e| e.next().is_none())
    }

    /// After the sandbox has ended: the turn kept (or the scratch layer
    /// dropped), the agent's git directory recorded (its commits are shown
    /// with the layer's changes), and one line saying what changed.
    pub fn finish(mut self, agent_repo: Option<&Path>, program: &str) -> Result<()> {
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
            (None, 0) => eprintln!("{program}: workspace layer {dir}: no changes"),
            (None, n) => eprintln!(
                "{program}: workspace layer {dir}: {n} path(s) changed; review with `substrat-sandbox workspace diff {dir}`, take with `workspace apply`"
            ),
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

#[derive(Debug, Args)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    pub command: WorkspaceCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// What the layer changes in its workspace: a git-style patch (`git apply` takes it), or --stat, or --json.
    Diff(DiffArgs),
    /// Take the layer's changes (or those under PATH...) into the workspace; refused where the host changed since, unless --force.
    Apply(ApplyArgs),
    /// Throw the layer's changes away.
    Discard(LayerArg),
    /// Undo turn N and every later one (a turn is one launch over the layer).
    Rollback(RollbackArgs),
    /// The layer's turns, oldest first.
    Turns(LayerArg),
}

#[derive(Debug, Args)]
pub struct LayerArg {
    /// The layer directory (`run --keep-layer DIR`).
    #[arg(value_name = "DIR")]
    pub layer: PathBuf,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The layer directory (`run --keep-layer DIR`).
    #[arg(value_name = "DIR")]
    pub layer: PathBuf,
    /// One line per changed path with its kind and line counts, and whether apply would skip it.
    #[arg(long, conflicts_with = "json")]
    pub stat: bool,
    /// Every change as JSON (for programs).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The layer directory (`run --keep-layer DIR`).
    #[arg(value_name = "DIR")]
    pub layer: PathBuf,
    /// Only these paths (relative to the workspace) and what is below them.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Take the agent's side where the host changed since the agent's base.
    #[arg(long)]
    pub force: bool,
    /// The outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The layer directory (`run --keep-layer DIR`).
    #[arg(value_name = "DIR")]
    pub layer: PathBuf,
    /// The first turn to undo (`workspace turns DIR` lists them).
    #[arg(long, value_name = "N")]
    pub turn: u32,
}

pub fn workspace_main(args: WorkspaceArgs, program: &str) -> Result<ExitCode> {
    match args.command {
        WorkspaceCommand::Diff(a) => {
            let format = match (a.json, a.stat) {
                (true, _) => DiffFormat::Json,
                (false, true) => DiffFormat::Stat,
                (false, false) => DiffFormat::Patch,
            };
            let layer = Layer::open(&a.layer)?;
            let commits = commit_range(&layer, layer.agent_repo());
            print_diff(&layer, format, commits.as_ref())
        }
        WorkspaceCommand::Apply(a) => {
            let options = ApplyOptions { force: a.force };
            apply_layer(&Layer::open(&a.layer)?, &a.paths, options, a.json, program)
        }
        WorkspaceCommand::Discard(a) => discard_layer(&Layer::open(&a.layer)?, false),
        WorkspaceCommand::Rollback(a) => rollback_layer(&Layer::open(&a.layer)?, a.turn, false),
        WorkspaceCommand::Turns(a) => {
            let layer = Layer::open(&a.layer)?;
            for turn in layer.turns()? {
                println!("{turn}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How `diff` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffFormat {
    Patch,
    Stat,
    Json,
}

/// The agent's commits beside its layer: its git dir's HEAD against the
/// workspace's (read as files: host git never runs on the agent's repo).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitRange {
    pub base: Option<String>,
    pub head: String,
    pub repo: PathBuf,
}

pub fn print_diff(
    layer: &Layer,
    format: DiffFormat,
    commits: Option<&CommitRange>,
) -> Result<ExitCode> {
    // Held while reading: a turn running over the layer would change it
    // under the reader (the refusal says the layer is in use).
    let _lock = layer.lock()?;
    let changes = substrat_layer::changes(layer)?;
    match format {
        DiffFormat::Json => {
            #[derive(serde::Serialize)]
            struct DiffJson<'a> {
                workspace: &'a Path,
                layer: &'a Path,
                turns: Vec<u32>,
                bytes: u64,
                changes: &'a [substrat_layer::Change],
                commits: Option<&'a CommitRange>,
            }
            let value = DiffJson {
                workspace: layer.workspace(),
                layer: layer.dir(),
                turns: layer.turns()?,
                bytes: layer.size()?,
                changes: &changes,
                commits,
            };
            // A name that is not UTF-8 cannot be JSON: an error, not a crash.
            let text = serde_json::to_string_pretty(&value).context(
                "the changes cannot be written as JSON (a file name that is not UTF-8?)",
            )?;
            println!("{}", text::json_safe(text));
        }
        DiffFormat::Stat => {
            if let Some(c) = commits {
                println!("{}", commits_line(c));
            }
            let stat = substrat_layer::diff::stat(layer, &changes)?;
            print!("{}", text::escape_lines(&stat));
        }
        DiffFormat::Patch => {
            if let Some(c) = commits {
                println!("# {}", commits_line(c));
            }
            // Names are git-quoted always; the lines of a file are the
            // agent's bytes, kept raw only where a program reads them
            // (`git apply`), escaped for a person at a terminal.
            let patch = substrat_layer::diff::unified(layer, &changes)?;
            if std::io::stdout().is_terminal() {
                print!("{}", text::escape_lines(&patch));
            } else {
                print!("{patch}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn commits_line(c: &CommitRange) -> String {
    // Commit names are read from the agent's git directory.
    let base = text::escape_text(c.base.as_deref().unwrap_or("(none)"));
    let repo = text::escape_path(&c.repo);
    format!(
        "commits: {base}..{} in {repo}; take them with `git fetch {repo} HEAD`, then `git log {base}..FETCH_HEAD`",
        text::escape_text(&c.head),
    )
}

pub fn apply_layer(
    layer: &Layer,
    paths: &[PathBuf],
    options: ApplyOptions,
    json: bool,
    program: &str,
) -> Result<ExitCode> {
    let lock = layer.lock()?;
    let all = substrat_layer::changes(layer)?;
    let chosen = select(&all, layer.workspace(), paths)?;
    // Apply refuses every `.git` path, but a directory git takes for a bare
    // repository (HEAD, objects, refs) is made of names it does not: the
    // repositories there before are known, any other one after is made
    // inert, as after a direct run (crate::workspace_git).
    let workspace = layer.workspace();
    let before = find_nested(workspace, RootGit::Scanned).with_context(|| {
        format!(
            "cannot look for git repositories in {} before applying",
            workspace.display()
        )
    })?;
    let bare: Vec<PathBuf> = before
        .found
        .iter()
        .filter(|r| r.kind == substrat_sandbox::gitscan::RepoKind::Bare)
        .filter_map(|r| Some(r.path.strip_prefix(workspace).ok()?.to_path_buf()))
        .collect();
    let report = substrat_layer::apply::apply(layer, &lock, &chosen, options, &bare);
    let inert = crate::workspace_git::quarantine_and_say(
        workspace,
        RootGit::Scanned,
        &before.found,
        program,
    );
    let report = report?;
    // A repository apply wrote and could not make inert: host git would
    // read its configuration. The changes are applied; the exit says so.
    if !inert {
        bail!(
            "applied, but a git repository the agent made in {} could not be made inert (see \
             above): do not run git there before looking",
            workspace.display()
        );
    }
    if json {
        println!(
            "{}",
            text::json_safe(serde_json::to_string_pretty(&report)?)
        );
    } else {
        print_report(&report, options.force, program);
    }
    let refused = !report.conflicts.is_empty() && !options.force;
    Ok(if refused || !report.skipped.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub fn discard_layer(layer: &Layer, json: bool) -> Result<ExitCode> {
    let lock = layer.lock()?;
    let removed = layer.discard(&lock)?;
    if json {
        println!("{}", serde_json::json!({ "discarded_turns": removed }));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "discarded {} turn(s) of {}",
        removed.len(),
        text::escape_path(layer.dir())
    );
    Ok(ExitCode::SUCCESS)
}

pub fn rollback_layer(layer: &Layer, turn: u32, json: bool) -> Result<ExitCode> {
    let lock = layer.lock()?;
    let removed = layer.rollback(turn, &lock)?;
    if json {
        println!("{}", serde_json::json!({ "rolled_back_turns": removed }));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "rolled back turn(s) {removed:?} of {}",
        text::escape_path(layer.dir())
    );
    Ok(ExitCode::SUCCESS)
}

/// The commits of the agent's git directory `repo` its workspace lacks:
/// its HEAD against the workspace's (none when they are the same).
pub fn commit_range(layer: &Layer, repo: Option<&Path>) -> Option<CommitRange> {
    let repo = repo?;
    let head = head_commit(repo)?;
    let base = head_commit(&layer.workspace().join(".git"));
    (base.as_deref() != Some(head.as_str())).then(|| CommitRange {
        base,
        head,
        repo: repo.to_path_buf(),
    })
}

/// The commit a git dir's HEAD names, read as files (HEAD, a loose ref,
/// packed-refs), never through git; `None` when it names none.
pub fn head_commit(git_dir: &Path) -> Option<String> {
    use substrat_sandbox::gitdir::{HeadTarget, loose_ref, packed_ref, parse_head};
    let read = |p: &Path| {
        let meta = std::fs::symlink_metadata(p).ok()?;
        if !meta.is_file() || meta.len() > 1 << 20 {
            return None;
        }
        std::fs::read_to_string(p).ok()
    };
    let head = read(&git_dir.join("HEAD"))?;
    let name = match parse_head(&head)? {
        HeadTarget::Commit(id) => return Some(id.to_string()),
        HeadTarget::Ref(name) => name,
    };
    if let Some(loose) = read(&git_dir.join(name)) {
        return loose_ref(&loose).map(str::to_string);
    }
    packed_ref(&read(&git_dir.join("packed-refs"))?, name).map(str::to_string)
}

/// The changes under `paths` (all when none); a renamed file brings the
/// deletion of its source. A path that selects nothing is an error.
fn select(all: &[Change], workspace: &Path, paths: &[PathBuf]) -> Result<Vec<Change>> {
    if paths.is_empty() {
        return Ok(all.to_vec());
    }
    let mut chosen: Vec<Change> = Vec::new();
    for given in paths {
        let path = relative_to(workspace, given)?;
        let path = &path;
        let before = chosen.len();
        for c in all.iter().filter(|c| c.path.starts_with(path)) {
            chosen.push(c.clone());
            if let Some(from) = &c.renamed_from {
                chosen.extend(all.iter().filter(|d| &d.path == from).cloned());
            }
        }
        if chosen.len() == before {
            bail!("{}: the layer changes nothing there", given.display());
        }
    }
    chosen.sort_by(|a, b| a.path.cmp(&b.path));
    chosen.dedup_by(|a, b| a.path == b.path);
    Ok(chosen)
}

/// A PATH argument as a path below the workspace: `./src` and
/// `WORKSPACE/src` are `src`; one outside the workspace is an error.
fn relative_to(workspace: &Path, given: &Path) -> Result<PathBuf> {
    use std::path::Component;
    let below = if given.is_absolute() {
        given.strip_prefix(workspace).map_err(|_| {
            anyhow::anyhow!(
                "{} is not in the workspace {}",
                given.display(),
                workspace.display()
            )
        })?
    } else {
        given
    };
    let mut out = PathBuf::new();
    for part in below.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            _ => bail!(
                "{}: give a path below the workspace, without `..`",
                given.display()
            ),
        }
    }
    Ok(out)
}

fn print_report(report: &ApplyReport, force: bool, program: &str) {
    if !report.conflicts.is_empty() {
        let verb = if force {
            "overwritten (--force)"
        } else {
            "changed on the host"
        };
        eprintln!("{program}: {} path(s) {verb}:", report.conflicts.len());
        for (path, why) in &report.conflicts {
            eprintln!(
                "  {}: {}",
                substrat_layer::diff::quote(path),
                text::escape_text(why)
            );
        }
        if !force {
            eprintln!(
                "{program}: nothing applied; apply other paths, or --force to take the agent's side"
            );
        }
    }
    for (path, why) in &report.skipped {
        // Quoted as git quotes names: a name with control characters
        // could otherwise rewrite the terminal's lines.
        eprintln!(
            "{program}: skipped {}: {}",
            substrat_layer::diff::quote(path),
            text::escape_text(why)
        );
    }
    println!("applied {} path(s)", report.applied.len());
}
