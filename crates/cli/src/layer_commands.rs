//! `workspace diff|apply|discard|rollback|turns DIR`, and the same for a
//! daemon's agent (`agent diff|apply|review ...`): what a layer changes
//! shown with a digest of it, and applied only as it was shown.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use substrat_layer::apply::{ApplyOptions, ApplyReport};
use substrat_layer::{Change, Layer, LayerLock, review};
use substrat_policy::text;
use substrat_sandbox::gitscan::{RootGit, find_nested};

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
    /// Apply only if the layer's changes are the ones whose digest `diff` printed (at least 16 hex digits); without it, only if nothing changed since the last diff.
    #[arg(long, value_name = "DIGEST")]
    pub expect: Option<String>,
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
            let lock = layer.lock()?;
            print_diff(&layer, format, commits.as_ref(), &lock)
        }
        WorkspaceCommand::Apply(a) => {
            let request = ApplyRequest {
                paths: &a.paths,
                options: ApplyOptions { force: a.force },
                expect: a.expect.as_deref(),
                json: a.json,
                program,
            };
            apply_layer(&Layer::open(&a.layer)?, &request)
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

/// Prints what the layer changes with the digest of it, and records that
/// it was shown (`review`). The lock is held while reading: a turn running
/// over the layer would change it under the reader.
pub fn print_diff(
    layer: &Layer,
    format: DiffFormat,
    commits: Option<&CommitRange>,
    lock: &LayerLock,
) -> Result<ExitCode> {
    let changes = substrat_layer::changes(layer)?;
    let digest = review::digest(layer)?;
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
                digest: &'a str,
            }
            let value = DiffJson {
                workspace: layer.workspace(),
                layer: layer.dir(),
                turns: layer.turns()?,
                bytes: layer.size()?,
                changes: &changes,
                commits,
                digest: &digest,
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
            println!("{}", digest_line(&digest));
        }
        DiffFormat::Patch => {
            // Before the first `diff --git`, where `git apply` skips text.
            println!("# {}", digest_line(&digest));
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
    review::record(layer, &digest, lock)?;
    Ok(ExitCode::SUCCESS)
}

fn digest_line(digest: &str) -> String {
    format!("digest {digest} (apply --expect {digest} applies exactly these changes)")
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

/// What `apply` is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct ApplyRequest<'a> {
    /// Only these paths (all when empty).
    pub paths: &'a [PathBuf],
    pub options: ApplyOptions,
    /// `--expect DIGEST`; without it, the last diff's record is the check.
    pub expect: Option<&'a str>,
    pub json: bool,
    pub program: &'a str,
}

/// Changes from which `apply` draws its progress line (on a terminal).
const PROGRESS_FROM: usize = 200;

pub fn apply_layer(layer: &Layer, request: &ApplyRequest<'_>) -> Result<ExitCode> {
    let ApplyRequest {
        paths,
        options,
        expect,
        json,
        program,
    } = *request;
    let lock = layer.lock()?;
    let all = substrat_layer::changes(layer)?;
    let expectation = expect.map_or(review::Expect::LastReview, review::Expect::Digest);
    review::check(layer, expectation, &lock)?;
    let chosen = select(&all, layer.workspace(), paths)?;
    let workspace = layer.workspace();
    eprintln!(
        "{program}: applying {} of the layer's {} change(s) to the workspace {} (as reviewed)",
        chosen.len(),
        all.len(),
        text::escape_path(workspace),
    );
    // Apply refuses every `.git` path, but a directory git takes for a bare
    // repository (HEAD, objects, refs) is made of names it does not: the
    // repositories there before are known, any other one after is made
    // inert, as after a direct run (crate::workspace_git).
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
    // A large layer takes a while: a person at a terminal sees how far.
    let mut progress = None;
    let mut written = |path: &Path, total: usize| {
        if total >= PROGRESS_FROM {
            let line =
                progress.get_or_insert_with(|| crate::progress::Progress::new("applying", total));
            line.step(&path.to_string_lossy());
        }
    };
    let report = substrat_layer::apply::apply_with_progress(
        layer,
        &lock,
        &chosen,
        options,
        &bare,
        &mut written,
    );
    drop(progress);
    let inert = crate::workspace_git::quarantine_and_say(
        workspace,
        RootGit::Scanned,
        &before.found,
        program,
    );
    let report = report?;
    // What is left was reviewed with the rest: a later plain apply of it
    // compares with that.
    review::record(layer, &review::digest(layer)?, &lock)?;
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
    review::forget(layer, &lock)?;
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
