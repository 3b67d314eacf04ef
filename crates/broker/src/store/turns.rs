//! Turns: queued, claimed, finished, and what a finished one sends on.

use super::db::{Db, Engine, Row, args};
use super::rows::*;
use super::sql::*;
use super::{Store, StoreError, now_ms};

impl Store {
    /// A turn that continues the agent's session (`agent resume` with
    /// nothing queued).
    pub fn queue_prompt(&self, agent_id: &str, prompt: &str) -> Result<String, StoreError> {
        insert_turn(&self.db, agent_id, None, Some(prompt))
    }

    /// Takes up to `limit` queued turns to run now, oldest first: at most
    /// one per agent, none for an agent already running one or not active,
    /// only of the agents this daemon runs. Each is claimed once: the
    /// agent's row is locked first (PostgreSQL; another daemon's claim
    /// skips it) or the whole claim holds the write lock (SQLite), and a
    /// turn changes only from queued. A claimed turn is leased to this
    /// daemon (`heartbeat` extends the lease).
    pub fn claim_turns(&mut self, limit: usize) -> Result<Vec<ClaimedTurn>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (me, lease) = (self.seat.daemon_id.clone(), self.seat.lease_ms);
        self.db.transaction(|tx| {
            let candidates = tx.rows(
                "SELECT t.id, t.agent_id, t.message_id, t.prompt, t.attempts FROM turns t JOIN agents a ON a.id = t.agent_id
                 WHERE t.status = 'queued' AND a.state = 'active' AND a.daemon_id = ?1
                   AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.agent_id = t.agent_id AND r.status = 'running')
                 ORDER BY t.seq",
                args![me],
            )?;
            let mut claimed: Vec<ClaimedTurn> = Vec::new();
            for row in candidates {
                let (id, agent_id, message_id, prompt, attempts) = queued_row(&row)?;
                if claimed.len() >= limit || claimed.iter().any(|c| c.agent.id == agent_id) {
                    continue;
                }
                let lock = match tx.engine() {
                    Engine::Postgres => " FOR UPDATE SKIP LOCKED",
                    Engine::Sqlite => "",
                };
                let sql = format!(
                    "SELECT {AGENT_COLUMNS}, session_id FROM agents WHERE id = ?1 AND daemon_id = ?2{lock}"
                );
                let Some(row) = tx.row(&sql, args![agent_id, me])? else {
                    continue;
                };
                // Read again under the agent's lock: a turn of it claimed
                // since the candidates were read.
                let busy = tx.row(
                    "SELECT 1 FROM turns WHERE agent_id = ?1 AND status = 'running'",
                    args![agent_id],
                )?;
                if busy.is_some() {
                    continue;
                }
                let (agent, session_id) = (agent_row(&row)?, row.get(AGENT_COLUMN_COUNT)?);
                let now = tx.now_ms()?;
                let taken = tx.execute(
                    "UPDATE turns SET status = 'running', attempts = attempts + 1, started_at = ?2, daemon_id = ?3, lease_until = ?4
                     WHERE id = ?1 AND status = 'queued'",
                    args![id, now, me, now + lease],
                )?;
                if taken == 0 {
                    continue;
                }
                let message = match &message_id {
                    Some(mid) => message_by_id(tx, mid)?,
                    None => None,
                };
                claimed.push(ClaimedTurn {
                    id,
                    agent,
                    message,
                    prompt,
                    session_id,
                    attempt: attempts + 1,
                });
            }
            Ok(claimed)
        })
    }

    /// Records how a turn ended and what follows, in one transaction: the
    /// agent's session and state, the reply to a sync message or broadcast
    /// (a turn of the sender), a child's report of its first turn (the
    /// parent's inbox). False when the turn is no longer this daemon's to
    /// finish (its lease ran out and another daemon failed it): nothing is
    /// changed then.
    pub fn finish_turn(&mut self, finish: &TurnFinish<'_>) -> Result<bool, StoreError> {
        let me = self.seat.daemon_id.clone();
        self.db
            .transaction(|tx| finish_in(tx, finish, Fence::RunBy(&me)))
    }

    /// The session a running turn's CLI reported, kept at once: a turn
    /// interrupted before it ends is resumed in it.
    pub fn set_agent_session(&self, agent_id: &str, session: &str) -> Result<(), StoreError> {
        // Only while the agent is still this daemon's (as in finish_in).
        self.db.execute(
            "UPDATE agents SET session_id = ?2 WHERE id = ?1 AND (daemon_id = ?3 OR daemon_id IS NULL)",
            args![agent_id, session, self.seat.daemon_id],
        )?;
        Ok(())
    }

    /// What earlier runs of a turn did that took effect: the messages it
    /// sent and the agents it made (found by their dedupe keys).
    pub fn effects_of_turn(&self, turn_id: &str) -> Result<Vec<TurnEffect>, StoreError> {
        let pattern = format!("{}#%", turn_id.replace(['%', '_'], ""));
        let mut effects = Vec::new();
        let sent = self.db.rows(
            "SELECT m.kind, COALESCE(a.name, m.to_id), m.text
             FROM messages m LEFT JOIN agents a ON a.id = m.to_id
             WHERE m.dedupe_key LIKE ?1 ORDER BY m.seq",
            args![pattern],
        )?;
        for row in sent {
            effects.push(TurnEffect::Message {
                kind: row.get(0)?,
                to: row.get(1)?,
                text: row.get(2)?,
            });
        }
        let spawned = self.db.rows(
            "SELECT name FROM agents WHERE created_by LIKE ?1 ORDER BY created_at",
            args![pattern],
        )?;
        for row in spawned {
            effects.push(TurnEffect::Spawned { name: row.get(0)? });
        }
        Ok(effects)
    }

    /// The prompt a turn was given, as the provider got it.
    pub fn set_turn_prompt(&self, turn_id: &str, prompt: &str) -> Result<(), StoreError> {
        self.db.execute(
            "UPDATE turns SET prompt = ?2 WHERE id = ?1",
            args![turn_id, prompt],
        )?;
        Ok(())
    }

    /// Puts a running turn back at its place in the queue (suspend).
    pub fn requeue_turn(&self, turn_id: &str) -> Result<(), StoreError> {
        // Only while it is still this daemon's: one failed after its lease
        // by another daemon stays failed.
        self.db.execute(
            "UPDATE turns SET status = 'queued', started_at = NULL, lease_until = NULL
             WHERE id = ?1 AND status = 'running' AND (daemon_id = ?2 OR daemon_id IS NULL)",
            args![turn_id, self.seat.daemon_id],
        )?;
        Ok(())
    }

    /// After a restart nothing of this daemon runs: its turns marked
    /// running are queued again (their processes died with it). Another
    /// daemon's are left to their lease. Returns how many.
    pub fn recover_running(&self) -> Result<usize, StoreError> {
        self.db.execute(
            "UPDATE turns SET status = 'queued', started_at = NULL, lease_until = NULL
             WHERE status = 'running' AND (daemon_id = ?1 OR daemon_id IS NULL)",
            args![self.seat.daemon_id],
        )
    }

    /// The agent's last `limit` turns, newest first.
    pub fn recent_turns(&self, agent_id: &str, limit: u32) -> Result<Vec<TurnRecord>, StoreError> {
        let rows = self.db.rows(
            "SELECT t.id, COALESCE(m.kind, 'resume'), COALESCE(t.prompt, m.text, ''), t.status, t.attempts, t.created_at,
                    t.started_at, t.finished_at, t.result, t.error, t.tool_calls, t.notes
             FROM turns t LEFT JOIN messages m ON m.id = t.message_id
             WHERE t.agent_id = ?1 ORDER BY t.seq DESC LIMIT ?2",
            args![agent_id, limit],
        )?;
        rows.iter().map(turn_record).collect()
    }
}

