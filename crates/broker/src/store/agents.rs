//! Agents: their rows, their tree, their state.

use super::db::{Db, Engine, args};
use super::placement::PlacedKind;
use super::rows::*;
use super::sql::*;
use super::turns::follow_up;
use super::{Store, StoreError};

impl Store {
    /// `created_by`: the dedupe key of the spawn_agent call that made it.
    /// The agent is this store's daemon's to run.
    pub fn insert_agent(&self, agent: &Agent, created_by: Option<&str>) -> Result<(), StoreError> {
        self.db.execute(
            "INSERT INTO agents (id, name, role, parent_id, workspace, depth, created_at, model, created_by, provider, daemon_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            args![agent.id, agent.name, agent.role, agent.parent_id, agent.workspace, agent.depth, agent.created_at, agent.model, created_by, agent.provider, self.seat.daemon_id],
        )?;
        Ok(())
    }

    /// A new agent with what it starts with (its persona, role arguments
    /// and first message, which queues its first turn), in one
    /// transaction: all of it or none (a failure half-way would leave an
    /// agent a retried spawn finds, without its first turn). It goes to
    /// the daemon of `start.placement` when that one, under its row's
    /// lock, is alive and has a free slot; else to this store's daemon.
    /// Returns the daemon that runs it.
    pub fn insert_new_agent(
        &mut self,
        agent: &Agent,
        start: &AgentStart<'_>,
    ) -> Result<String, StoreError> {
        let (me, lease) = (self.seat.daemon_id.clone(), self.seat.lease_ms);
        self.db.transaction(|tx| {
            let (daemon_id, placed) = super::placement::settle(tx, &me, lease, agent, start.placement)?;
            let kind = if daemon_id == me { PlacedKind::Here } else { PlacedKind::Placed };
            tx.execute(
                "INSERT INTO agents (id, name, role, parent_id, workspace, depth, created_at, model, created_by, provider, daemon_id, persona, role_args, placed, placed_kind) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                args![agent.id, agent.name, agent.role, agent.parent_id, agent.workspace, agent.depth, agent.created_at, agent.model, start.created_by, agent.provider, daemon_id, start.persona, start.role_args, placed, kind.as_str()],
            )?;
            if let Some(first) = &start.first {
                insert_message(tx, first)?;
            }
            // The daemon it went to binds its socket at once (its first
            // turn, if any, announced it already).
            if daemon_id != me && tx.engine() == Engine::Postgres {
                tx.execute("SELECT pg_notify('substrat_turns', ?1)", args![daemon_id])?;
            }
            Ok(daemon_id)
        })
    }

    pub fn agent_created_by(&self, key: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE created_by = ?1");
        one_agent(&self.db, &sql, key)
    }

    pub fn agent_by_name(&self, name: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE name = ?1");
        one_agent(&self.db, &sql, name)
    }

    pub fn agent_by_id(&self, id: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
        one_agent(&self.db, &sql, id)
    }

