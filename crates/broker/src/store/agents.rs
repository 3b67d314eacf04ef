//! Agents: their rows, their tree, their state.

use rusqlite::{OptionalExtension, params};

use super::rows::*;
use super::sql::*;
use super::turns::follow_up;
use super::{Store, StoreError};

impl Store {
    /// `created_by`: the dedupe key of the spawn_agent call that made it.
    pub fn insert_agent(&self, agent: &Agent, created_by: Option<&str>) -> Result<(), StoreError> {
        self.conn.cached_execute(
            "INSERT INTO agents (id, name, role, parent_id, workspace, depth, created_at, model, created_by, provider) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![agent.id, agent.name, agent.role, agent.parent_id, agent.workspace, agent.depth, agent.created_at, agent.model, created_by, agent.provider],
        )?;
        Ok(())
    }

    pub fn agent_created_by(&self, key: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE created_by = ?1");
        Ok(self.conn.cached_row(&sql, [key], agent_row).optional()?)
    }

    pub fn agent_by_name(&self, name: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE name = ?1");
        Ok(self.conn.cached_row(&sql, [name], agent_row).optional()?)
    }

    pub fn agent_by_id(&self, id: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
        Ok(self.conn.cached_row(&sql, [id], agent_row).optional()?)
    }

    pub fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY created_at, name");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], agent_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn children(&self, id: &str) -> Result<Vec<Agent>, StoreError> {
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents WHERE parent_id = ?1 ORDER BY created_at, name"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([id], agent_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes an agent. Its queued turns are cancelled, and whoever waits
    /// for an answer from one of them is told there will be none.
    pub fn remove_agent(&mut self, id: &str) -> Result<bool, StoreError> {
        let tx = self.conn.transaction()?;
        let agent = tx
            .cached_row(
                &format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"),
                [id],
                agent_row,
            )
            .optional()?;
        let Some(agent) = agent else {
            return Ok(false);
        };
        let waiting: Vec<String> = {
            let mut stmt = tx.prepare(
                "SELECT message_id FROM turns WHERE agent_id = ?1 AND status = 'queued' AND message_id IS NOT NULL",
            )?;
            let rows = stmt.query_map([id], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let gone = TurnOutcome::Failed {
            reason: "the agent was removed".into(),
        };
        for message_id in waiting {
            if let Some(message) = message_by_id(&tx, &message_id)? {
                follow_up(&tx, &agent, &message, &gone)?;
            }
        }
        tx.cached_execute(
            "UPDATE turns SET status = 'cancelled', error = 'the agent was removed' WHERE agent_id = ?1 AND status = 'queued'",
            [id],
        )?;
        tx.cached_execute("DELETE FROM agents WHERE id = ?1", [id])?;
        // Its certificates (relays on other hosts) are revoked with it.
        tx.cached_execute("DELETE FROM agent_certs WHERE agent_id = ?1", [id])?;
        tx.commit()?;
        Ok(true)
    }

    /// `active`, `suspended` or `failed`, with a reason for the last.
    pub fn set_agent_state(
        &self,
        id: &str,
        state: StoredState,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.conn.cached_execute(
            "UPDATE agents SET state = ?2, reason = ?3 WHERE id = ?1",
            params![id, state.as_str(), reason],
        )?;
        Ok(())
    }

    pub fn agent_status(&self, id: &str) -> Result<AgentStatus, StoreError> {
        let (stored, reason, session_id): (String, Option<String>, Option<String>) =
            self.conn.cached_row(
                "SELECT state, reason, session_id FROM agents WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
        let (running, queued, awaiting): (i64, i64, i64) = self.conn.cached_row(
            "SELECT (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'running'),
                    (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued'),
                    (SELECT COUNT(*) FROM messages m WHERE m.from_id = ?1 AND m.answered = 0
                       AND ((m.kind = 'message' AND m.sync = 1) OR m.kind = 'broadcast'))",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
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
        self.conn.cached_execute(
            "UPDATE agents SET persona = ?2 WHERE id = ?1",
            rusqlite::params![id, persona],
        )?;
        Ok(())
    }

    pub fn agent_persona(&self, id: &str) -> Result<Option<String>, StoreError> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .cached_row("SELECT persona FROM agents WHERE id = ?1", [id], |r| {
                r.get::<_, Option<String>>(0)
            })
            .optional()?
            .flatten())
    }

    /// The role arguments a parent gave with spawn_agent (JSON), for the
    /// child's first resolve.
    pub fn set_agent_role_args(&self, id: &str, args: &str) -> Result<(), StoreError> {
        self.conn.cached_execute(
            "UPDATE agents SET role_args = ?2 WHERE id = ?1",
            rusqlite::params![id, args],
        )?;
        Ok(())
    }

    pub fn agent_role_args(&self, id: &str) -> Result<Option<String>, StoreError> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .cached_row("SELECT role_args FROM agents WHERE id = ?1", [id], |r| {
                r.get::<_, Option<String>>(0)
            })
            .optional()?
            .flatten())
    }
}
