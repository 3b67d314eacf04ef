//! The daemon's turns: started after what the last run left is put
//! right (turns queued again, containers of none removed), and the
//! containers of its turns removed when it stops.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{DaemonError, other};
use crate::broker::Broker;
use crate::turns::container::{ContainerEngine, record, sweep};

/// Turns that were running when the daemon died are queued again (their
/// sandboxes died with it: the launcher's parent-death signal; their
/// containers are swept first); then the scheduler starts, when there is
/// a provider to run turns with.
pub(super) async fn start_turns(
    broker: &Arc<Broker>,
    turns: Option<crate::turns::TurnConfig>,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    let recovered = broker.recover_running().map_err(|e| {
        DaemonError::Io("recover turns".into(), std::io::Error::other(e.to_string()))
    })?;
    if recovered > 0 {
        tracing::warn!(
            turns = recovered,
            "turns interrupted by the last shutdown are queued again"
        );
    }
    let engine = turns.as_ref().and_then(|t| t.engine.as_ref());
    sweep_recorded(broker, engine).await;
    if let Some(engine) = engine {
        sweep_at_start(broker, engine).await;
    }
    Ok(match turns {
        Some(turns) => {
            tracing::info!(providers = ?turns.providers.names(), default = turns.providers.default_name(),
                gateway = turns.gateway.is_some(), slots = turns.slots, backend = %turns.backend,
                "turns run in sandboxes");
            broker
                .set_providers(turns.providers.names(), turns.providers.default_name())
                .map_err(other("declare the roles and providers run here"))?;
            let runner = crate::turns::TurnRunner::new(turns, broker).map_err(|e| {
                DaemonError::Io("the turns' setup (model gateway, warm pool)".into(), e)
            })?;
            Some(tokio::spawn(crate::turns::schedule(
                broker.clone(),
                Arc::new(runner),
            )))
        }
        None => {
            tracing::warn!("no provider: turns stay queued until the daemon is started with one");
            broker
                .declare_roles()
                .map_err(other("declare the roles run here"))?;
            None
        }
    })
}

/// The containers of the engine the last run recorded (the state
/// directory's), when it is not this run's: a daemon started again
/// without `--engine`, or with another, removes them too. The record is
/// then this run's engine (kept while its old engine cannot be swept and
/// this run has none).
async fn sweep_recorded(broker: &Broker, current: Option<&ContainerEngine>) {
    let state = broker.state_dir();
    if let Some(last) = record::recorded_other(state, current)
        && !sweep_at_start(broker, &last).await
        && current.is_none()
    {
        return;
    }
    if let Err(e) = record::record(state, current) {
        tracing::error!(error = %e, "cannot record the engine this daemon's turns run on");
    }
}

/// Removes the containers a daemon killed or crashed left (no turn is
/// live yet): before a turn they ran is run again. False when the engine
/// could not be asked.
async fn sweep_at_start(broker: &Broker, engine: &ContainerEngine) -> bool {
    match sweep::sweep(engine, &broker.daemon_id(), true).await {
        Ok(removed) => {
            tracing::info!(
                engine = engine.name(),
                removed = removed.len(),
                "the containers of this daemon's last run removed"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                engine = engine.name(),
                error = %e,
                "cannot list this daemon's containers: what a crash left may still run"
            );
            false
        }
    }
}

/// How long a stopping daemon waits for its turns' tasks to end before
/// it removes their containers.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// At shutdown: the running turns stopped, every container of this
/// daemon removed, then the turns queued again (as after a crash; done
/// here too, for a turn whose task ends with the daemon first).
pub(super) async fn stop_containers(broker: &Broker, engine: &ContainerEngine) {
    engine.stop_claims();
    let stopped = broker.stop_turns_for_shutdown();
    // A turn claimed between its claim and its spawn starts its container
    // still: the sweep waits (a while) for the turns' tasks to end.
    let deadline = tokio::time::Instant::now() + STOP_WAIT;
    while !engine.idle() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if let Err(e) = sweep::sweep(engine, &broker.daemon_id(), false).await {
        tracing::error!(engine = engine.name(), error = %e, "cannot remove this daemon's containers");
    }
    for turn in stopped {
        if let Err(e) = broker.requeue_turn(&turn) {
            tracing::error!(turn = %turn, error = %e, "cannot queue the stopped turn again");
        }
    }
}