    pub fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY created_at, name");
        self.db.rows(&sql, &[])?.iter().map(agent_row).collect()
    }

    pub fn children(&self, id: &str) -> Result<Vec<Agent>, StoreError> {
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents WHERE parent_id = ?1 ORDER BY created_at, name"
        );
        self.db
            .rows(&sql, args![id])?
            .iter()
            .map(agent_row)
            .collect()
    }

    /// Removes an agent. Its queued turns are cancelled, and whoever waits
    /// for an answer from one of them is told there will be none. Only an
    /// agent of this store's daemon (or of none): one adopted by another
    /// daemon meanwhile is `Elsewhere`. Its row is locked first
    /// (PostgreSQL), so an adoption at the same moment waits and then
    /// finds it gone, or went first and is seen.
    pub fn remove_agent(&mut self, id: &str) -> Result<bool, StoreError> {
        let me = self.seat.daemon_id.clone();
        self.db.transaction(|tx| {
            let lock = match tx.engine() {
                Engine::Postgres => " FOR UPDATE",
                Engine::Sqlite => "",
            };
            let sql = format!("SELECT {AGENT_COLUMNS}, daemon_id FROM agents WHERE id = ?1{lock}");
            let Some(row) = tx.row(&sql, args![id])? else {
                return Ok(false);
            };
            let agent = agent_row(&row)?;
            if let Some(daemon) = row.get::<Option<String>>(AGENT_COLUMN_COUNT)?
                && daemon != me
            {
                return Err(StoreError::Elsewhere(daemon));
            }
            let waiting = tx.rows(
                "SELECT message_id FROM turns WHERE agent_id = ?1 AND status = 'queued' AND message_id IS NOT NULL",
                args![id],
            )?;
            let gone = TurnOutcome::Failed {
                reason: "the agent was removed".into(),
            };
            for row in waiting {
                let message_id: String = row.get(0)?;
                if let Some(message) = message_by_id(tx, &message_id)? {
                    follow_up(tx, &agent, &message, &gone)?;
                }
            }
            tx.execute(
                "UPDATE turns SET status = 'cancelled', error = 'the agent was removed' WHERE agent_id = ?1 AND status = 'queued'",
                args![id],
            )?;
            tx.execute("DELETE FROM agents WHERE id = ?1", args![id])?;
            // Its certificates (relays on other hosts) are revoked with it.
            tx.execute("DELETE FROM agent_certs WHERE agent_id = ?1", args![id])?;
            tx.execute("DELETE FROM agent_buckets WHERE agent_id = ?1", args![id])?;
            Ok(true)
        })
    }

    /// `active`, `suspended` or `failed`, with a reason for the last; an
    /// agent another daemon runs is `Elsewhere`.
    pub fn set_agent_state(
        &self,
        id: &str,
        state: StoredState,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        // Only where this store's daemon runs it (or none does): an
        // adoption committed since the caller looked is seen here.
        let changed = self.db.execute(
            "UPDATE agents SET state = ?2, reason = ?3 WHERE id = ?1 AND (daemon_id IS NULL OR daemon_id = ?4)",
            args![id, state.as_str(), reason, self.seat.daemon_id],
        )?;
        if changed == 0
            && let Some(row) = self
                .db
                .row("SELECT daemon_id FROM agents WHERE id = ?1", args![id])?
            && let Some(daemon) = row.get::<Option<String>>(0)?
        {
            return Err(StoreError::Elsewhere(daemon));
        }
        Ok(())
    }

    pub fn agent_status(&self, id: &str) -> Result<AgentStatus, StoreError> {
        let row = self.db.one(
            "SELECT state, reason, session_id FROM agents WHERE id = ?1",
            args![id],
        )?;
        let (stored, reason, session_id): (String, Option<String>, Option<String>) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        let row = self.db.one(
            "SELECT (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'running'),
                    (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued'),
                    (SELECT COUNT(*) FROM messages m WHERE m.from_id = ?1 AND m.answered = 0
                       AND ((m.kind = 'message' AND m.sync = 1) OR m.kind = 'broadcast'))",
            args![id],
        )?;
        let (running, queued, awaiting): (i64, i64, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
        let state = match StoredState::from_column(&stored) {
            StoredState::Active if running > 0 => AgentState::Busy,
            StoredState::Active if queued > 0 || awaiting > 0 => AgentState::Waiting,
            StoredState::Active => AgentState::Idle,
            StoredState::Suspended => AgentState::Suspended,
            StoredState::Failed => AgentState::Failed,
        };
        Ok(AgentStatus {
            state,
            reason,
            session_id,
            queued_turns: u32::try_from(queued).unwrap_or(u32::MAX),
            awaiting_replies: u32::try_from(awaiting).unwrap_or(u32::MAX),
        })
    }

    /// The system prompt resolved for the agent's role, kept so every turn
    /// has the same one.
    pub fn set_agent_persona(&self, id: &str, persona: &str) -> Result<(), StoreError> {
        self.db.execute(
            "UPDATE agents SET persona = ?2 WHERE id = ?1",
            args![id, persona],
        )?;
        Ok(())
    }

    pub fn agent_persona(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .db
            .row("SELECT persona FROM agents WHERE id = ?1", args![id])?;
        Ok(match row {
            Some(row) => row.get(0)?,
            None => None,
        })
    }

    /// The role arguments a parent gave with spawn_agent (JSON), for the
    /// child's first resolve.
    pub fn set_agent_role_args(&self, id: &str, args: &str) -> Result<(), StoreError> {
        self.db.execute(
            "UPDATE agents SET role_args = ?2 WHERE id = ?1",
            args![id, args],
        )?;
        Ok(())
    }

    pub fn agent_role_args(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .db
            .row("SELECT role_args FROM agents WHERE id = ?1", args![id])?;
        Ok(match row {
            Some(row) => row.get(0)?,
            None => None,
        })
    }
}

/// The agent a query (with the agent's columns and one parameter) finds.
fn one_agent(db: &Db, sql: &str, arg: &str) -> Result<Option<Agent>, StoreError> {
    db.row(sql, args![arg])?.as_ref().map(agent_row).transpose()
}
