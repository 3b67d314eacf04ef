//! The daemons serving one database, the agents each runs, and the leases
//! on their running turns. An agent's turns run on one daemon, its owner:
//! its home (its CLI's sessions), chats and socket are in that daemon's
//! state directory. Each daemon beats its heart in the database and so
//! extends the leases of the turns it runs; when it stops beating, its
//! running turns fail once their lease runs out and another daemon adopts
//! its agents and runs their queued turns. A daemon's identity is kept in
//! its state directory, so a restarted daemon is the same one.

use super::db::{Db, Engine, args};
use super::rows::*;
use super::turns::{Fence, fail_turn};
use super::{Store, StoreError};

/// Who claims and runs turns through this store, and how long a running
/// turn's lease lasts without a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    pub daemon_id: String,
    pub lease_ms: i64,
}

impl Default for Seat {
    /// A store opened without a daemon (tests, `check`): one daemon.
    fn default() -> Self {
        Seat {
            daemon_id: "local".into(),
            lease_ms: 30_000,
        }
    }
}

/// A daemon the database knows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DaemonRow {
    pub id: String,
    pub name: String,
    pub pid: i64,
    pub heartbeat_at: i64,
}

impl Store {
    /// From now on this store claims, runs and creates for `seat`.
    pub fn take_seat(&mut self, seat: Seat) {
        self.seat = seat;
    }

    pub fn seat(&self) -> &Seat {
        &self.seat
    }

    /// Records this store's daemon (`name`: where it runs, for operators),
    /// alive now.
    pub fn register_daemon(&self, name: &str) -> Result<(), StoreError> {
        let now = self.db.now_ms()?;
        self.db.execute(
            "INSERT INTO daemons (id, name, pid, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT(id) DO UPDATE SET name = ?2, pid = ?3, started_at = ?4, heartbeat_at = ?4",
            args![self.seat.daemon_id, name, i64::from(std::process::id()), now],
        )?;
        Ok(())
    }

    /// This daemon is alive: its heartbeat, and the leases of the turns it
    /// runs now (`running`: their ids), moved on. A turn marked running
    /// that no task of it runs (its end could not be recorded) keeps its
    /// lease, which runs out.
    pub fn heartbeat(&mut self, running: &[String]) -> Result<(), StoreError> {
        let (me, lease) = (self.seat.daemon_id.clone(), self.seat.lease_ms);
        self.db.transaction(|tx| {
            let now = tx.now_ms()?;
            tx.execute(
                "UPDATE daemons SET heartbeat_at = ?2 WHERE id = ?1",
                args![me, now],
            )?;
            // Locked in one order (sorted ids), as every transaction
            // locking several turns does.
            let mut running: Vec<&String> = running.iter().collect();
            running.sort();
            for turn in running {
                tx.execute(
                    "UPDATE turns SET lease_until = ?3 WHERE id = ?2 AND daemon_id = ?1 AND status = 'running'",
                    args![me, turn, now + lease],
                )?;
            }
            Ok(())
        })
    }

