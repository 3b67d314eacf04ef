//! `agent diff|apply|discard|rollback NAME`: the workspace layer of an
//! agent whose role has `workspace_mode = "overlay"`, kept by the daemon
//! in STATE/agents/ID/layer (a turn of the layer per turn of the agent).
//! The daemon names the agent; the layer is read and changed here, under
//! its lock (a turn starting meanwhile waits for it).

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use substrat_broker::control::Request;
use substrat_cli::workspace_layer::{
    DiffFormat, apply_layer, commit_range, discard_layer, print_diff, rollback_layer,
};
use substrat_layer::Layer;
use substrat_layer::apply::ApplyOptions;

use crate::{AgentArgs, AgentCommand};

/// Carries out a layer command; `None` for every other agent command.
pub fn run(state_dir: &Path, args: &AgentArgs) -> Result<Option<ExitCode>> {
    let program = "substrat-sandbox agent";
    let name = match &args.command {
        AgentCommand::Diff { name, .. }
        | AgentCommand::Apply { name, .. }
        | AgentCommand::Discard { name }
        | AgentCommand::Rollback { name, .. } => name,
        _ => return Ok(None),
    };
    let (layer, agent_dir) = agent_layer(state_dir, name)?;
    let code = match &args.command {
        AgentCommand::Diff { stat, .. } => {
            let format = match (args.json, stat) {
                (true, _) => DiffFormat::Json,
                (false, true) => DiffFormat::Stat,
                (false, false) => DiffFormat::Patch,
            };
            let repo = agent_dir.join("git").join("repo");
            let commits = commit_range(&layer, Some(repo.as_path()));
            print_diff(&layer, format, commits.as_ref())?
        }
        AgentCommand::Apply { paths, force, .. } => {
            let options = ApplyOptions { force: *force };
            apply_layer(&layer, paths, options, args.json, program)?
        }
        AgentCommand::Discard { .. } => discard_layer(&layer, args.json)?,
        AgentCommand::Rollback { turn, .. } => rollback_layer(&layer, *turn, args.json)?,
        _ => return Ok(None),
    };
    Ok(Some(code))
}

/// The agent's layer (and its state directory), named by the daemon.
fn agent_layer(state_dir: &Path, name: &str) -> Result<(Layer, std::path::PathBuf)> {
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