fn turn_record(r: &Row) -> Result<TurnRecord, StoreError> {
    let json = |i: usize| -> Result<serde_json::Value, StoreError> {
        let text: Option<String> = r.get(i)?;
        Ok(text
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Array(Vec::new())))
    };
    Ok(TurnRecord {
        id: r.get(0)?,
        kind: r.get(1)?,
        prompt: r.get(2)?,
        status: r.get(3)?,
        attempts: r.get(4)?,
        created_at: r.get(5)?,
        started_at: r.get(6)?,
        finished_at: r.get(7)?,
        result: r.get(8)?,
        error: r.get(9)?,
        tool_calls: json(10)?,
        notes: json(11)?,
    })
}

/// Fails a running turn (the fence says which may be), with what follows.
pub(super) fn fail_turn(
    db: &Db,
    turn_id: &str,
    reason: &str,
    fence: Fence<'_>,
) -> Result<bool, StoreError> {
    let finish = TurnFinish {
        turn_id,
        session_id: None,
        outcome: TurnOutcome::Failed {
            reason: reason.into(),
        },
        tool_calls: "[]".into(),
        notes: "{}".into(),
    };
    finish_in(db, &finish, fence)
}

fn finish_in(db: &Db, finish: &TurnFinish<'_>, fence: Fence<'_>) -> Result<bool, StoreError> {
    let row = db.one(
        "SELECT agent_id, message_id FROM turns WHERE id = ?1",
        args![finish.turn_id],
    )?;
    let (agent_id, message_id): (String, Option<String>) = (row.get(0)?, row.get(1)?);
    let (status, result, error) = match &finish.outcome {
        TurnOutcome::Done { result } => (TurnStatus::Done, Some(result.as_str()), None),
        TurnOutcome::Failed { reason } => (TurnStatus::Failed, None, Some(reason.as_str())),
    };
    let (condition, fenced) = fence.condition();
    let sql = format!(
        "UPDATE turns SET status = ?2, finished_at = ?3, session_id = ?4, result = ?5, error = ?6, tool_calls = ?7, notes = ?8
         WHERE id = ?1 AND status = 'running' AND {condition}"
    );
    let mut values = args![
        finish.turn_id,
        status,
        now_ms(),
        finish.session_id,
        result,
        error,
        finish.tool_calls,
        finish.notes
    ]
    .to_vec();
    values.push(fenced);
    if db.execute(&sql, &values)? == 0 {
        return Ok(false);
    }
    // The session is on this daemon's host: kept only while the agent is
    // still this daemon's (not adopted by another in the meantime).
    if let (Some(session), Fence::RunBy(me)) = (finish.session_id, fence) {
        db.execute(
            "UPDATE agents SET session_id = ?2 WHERE id = ?1 AND (daemon_id = ?3 OR daemon_id IS NULL)",
            args![agent_id, session, me],
        )?;
    }
    // A turn that failed fails its agent (the operator looks, then
    // resumes it); one whose daemon stopped does not: the agent did
    // nothing wrong, and its queued turns run on the daemon that adopts it.
    if let Some(reason) = error
        && matches!(fence, Fence::RunBy(_))
    {
        db.execute(
            "UPDATE agents SET state = 'failed', reason = ?2 WHERE id = ?1 AND state = 'active'",
            args![agent_id, reason],
        )?;
    }
    let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
    let agent = db
        .row(&sql, args![agent_id])?
        .as_ref()
        .map(agent_row)
        .transpose()?;
    let message = match &message_id {
        Some(id) => message_by_id(db, id)?,
        None => None,
    };
    if let (Some(agent), Some(message)) = (agent, message) {
        follow_up(db, &agent, &message, &finish.outcome)?;
    }
    Ok(true)
}

