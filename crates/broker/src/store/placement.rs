//! Placement in the database: what each daemon offers (its free slots,
//! the paths it shares with the others), the live daemons as the planner
//! (crate::placement) sees them, and a new agent handed to the daemon the
//! planner chose, under that daemon's row lock so that it is neither full
//! nor silent when it gets the agent.

use std::path::PathBuf;

use super::db::{Db, Engine, args};
use super::{Store, StoreError};
use crate::placement::{Candidate, Plan};

/// What this daemon offers the team's other daemons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offer {
    /// The agents it runs at most, counting those made elsewhere; none:
    /// it takes none made elsewhere.
    pub max_agents: Option<u32>,
    /// Directories it reaches as the other daemons declaring them do
    /// (resolved at start).
    pub shared_paths: Vec<PathBuf>,
    /// Its state directory, where its agents' sockets are.
    pub state_dir: Option<PathBuf>,
}

/// Where and why an agent runs, as the database records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDaemon {
    pub agent_id: String,
    pub daemon_id: Option<String>,
    /// Why it runs there (`placed: ...`, `here: ...`, `adopted ...`);
    /// none for agents made before placement.
    pub why: Option<String>,
}

impl Store {
    /// Records what this daemon offers (after `register_daemon`).
    pub fn declare_offer(&self, offer: &Offer) -> Result<(), StoreError> {
        let paths: Vec<String> = offer
            .shared_paths
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let paths = serde_json::to_string(&paths).unwrap_or_else(|_| "[]".into());
        let state_dir = offer.state_dir.as_ref().map(|d| d.display().to_string());
        self.db.execute(
            "UPDATE daemons SET max_agents = ?2, shared_paths = ?3, state_dir = ?4 WHERE id = ?1",
            args![
                self.seat.daemon_id,
                offer.max_agents.map(i64::from),
                paths,
                state_dir
            ],
        )?;
        Ok(())
    }

    /// The daemons whose heartbeat is younger than the lease, with the
    /// agents each runs now, by id.
    pub fn live_daemons(&self) -> Result<Vec<Candidate>, StoreError> {
        let stale_before = self.db.now_ms()? - self.seat.lease_ms;
        let rows = self.db.rows(
            "SELECT d.id, d.name, d.max_agents, d.shared_paths,
                    (SELECT COUNT(*) FROM agents a WHERE a.daemon_id = d.id)
             FROM daemons d WHERE d.heartbeat_at >= ?1 ORDER BY d.id",
            args![stale_before],
        )?;
        rows.iter()
            .map(|r| {
                let max: Option<i64> = r.get(2)?;
                let paths: String = r.get(3)?;
                let paths: Vec<String> = serde_json::from_str(&paths).unwrap_or_default();
                Ok(Candidate {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    max_agents: max.map(|m| u32::try_from(m).unwrap_or(u32::MAX)),
                    agents: u32::try_from(r.get::<i64>(4)?).unwrap_or(u32::MAX),
                    shared_paths: paths.into_iter().map(PathBuf::from).collect(),
                })
            })
            .collect()
    }

    /// The daemon that runs each agent and why.
    pub fn agent_daemons(&self) -> Result<Vec<AgentDaemon>, StoreError> {
        let rows = self
            .db
            .rows("SELECT id, daemon_id, placed FROM agents ORDER BY id", &[])?;
        rows.iter()
            .map(|r| {
                Ok(AgentDaemon {
                    agent_id: r.get(0)?,
                    daemon_id: r.get(1)?,
                    why: r.get(2)?,
                })
            })
            .collect()
    }

    /// Each daemon's state directory, by id (those that declared one).
    pub fn daemon_state_dirs(&self) -> Result<Vec<(String, PathBuf)>, StoreError> {
        let rows = self.db.rows(
            "SELECT id, state_dir FROM daemons WHERE state_dir IS NOT NULL",
            &[],
        )?;
        rows.iter()
            .map(|r| Ok((r.get(0)?, PathBuf::from(r.get::<String>(1)?))))
            .collect()
    }
}

/// Inside the new agent's transaction: the daemon it goes to and why. The
/// planner's choice holds only if, under its row's lock, that daemon is
/// still alive (a lease's worth of heartbeat) and has a free slot; an
/// adoption of its agents takes the same lock, and so do other daemons
/// placing on it at once, which then count this agent. Otherwise the
/// agent stays on `me`, saying why.
pub(super) fn settle(
    tx: &Db,
    me: &str,
    lease_ms: i64,
    plan: Option<&Plan>,
) -> Result<(String, Option<String>), StoreError> {
    let Some(plan) = plan else {
        return Ok((me.to_owned(), None));
    };
    if plan.here {
        return Ok((me.to_owned(), Some(plan.reason.clone())));
    }
    let lock = match tx.engine() {
        Engine::Postgres => " FOR UPDATE",
        Engine::Sqlite => "",
    };
    let target = tx.row(
        &format!("SELECT heartbeat_at, max_agents, name FROM daemons WHERE id = ?1{lock}"),
        args![plan.daemon_id],
    )?;
    let Some(target) = target else {
        return Ok((
            me.to_owned(),
            Some("here: the daemon chosen is gone".into()),
        ));
    };
    let (beat, max, name): (i64, Option<i64>, String) =
        (target.get(0)?, target.get(1)?, target.get(2)?);
    if beat < tx.now_ms()? - lease_ms {
        return Ok((
            me.to_owned(),
            Some(format!("here: daemon {name}, chosen, stopped answering")),
        ));
    }
    let agents: i64 = tx
        .one(
            "SELECT COUNT(*) FROM agents WHERE daemon_id = ?1",
            args![plan.daemon_id],
        )?
        .get(0)?;
    if max.is_none_or(|max| agents >= max) {
        return Ok((
            me.to_owned(),
            Some(format!("here: daemon {name}, chosen, was full by then")),
        ));
    }
    Ok((plan.daemon_id.clone(), Some(plan.reason.clone())))
}