    /// Every daemon the database knows, by name.
    pub fn daemons(&self) -> Result<Vec<DaemonRow>, StoreError> {
        let rows = self.db.rows(
            "SELECT id, name, pid, heartbeat_at FROM daemons ORDER BY name, id",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                Ok(DaemonRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    pid: r.get(2)?,
                    heartbeat_at: r.get(3)?,
                })
            })
            .collect()
    }

    /// Takes up to `limit` of the agents no live daemon runs: never
    /// assigned (a database from before daemons were recorded) or run by a
    /// daemon whose heartbeat is older than the lease; those with queued
    /// turns first, so the daemons alive share a dead one's work as their
    /// free slots allow. Each is taken by one daemon only (a conditional
    /// update). An agent taken from another daemon starts a new session
    /// here: its old one is on that daemon's host.
    /// With `from_others` false, only agents never assigned.
    pub fn adopt_agents(
        &mut self,
        limit: usize,
        from_others: bool,
    ) -> Result<Vec<Agent>, StoreError> {
        let (me, lease) = (self.seat.daemon_id.clone(), self.seat.lease_ms);
        self.db.transaction(|tx| {
            // Nobody's heartbeat is older than this when others are not
            // judged: only the unassigned match.
            let stale_before = if from_others {
                tx.now_ms()? - lease
            } else {
                i64::MIN
            };
            let sql = format!(
                "SELECT {AGENT_COLUMNS}, daemon_id FROM agents WHERE (daemon_id IS NULL
                 OR (daemon_id <> ?1 AND NOT EXISTS (SELECT 1 FROM daemons d
                     WHERE d.id = agents.daemon_id AND d.heartbeat_at >= ?2)))
                 ORDER BY (SELECT COUNT(*) FROM turns t WHERE t.agent_id = agents.id AND t.status = 'queued') = 0,
                          created_at, name"
            );
            // Not limited here: those this daemon cannot run (below) must
            // not take the places of those it can.
            let candidates = tx.rows(&sql, args![me, stale_before])?;
            let mut found = Vec::new();
            for row in &candidates {
                found.push((agent_row(row)?, row.get::<Option<String>>(AGENT_COLUMN_COUNT)?));
            }
            // Every silent daemon's row locked first, in one order for
            // all (sorted ids), then the agents in theirs: two daemons
            // adopting at once never wait for each other in a cycle.
            let mut olds: Vec<&String> = found.iter().filter_map(|(_, d)| d.as_ref()).collect();
            olds.sort();
            olds.dedup();
            let mut silent = std::collections::HashMap::new();
            for old in olds {
                silent.insert(old.clone(), still_silent(tx, old, stale_before)?);
            }
            // Only what this daemon can run (as placement judges), at
            // most `limit`, in the order above; then locked by id.
            let mut found = super::placement::adoptable(tx, &me, found, &silent, limit)?;
            found.sort_by(|a, b| a.0.id.cmp(&b.0.id));
            let mut adopted = Vec::new();
            for (agent, from, kind) in found {
                let taken = match &from {
                    None => tx.execute(
                        "UPDATE agents SET daemon_id = ?2, placed = 'adopted: no daemon ran it', placed_kind = 'adopted' WHERE id = ?1 AND daemon_id IS NULL",
                        args![agent.id, me],
                    )?,
                    Some(old) if silent.get(old) == Some(&true) => tx.execute(
                        "UPDATE agents SET daemon_id = ?2, session_id = NULL, placed_kind = ?4,
                           placed = 'adopted from daemon ' || COALESCE((SELECT name FROM daemons WHERE id = ?3), ?3) || ' after its lease ran out'
                         WHERE id = ?1 AND daemon_id = ?3",
                        args![agent.id, me, old, kind.as_str()],
                    )?,
                    Some(_) => 0,
                };
                if taken == 1 {
                    adopted.push(agent);
                }
            }
            Ok(adopted)
        })
    }

    /// Fails the running turns whose lease ran out (their daemon stopped
    /// beating): whoever waits for their answer is told. Returns how many.
    pub fn expire_leases(&mut self) -> Result<usize, StoreError> {
        self.db.transaction(|tx| {
            let now = tx.now_ms()?;
            let expired = tx.rows(
                "SELECT id FROM turns WHERE status = 'running' AND lease_until < ?1 ORDER BY id",
                args![now],
            )?;
            let mut failed = 0;
            for row in expired {
                let id: String = row.get(0)?;
                let reason = "its daemon stopped answering: the lease on the turn ran out";
                if fail_turn(tx, &id, reason, Fence::LeaseExpired(now))? {
                    failed += 1;
                }
            }
            Ok(failed)
        })
    }
}

/// Whether `daemon` has still not beaten since `stale_before`, read under
/// its row's lock (PostgreSQL; SQLite's IMMEDIATE transaction holds the
/// write lock): a beat committed since the candidates were read keeps its
/// agents, and one coming now waits for this adoption to commit, then
/// finds them gone. A daemon with no row never beat.
fn still_silent(tx: &Db, daemon: &str, stale_before: i64) -> Result<bool, StoreError> {
    let lock = match tx.engine() {
        Engine::Postgres => " FOR UPDATE",
        Engine::Sqlite => "",
    };
    let beat = tx.row(
        &format!("SELECT heartbeat_at FROM daemons WHERE id = ?1{lock}"),
        args![daemon],
    )?;
    Ok(match beat {
        Some(row) => row.get::<i64>(0)? < stale_before,
        None => true,
    })
}
