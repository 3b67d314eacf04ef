//! This daemon's seat among the daemons of one database: its identity,
//! kept in its state directory (a restarted daemon is the same one and
//! queues its own interrupted turns again), the name operators see, and
//! the task that beats its heart, fails the turns of daemons that stopped
//! and adopts their agents (store::daemons).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::store::Seat;

/// How long a running turn's lease lasts without a heartbeat, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// At most this many agents adopted per beat: a dead daemon's work is
/// shared by the daemons alive.
const ADOPT_PER_BEAT: usize = 16;

/// The daemon's id: `STATE_DIR/daemon.id`, made (0600) on first start.
pub fn daemon_id(state_dir: &Path) -> std::io::Result<String> {
    let path = state_dir.join("daemon.id");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            uuid::Uuid::parse_str(id).map_err(|_| {
                std::io::Error::other(format!(
                    "{} does not hold a daemon id (a UUID); remove it to make a new one",
                    path.display()
                ))
            })?;
            Ok(id.to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::new_v4().to_string();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            writeln!(file, "{id}")?;
            file.sync_all()?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// The name operators see in `agent list`: host and state directory.
pub fn daemon_name(state_dir: &Path) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", state_dir.display())
}

pub fn seat(daemon_id: String, lease: Duration) -> Seat {
    Seat {
        daemon_id,
        lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
    }
}

/// Beats every third of the lease until dropped. A beat that fails (the
/// database unreachable) is logged and tried again at the next: the
/// turns' leases then run out as they should.
pub async fn keep(broker: Arc<Broker>, lease: Duration) {
    let every = (lease / 3).max(Duration::from_millis(250));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = broker.keep_seat(ADOPT_PER_BEAT) {
            tracing::error!(error = %e, "cannot keep this daemon's seat in the state database");
        }
    }
}

/// With PostgreSQL: wakes the scheduler as soon as another daemon queues a
/// turn for one of this daemon's agents (LISTEN/NOTIFY); the scheduler's
/// poll (every second) stays the fallback while this listener is down.
pub async fn listen(broker: Arc<Broker>, url: String, daemon_id: String) {
    loop {
        let wake = |payload: &str| {
            if payload == daemon_id {
                broker.wake.notify_one();
            }
        };
        if let Err(e) = crate::store::listen_for_turns(&url, wake).await {
            tracing::warn!(error = %e, "cannot listen for other daemons' turns; polling");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// PostgreSQL: stops this daemon's turns once its heartbeat has failed for
/// two thirds of the lease (Broker::stop_turns_if_cut_off), checked apart
/// from the beats, which may be blocked on the database.
pub async fn watch(broker: Arc<Broker>, lease: Duration) {
    let every = (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        broker.stop_turns_if_cut_off(lease);
    }
}
