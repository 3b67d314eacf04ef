//! `agent diff|review|apply|discard|rollback NAME`: the workspace layer of
//! an agent whose role has `workspace_mode = "overlay"`, kept by the
//! daemon in STATE/agents/ID/layer (a turn of the layer per turn of the
//! agent). The daemon names the agent; the layer is read and changed here,
//! under its lock (a turn starting meanwhile waits for it).
//!
//! `review` suspends the agent first, so no turn changes the layer while
//! its owner reads; the agent resumes when its changes are applied or
//! discarded (a mark in the agent's directory says review suspended it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use substrat_broker::control::Request;
use substrat_cli::layer_commands::{
    ApplyRequest, DiffFormat, apply_layer, commit_range, discard_layer, print_diff, rollback_layer,
};
use substrat_layer::Layer;
use substrat_layer::apply::ApplyOptions;

use crate::{AgentArgs, AgentCommand};

/// The mark `review` leaves in the agent's directory.
const REVIEW_MARK: &str = "suspended-for-review";

/// How long `review` waits for a turn it stopped to let go of the layer.
const REVIEW_WAIT: Duration = Duration::from_secs(60);

/// Carries out a layer command; `None` for every other agent command.
pub fn run(state_dir: &Path, args: &AgentArgs) -> Result<Option<ExitCode>> {
    let program = "substrat-sandbox agent";
    let name = match &args.command {
        AgentCommand::Diff { name, .. }
        | AgentCommand::Review { name, .. }
        | AgentCommand::Apply { name, .. }
        | AgentCommand::Discard { name }
        | AgentCommand::Rollback { name, .. } => name,
        _ => return Ok(None),
    };
    if let AgentCommand::Review { stat, .. } = &args.command {
        return review(state_dir, name, diff_format(args.json, *stat)).map(Some);
    }
    let (layer, agent_dir) = agent_layer(state_dir, name)?;
    let code = match &args.command {
        AgentCommand::Diff { stat, .. } => {
            let repo = agent_dir.join("git").join("repo");
            let commits = commit_range(&layer, Some(repo.as_path()));
            let lock = layer.lock()?;
            let format = diff_format(args.json, *stat);
            print_diff(&layer, format, commits.as_ref(), &lock)?
        }
        AgentCommand::Apply {
            paths,
            force,
            expect,
            ..
        } => {
            let request = ApplyRequest {
                paths,
                options: ApplyOptions { force: *force },
                expect: expect.as_deref(),
                json: args.json,
                program,
            };
            let code = apply_layer(&layer, &request)?;
            resume_after_review(state_dir, name, &agent_dir)?;
            code
        }
        AgentCommand::Discard { .. } => {
            let code = discard_layer(&layer, args.json)?;
            resume_after_review(state_dir, name, &agent_dir)?;
            code
        }
        AgentCommand::Rollback { turn, .. } => rollback_layer(&layer, *turn, args.json)?,
        _ => return Ok(None),
    };
    Ok(Some(code))
}

fn diff_format(json: bool, stat: bool) -> DiffFormat {
    match (json, stat) {
        (true, _) => DiffFormat::Json,
        (false, true) => DiffFormat::Stat,
        (false, false) => DiffFormat::Patch,
    }
}

/// Suspends the agent (its running turn stopped), then shows its changes
/// once the turn has let go of the layer.
fn review(state_dir: &Path, name: &str, format: DiffFormat) -> Result<ExitCode> {
    let (layer, agent_dir) = agent_layer(state_dir, name)?;
    let reply = crate::daemon::call(
        state_dir,
        &Request::Suspend {
            name: name.to_string(),
        },
    )?;
    if reply["suspended"].is_null() {
        bail!(
            "cannot suspend `{name}` for review: {}",
            reply["message"].as_str().unwrap_or("the daemon refused")
        );
    }
    let mark = agent_dir.join(REVIEW_MARK);
    std::fs::write(&mark, b"")
        .with_context(|| format!("cannot mark {} as suspended for review", mark.display()))?;
    eprintln!(
        "substrat-sandbox agent: suspended `{name}` for review; it resumes after `agent apply` or `agent discard`"
    );
    let lock = layer.lock_waiting(REVIEW_WAIT)?;
    let repo = agent_dir.join("git").join("repo");
    let commits = commit_range(&layer, Some(repo.as_path()));
    print_diff(&layer, format, commits.as_ref(), &lock)
}

/// Resumes an agent `review` suspended (and only such an agent).
fn resume_after_review(state_dir: &Path, name: &str, agent_dir: &Path) -> Result<()> {
    let mark = agent_dir.join(REVIEW_MARK);
    if std::fs::symlink_metadata(&mark).is_err() {
        return Ok(());
    }
    let reply = crate::daemon::call(
        state_dir,
        &Request::Resume {
            name: name.to_string(),
        },
    )?;
    if reply["resumed"].is_null() {
        bail!(
            "the changes are done, but `{name}` did not resume: {}",
            reply["message"].as_str().unwrap_or("the daemon refused")
        );
    }
    std::fs::remove_file(&mark).with_context(|| format!("cannot remove {}", mark.display()))?;
    eprintln!("substrat-sandbox agent: resumed `{name}` after its review");
    Ok(())
}

/// The agent's layer (and its state directory), named by the daemon.
fn agent_layer(state_dir: &Path, name: &str) -> Result<(Layer, PathBuf)> {
    let reply = crate::daemon::call(
        state_dir,
        &Request::Inspect {
            name: name.to_string(),
        },
    )?;
    let Some(id) = reply["agent"]["id"].as_str() else {
        bail!(
            "{} ({})",
            reply["message"].as_str().unwrap_or("no such agent"),
            reply["error"].as_str().unwrap_or("error")
        );
    };
    let dir = substrat_broker::turns::layer_dir(state_dir, id);
    let agent_dir = state_dir.join("agents").join(id);
    match Layer::open(&dir) {
        Ok(layer) => Ok((layer, agent_dir)),
        Err(substrat_layer::LayerError::NotALayer(_)) => bail!(
            "agent `{name}` has no workspace layer: its role's workspace_mode is \"direct\" (its writes are in its workspace already), or it has had no turn yet"
        ),
        Err(e) => Err(e.into()),
    }
}
