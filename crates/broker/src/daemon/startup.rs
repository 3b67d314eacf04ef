//! What a person starting the daemon on a terminal waits for: its
//! upstream servers coming up. The daemon reports each server's first
//! start (up, or down with its reason in the log) to a `StartupProgress`
//! the binary gives it; without one (JSON logs, stderr not a terminal)
//! nothing of this runs and the log is as it always was.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::upstream::registry::ServerStatus;

/// How often the servers' states are looked at.
const POLL: Duration = Duration::from_millis(100);

/// Told of the daemon's startup steps (the CLI draws them as a line).
pub trait StartupProgress: Send + Sync {
    /// `total` steps begin.
    fn begin(&self, total: usize);
    /// One ended: `item` is the server's name.
    fn step(&self, item: &str);
    /// Every step ended: the line goes, before the summary is logged.
    fn end(&self);
}

/// The daemon's `StartupProgress`, if any.
#[derive(Clone)]
pub struct Startup(pub Arc<dyn StartupProgress>);

impl std::fmt::Debug for Startup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Startup")
    }
}

/// Follows every enabled server until its first start ended, then logs
/// how many are up (the line cleared first).
pub(super) async fn follow_upstreams(broker: Arc<Broker>, progress: Startup) {
    let slots = &broker.upstreams().slots;
    let mut pending: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].enabled()).collect();
    if pending.is_empty() {
        return;
    }
    progress.0.begin(pending.len());
    loop {
        pending.retain(|&i| {
            let slot = &slots[i];
            let state = slot.read();
            let started = state.status != ServerStatus::Starting || state.restarts > 0;
            drop(state);
            if started {
                progress.0.step(&slot.config.name);
            }
            !started
        });
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    progress.0.end();
    let up = slots
        .iter()
        .filter(|s| matches!(s.read().status, ServerStatus::Up { .. }))
        .count();
    let enabled = slots.iter().filter(|s| s.enabled()).count();
    tracing::info!(up, down = enabled - up, "upstream servers started");
}
