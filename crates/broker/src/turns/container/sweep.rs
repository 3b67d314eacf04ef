//! Nothing left behind: the daemon's containers found by its label and
//! removed (at its start, after a crash or SIGKILL left some running; at
//! its shutdown; a timed-out turn's), sparing those of turns running now.
//! The engine's commands are pure (tested whole); running them is here.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::engine::DAEMON_LABEL;
use super::{ContainerEngine, EngineKind};

/// How long one engine command may take.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot run {}: {source}", program.display())]
    Start {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{} did not answer within {} s", program.display(), ENGINE_TIMEOUT.as_secs())]
    Timeout { program: PathBuf },
    #[error("{} {args}: {stderr}", program.display())]
    Failed {
        program: PathBuf,
        args: String,
        stderr: String,
    },
}

/// The arguments that list the names of the containers labelled with
/// `daemon` (running or not), one a line.
pub(super) fn list_args(kind: &EngineKind, daemon: &str) -> Vec<String> {
    match kind {
        EngineKind::Podman => vec![
            "ps".into(),
            "--all".into(),
            "--filter".into(),
            format!("label={DAEMON_LABEL}={daemon}"),
            "--format".into(),
            "{{.Names}}".into(),
        ],
        EngineKind::Containerd { .. } => {
            let mut args = ctr_prefix(kind);
            args.extend([
                "containers".into(),
                "list".into(),
                "--quiet".into(),
                format!("labels.\"{DAEMON_LABEL}\"=={daemon}"),
            ]);
            args
        }
    }
}

/// The commands that end and remove the container `name` (each may fail
/// when there is nothing of it left to end).
pub(super) fn remove_args(kind: &EngineKind, name: &str) -> Vec<Vec<String>> {
    match kind {
        EngineKind::Podman => vec![vec![
            "rm".into(),
            "--force".into(),
            "--time".into(),
            "0".into(),
            name.into(),
        ]],
        EngineKind::Containerd { .. } => {
            // The task killed and deleted (SIGKILL to every process of the
            // container), then the container's record.
            let task = ["tasks", "delete", "--force", name];
            let container = ["containers", "delete", name];
            [&task[..], &container[..]]
                .iter()
                .map(|words| {
                    let mut args = ctr_prefix(kind);
                    args.extend(words.iter().map(|w| w.to_string()));
                    args
                })
                .collect()
        }
    }
}

fn ctr_prefix(kind: &EngineKind) -> Vec<String> {
    match kind {
        EngineKind::Containerd { address, namespace } => vec![
            "--address".into(),
            address.display().to_string(),
            "--namespace".into(),
            namespace.clone(),
        ],
        EngineKind::Podman => Vec::new(),
    }
}

/// The names of `engine`'s containers labelled with `daemon`.
pub async fn labelled(engine: &ContainerEngine, daemon: &str) -> Result<Vec<String>, SweepError> {
    let out = engine_run(engine, &list_args(&engine.kind, daemon)).await?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect())
}

/// Removes every container labelled with `daemon` but those of turns
/// running now (unless `spare_live` is false: the daemon is stopping);
/// returns the names removed. Those still there after (listed again: an
/// engine client may have removed one meanwhile) are logged.
pub async fn sweep(
    engine: &ContainerEngine,
    daemon: &str,
    spare_live: bool,
) -> Result<Vec<String>, SweepError> {
    let live = if spare_live {
        engine.live_names()
    } else {
        Default::default()
    };
    let found: Vec<String> = labelled(engine, daemon)
        .await?
        .into_iter()
        .filter(|name| !live.contains(name))
        .collect();
    if found.is_empty() {
        return Ok(found);
    }
    for name in &found {
        remove(engine, name).await;
    }
    let left = labelled(engine, daemon).await?;
    let (removed, stayed): (Vec<String>, Vec<String>) =
        found.into_iter().partition(|name| !left.contains(name));
    if !removed.is_empty() {
        tracing::warn!(engine = engine.name(), containers = ?removed, "containers of no live turn of this daemon removed");
    }
    if !stayed.is_empty() {
        tracing::error!(engine = engine.name(), containers = ?stayed, "containers of this daemon could not be removed");
    }
    Ok(removed)
}

/// Ends and removes the container `name` (a step that fails is logged:
/// the task may have ended, the container been removed by its client).
pub(super) async fn remove(engine: &ContainerEngine, name: &str) {
    for args in remove_args(&engine.kind, name) {
        if let Err(e) = engine_run(engine, &args).await {
            tracing::debug!(container = name, error = %e, "removing a turn's container");
        }
    }
}

/// Runs the engine's client with `args` (its environment the engine's
/// only); its stdout.
async fn engine_run(engine: &ContainerEngine, args: &[String]) -> Result<Vec<u8>, SweepError> {
    let mut command = Command::new(&engine.program);
    command
        .env_clear()
        .envs(engine.client_env())
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let program = engine.program.clone();
    let out = tokio::time::timeout(ENGINE_TIMEOUT, command.output())
        .await
        .map_err(|_| SweepError::Timeout {
            program: program.clone(),
        })?
        .map_err(|source| SweepError::Start {
            program: program.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(SweepError::Failed {
            program,
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}