/// A queued turn's row: id, agent id, message id, prompt, attempts so far.
pub(super) type QueuedRow = (String, String, Option<String>, Option<String>, u32);

fn queued_row(row: &Row) -> Result<QueuedRow, StoreError> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

/// What a finished turn sets off: the reply its sender waits for, or a
/// child's report to its parent. Replies are never refused for a full
/// inbox: the sender asked for them.
pub(super) fn follow_up(
    db: &Db,
    agent: &Agent,
    message: &Message,
    outcome: &TurnOutcome,
) -> Result<(), StoreError> {
    let (answer, failed) = match outcome {
        TurnOutcome::Done { result } => (result.clone(), false),
        TurnOutcome::Failed { reason } => (format!("its turn failed: {reason}"), true),
    };
    let (kind, delivery, text) = if wants_reply(message) {
        db.execute(
            "UPDATE messages SET answered = 1 WHERE id = ?1",
            args![message.id],
        )?;
        let kind = if failed {
            MessageKind::NoReply
        } else {
            MessageKind::Reply
        };
        (kind, Delivery::Turn, answer)
    } else if message.kind == MessageKind::Instructions
        && agent.parent_id.as_deref() == Some(message.from_id.as_str())
    {
        let verb = if failed {
            "could not finish"
        } else {
            "finished"
        };
        let text = format!("{} {verb} its instructions: {answer}", agent.name);
        (MessageKind::Report, Delivery::Inbox, text)
    } else {
        return Ok(());
    };
    let sender_exists = db
        .row("SELECT 1 FROM agents WHERE id = ?1", args![message.from_id])?
        .is_some();
    if sender_exists {
        let reply = NewMessage {
            from: Sender {
                id: &agent.id,
                name: &agent.name,
            },
            to_id: &message.from_id,
            text: &text,
            sync: false,
            kind,
            delivery,
            thread: Some(&message.thread),
            dedupe_key: None,
        };
        insert_message(db, &reply)?;
    }
    Ok(())
}

/// Which running turn a finish may still change: one this daemon runs, or
/// one whose lease ran out. A turn failed by another daemon after its
/// lease ran out is not finished again by the daemon that lost it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence<'a> {
    RunBy(&'a str),
    /// Its lease ended before this time (the database's clock).
    LeaseExpired(i64),
}

impl Fence<'_> {
    /// The condition on the turn's row, with `?9` its value.
    pub(super) fn condition(self) -> (&'static str, super::values::Value) {
        use super::values::ToValue;
        match self {
            // NULL: claimed before daemons were recorded (one daemon then).
            Fence::RunBy(daemon) => ("(daemon_id = ?9 OR daemon_id IS NULL)", daemon.to_value()),
            Fence::LeaseExpired(now) => ("lease_until < ?9", now.to_value()),
        }
    }
}
