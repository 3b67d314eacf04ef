//! Durable state in SQLite (WAL): agents and their tree, messages and
//! inboxes. Every write that a caller acknowledges is committed first; with
//! WAL and `synchronous = NORMAL` a committed transaction survives the
//! daemon being killed (power loss may lose the last ones; see docs).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::upstream::menu::PinState;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Agent {
    pub id: String,
    pub name: String,
    pub role: String,
    pub parent_id: Option<String>,
    pub workspace: Option<String>,
    /// 0 for a root agent, parent's depth + 1 below.
    pub depth: u32,
    pub created_at: i64,
    /// The model its turns ask for (`--model`); none: the provider's default.
    pub model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub id: String,
    pub from_id: String,
    pub from_name: String,
    pub to_id: String,
    pub text: String,
    pub sync: bool,
    pub kind: String,
    pub status: String,
    pub created_at: i64,
    /// The id the sender was given: the message's own, or its broadcast's.
    pub thread: String,
}

/// Who sent a message: an agent, or the operator through the CLI.
#[derive(Debug, Clone)]
pub struct Sender<'a> {
    pub id: &'a str,
    pub name: &'a str,
}

#[derive(Debug)]
pub struct NewMessage<'a> {
    pub from: Sender<'a>,
    pub to_id: &'a str,
    pub text: &'a str,
    pub sync: bool,
    pub kind: &'a str,
    /// Where it goes: the recipient's inbox, or a turn of its own.
    pub delivery: Delivery,
    /// The id the sender knows it by, when not the message's own (broadcast).
    pub thread: Option<&'a str>,
    /// Sending again with the same key (a turn re-run after a crash) finds
    /// the first message instead of queueing a second one.
    pub dedupe_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Waits for `check_inbox`.
    Inbox,
    /// Becomes the prompt of the recipient's next turn.
    Turn,
}

impl Delivery {
    fn as_str(self) -> &'static str {
        match self {
            Self::Inbox => "queued",
            Self::Turn => "turn",
        }
    }
}

/// A turn taken from the queue to run now.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub id: String,
    pub agent: Agent,
    /// The message the turn delivers (none: a `resume` turn with `prompt`).
    pub message: Option<Message>,
    pub prompt: Option<String>,
    /// The agent's session, continued with `--resume`.
    pub session_id: Option<String>,
    pub attempt: u32,
}

/// How a turn ended, to be recorded with what follows from it.
#[derive(Debug, Clone)]
pub struct TurnFinish<'a> {
    pub turn_id: &'a str,
    pub session_id: Option<&'a str>,
    pub outcome: TurnOutcome,
    /// JSON: the tool calls the broker saw, the stream's odd lines.
    pub tool_calls: String,
    pub notes: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnOutcome {
    /// The turn's answer.
    Done { result: String },
    /// The turn failed; the agent is marked failed with this reason.
    Failed { reason: String },
}

/// What `tools approve` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Approved,
    /// Never seen on that server.
    Unknown,
    /// The definition seen now has another hash (given in full).
    Mismatch(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinRow {
    pub server: String,
    pub tool: String,
    pub state: String,
    pub reason: Option<String>,
    pub approved_hash: Option<String>,
    pub seen_hash: String,
}

/// What an agent is doing, derived from its turns and stored state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentStatus {
    /// idle, busy, waiting, suspended or failed (docs/agents.md).
    pub state: String,
    pub reason: Option<String>,
    pub session_id: Option<String>,
    pub queued_turns: u32,
    pub awaiting_replies: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnRecord {
    pub id: String,
    pub kind: String,
    pub prompt: String,
    pub status: String,
    pub attempts: u32,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub tool_calls: serde_json::Value,
    pub notes: serde_json::Value,
}

pub struct Store {
    conn: Connection,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    parent_id TEXT,
    workspace TEXT,
    depth INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agents_parent ON agents(parent_id);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    from_id TEXT NOT NULL,
    from_name TEXT NOT NULL,
    to_id TEXT NOT NULL,
    text TEXT NOT NULL,
    sync INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_inbox ON messages(to_id, status, seq);
CREATE TABLE IF NOT EXISTS turns (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    message_id TEXT,
    prompt TEXT,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    finished_at INTEGER,
    session_id TEXT,
    result TEXT,
    error TEXT,
    tool_calls TEXT,
    notes TEXT
);
CREATE INDEX IF NOT EXISTS turns_queue ON turns(status, seq);
CREATE INDEX IF NOT EXISTS turns_agent ON turns(agent_id, seq);
CREATE INDEX IF NOT EXISTS turns_message ON turns(message_id);
CREATE TABLE IF NOT EXISTS tool_pins (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    approved_hash TEXT,
    seen_hash TEXT NOT NULL,
    seen_definition TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (server, tool)
);
";

/// Columns added after the first release of the schema; added to an
/// older database when it is opened.
const ADDED_COLUMNS: [(&str, &str, &str); 9] = [
    ("agents", "model", "TEXT"),
    ("agents", "state", "TEXT NOT NULL DEFAULT 'active'"),
    ("agents", "reason", "TEXT"),
    ("agents", "session_id", "TEXT"),
    ("agents", "created_by", "TEXT"),
    ("messages", "thread", "TEXT"),
    ("messages", "dedupe_key", "TEXT"),
    ("messages", "answered", "INTEGER NOT NULL DEFAULT 0"),
    ("tool_pins", "position", "INTEGER NOT NULL DEFAULT 0"),
];

fn add_missing_columns(conn: &Connection) -> Result<(), StoreError> {
    for (table, column, decl) in ADDED_COLUMNS {
        let mut stmt = conn.prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"
        ))?;
        if !stmt.exists([column])? {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
        }
    }
    conn.execute_batch(
        "CREATE UNIQUE INDEX IF NOT EXISTS messages_dedupe ON messages(dedupe_key) WHERE dedupe_key IS NOT NULL;
         CREATE UNIQUE INDEX IF NOT EXISTS agents_created_by ON agents(created_by) WHERE created_by IS NOT NULL;",
    )?;
    Ok(())
}

fn agent_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Agent> {
    Ok(Agent {
        id: row.get(0)?,
        name: row.get(1)?,
        role: row.get(2)?,
        parent_id: row.get(3)?,
        workspace: row.get(4)?,
        depth: row.get(5)?,
        created_at: row.get(6)?,
        model: row.get(7)?,
    })
}

fn message_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Message> {
    Ok(Message {
        id: row.get(0)?,
        from_id: row.get(1)?,
        from_name: row.get(2)?,
        to_id: row.get(3)?,
        text: row.get(4)?,
        sync: row.get(5)?,
        kind: row.get(6)?,
        status: row.get(7)?,
        created_at: row.get(8)?,
        thread: row.get(9)?,
    })
}

const AGENT_COLUMNS: &str = "id, name, role, parent_id, workspace, depth, created_at, model";
const MESSAGE_COLUMNS: &str =
    "id, from_id, from_name, to_id, text, sync, kind, status, created_at, COALESCE(thread, id)";

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        add_missing_columns(&conn)?;
        Ok(Self { conn })
    }

    /// `created_by`: the dedupe key of the spawn_agent call that made it.
    pub fn insert_agent(&self, agent: &Agent, created_by: Option<&str>) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO agents (id, name, role, parent_id, workspace, depth, created_at, model, created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![agent.id, agent.name, agent.role, agent.parent_id, agent.workspace, agent.depth, agent.created_at, agent.model, created_by],
        )?;
        Ok(())
    }

    pub fn agent_created_by(&self, key: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE created_by = ?1");
        Ok(self.conn.query_row(&sql, [key], agent_row).optional()?)
    }

    pub fn agent_by_name(&self, name: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE name = ?1");
        Ok(self.conn.query_row(&sql, [name], agent_row).optional()?)
    }

    pub fn agent_by_id(&self, id: &str) -> Result<Option<Agent>, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1");
        Ok(self.conn.query_row(&sql, [id], agent_row).optional()?)
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
            .query_row(
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
        tx.execute(
            "UPDATE turns SET status = 'cancelled', error = 'the agent was removed' WHERE agent_id = ?1 AND status = 'queued'",
            [id],
        )?;
        tx.execute("DELETE FROM agents WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(true)
    }

    /// Messages waiting for an agent: in its inbox or as queued turns.
    pub fn queued_count(&self, to_id: &str) -> Result<u32, StoreError> {
        count(&self.conn, to_id)
    }

    /// Queues messages in one transaction, each only if its recipient has
    /// room (`inbox_depth`, counting its inbox and its queued turns), and
    /// a turn for each message delivered as one. Returns, per message, its
    /// id or `None` when the recipient was full. A message whose dedupe key
    /// was seen before returns the first one's id and queues nothing.
    /// Committed before it returns.
    pub fn send(
        &mut self,
        messages: &[NewMessage<'_>],
        inbox_depth: Option<u32>,
    ) -> Result<Vec<Option<String>>, StoreError> {
        let tx = self.conn.transaction()?;
        let mut ids = Vec::new();
        for m in messages {
            if let Some(key) = &m.dedupe_key {
                let seen: Option<String> = tx
                    .query_row(
                        "SELECT id FROM messages WHERE dedupe_key = ?1",
                        [key],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(id) = seen {
                    ids.push(Some(id));
                    continue;
                }
            }
            if let Some(depth) = inbox_depth
                && count(&tx, m.to_id)? >= depth
            {
                ids.push(None);
                continue;
            }
            ids.push(Some(insert_message(&tx, m)?));
        }
        tx.commit()?;
        Ok(ids)
    }

    /// Takes every queued message of `to_id`, oldest first, and marks them
    /// delivered in the same transaction.
    pub fn take_inbox(&mut self, to_id: &str) -> Result<Vec<Message>, StoreError> {
        // Read first: an empty inbox (the common case) costs no write. The
        // caller holds the store's lock, so nothing arrives in between; the
        // update is bounded by the last message read all the same.
        let messages = {
            let sql = format!(
                "SELECT {MESSAGE_COLUMNS}, seq FROM messages WHERE to_id = ?1 AND status = 'queued' ORDER BY seq"
            );
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let rows = stmt.query_map([to_id], |row| {
                Ok((message_row(row)?, row.get::<_, i64>(10)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let Some(last_seq) = messages.last().map(|(_, seq)| *seq) else {
            return Ok(Vec::new());
        };
        self.conn.execute(
            "UPDATE messages SET status = 'delivered' WHERE to_id = ?1 AND status = 'queued' AND seq <= ?2",
            params![to_id, last_seq],
        )?;
        Ok(messages.into_iter().map(|(m, _)| m).collect())
    }

    /// The last `limit` messages an agent sent or received, newest first.
    pub fn recent_messages(&self, id: &str, limit: u32) -> Result<Vec<Message>, StoreError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE to_id = ?1 OR from_id = ?1 ORDER BY seq DESC LIMIT ?2"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![id, limit], message_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn count(conn: &Connection, to_id: &str) -> Result<u32, StoreError> {
    let n: i64 = conn.query_row(
        "SELECT (SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued')
              + (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued')",
        [to_id],
        |r| r.get(0),
    )?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Inserts a message, and its turn when it is delivered as one.
fn insert_message(conn: &Connection, m: &NewMessage<'_>) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    conn.execute(
        "INSERT INTO messages (id, from_id, from_name, to_id, text, sync, kind, status, created_at, thread, dedupe_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![id, m.from.id, m.from.name, m.to_id, m.text, m.sync, m.kind, m.delivery.as_str(), now_ms(), m.thread, m.dedupe_key],
    )?;
    if m.delivery == Delivery::Turn {
        insert_turn(conn, m.to_id, Some(&id), None)?;
    }
    Ok(id)
}

fn insert_turn(
    conn: &Connection,
    agent_id: &str,
    message_id: Option<&str>,
    prompt: Option<&str>,
) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    conn.execute(
        "INSERT INTO turns (id, agent_id, message_id, prompt, status, created_at) VALUES (?1, ?2, ?3, ?4, 'queued', ?5)",
        params![id, agent_id, message_id, prompt, now_ms()],
    )?;
    Ok(id)
}

fn message_by_id(conn: &Connection, id: &str) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1");
    Ok(conn.query_row(&sql, [id], message_row).optional()?)
}

/// Whether the sender of `m` waits for the turn's answer as a reply.
fn wants_reply(m: &Message) -> bool {
    m.from_id != "operator" && ((m.kind == "message" && m.sync) || m.kind == "broadcast")
}

/// A queued turn's row: id, agent id, message id, prompt, attempts so far.
type QueuedRow = (String, String, Option<String>, Option<String>, u32);

impl Store {
    /// A turn that continues the agent's session (`agent resume` with
    /// nothing queued).
    pub fn queue_prompt(&self, agent_id: &str, prompt: &str) -> Result<String, StoreError> {
        insert_turn(&self.conn, agent_id, None, Some(prompt))
    }

    /// Takes up to `limit` queued turns to run now, oldest first: at most
    /// one per agent, none for an agent already running one or not active.
    pub fn claim_turns(&mut self, limit: usize) -> Result<Vec<ClaimedTurn>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let tx = self.conn.transaction()?;
        let candidates: Vec<QueuedRow> = {
            let mut stmt = tx.prepare_cached(
                "SELECT t.id, t.agent_id, t.message_id, t.prompt, t.attempts FROM turns t JOIN agents a ON a.id = t.agent_id
                 WHERE t.status = 'queued' AND a.state = 'active'
                   AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.agent_id = t.agent_id AND r.status = 'running')
                 ORDER BY t.seq",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut claimed: Vec<ClaimedTurn> = Vec::new();
        for (id, agent_id, message_id, prompt, attempts) in candidates {
            if claimed.len() >= limit || claimed.iter().any(|c| c.agent.id == agent_id) {
                continue;
            }
            let sql = format!("SELECT {AGENT_COLUMNS}, session_id FROM agents WHERE id = ?1");
            let Some((agent, session_id)) = tx
                .query_row(&sql, [&agent_id], |r| {
                    Ok((agent_row(r)?, r.get::<_, Option<String>>(8)?))
                })
                .optional()?
            else {
                continue;
            };
            let message = match &message_id {
                Some(mid) => message_by_id(&tx, mid)?,
                None => None,
            };
            tx.execute(
                "UPDATE turns SET status = 'running', attempts = attempts + 1, started_at = ?2 WHERE id = ?1",
                params![id, now_ms()],
            )?;
            claimed.push(ClaimedTurn {
                id,
                agent,
                message,
                prompt,
                session_id,
                attempt: attempts + 1,
            });
        }
        tx.commit()?;
        Ok(claimed)
    }

    /// Records how a turn ended and what follows, in one transaction: the
    /// agent's session and state, the reply to a sync message or broadcast
    /// (a turn of the sender), a child's report of its first turn (the
    /// parent's inbox).
    pub fn finish_turn(&mut self, finish: &TurnFinish<'_>) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        let (agent_id, message_id): (String, Option<String>) = tx.query_row(
            "SELECT agent_id, message_id FROM turns WHERE id = ?1",
            [finish.turn_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let (status, result, error) = match &finish.outcome {
            TurnOutcome::Done { result } => ("done", Some(result.as_str()), None),
            TurnOutcome::Failed { reason } => ("failed", None, Some(reason.as_str())),
        };
        tx.execute(
            "UPDATE turns SET status = ?2, finished_at = ?3, session_id = ?4, result = ?5, error = ?6, tool_calls = ?7, notes = ?8 WHERE id = ?1",
            params![finish.turn_id, status, now_ms(), finish.session_id, result, error, finish.tool_calls, finish.notes],
        )?;
        if let Some(session) = finish.session_id {
            tx.execute(
                "UPDATE agents SET session_id = ?2 WHERE id = ?1",
                params![agent_id, session],
            )?;
        }
        if let Some(reason) = error {
            tx.execute(
                "UPDATE agents SET state = 'failed', reason = ?2 WHERE id = ?1 AND state = 'active'",
                params![agent_id, reason],
            )?;
        }
        let agent = tx
            .query_row(
                &format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = ?1"),
                [&agent_id],
                agent_row,
            )
            .optional()?;
        let message = match &message_id {
            Some(id) => message_by_id(&tx, id)?,
            None => None,
        };
        if let (Some(agent), Some(message)) = (agent, message) {
            follow_up(&tx, &agent, &message, &finish.outcome)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The prompt a turn was given, as the provider got it.
    pub fn set_turn_prompt(&self, turn_id: &str, prompt: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE turns SET prompt = ?2 WHERE id = ?1",
            params![turn_id, prompt],
        )?;
        Ok(())
    }

    /// Puts a running turn back at its place in the queue (suspend).
    pub fn requeue_turn(&self, turn_id: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE turns SET status = 'queued', started_at = NULL WHERE id = ?1 AND status = 'running'",
            [turn_id],
        )?;
        Ok(())
    }

    /// After a restart nothing runs: turns marked running are queued again
    /// (their processes died with the daemon). Returns how many.
    pub fn recover_running(&self) -> Result<usize, StoreError> {
        Ok(self.conn.execute(
            "UPDATE turns SET status = 'queued', started_at = NULL WHERE status = 'running'",
            [],
        )?)
    }

    /// `active`, `suspended` or `failed`, with a reason for the last.
    pub fn set_agent_state(
        &self,
        id: &str,
        state: &str,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE agents SET state = ?2, reason = ?3 WHERE id = ?1",
            params![id, state, reason],
        )?;
        Ok(())
    }

    pub fn agent_status(&self, id: &str) -> Result<AgentStatus, StoreError> {
        let (stored, reason, session_id): (String, Option<String>, Option<String>) =
            self.conn.query_row(
                "SELECT state, reason, session_id FROM agents WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
        let (running, queued, awaiting): (i64, i64, i64) = self.conn.query_row(
            "SELECT (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'running'),
                    (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued'),
                    (SELECT COUNT(*) FROM messages m WHERE m.from_id = ?1 AND m.answered = 0
                       AND ((m.kind = 'message' AND m.sync = 1) OR m.kind = 'broadcast'))",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        let state = match stored.as_str() {
            "active" if running > 0 => "busy",
            "active" if queued > 0 || awaiting > 0 => "waiting",
            "active" => "idle",
            other => other,
        };
        Ok(AgentStatus {
            state: state.to_string(),
            reason,
            session_id,
            queued_turns: u32::try_from(queued).unwrap_or(u32::MAX),
            awaiting_replies: u32::try_from(awaiting).unwrap_or(u32::MAX),
        })
    }

    /// The agent's last `limit` turns, newest first.
    pub fn recent_turns(&self, agent_id: &str, limit: u32) -> Result<Vec<TurnRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT t.id, COALESCE(m.kind, 'resume'), COALESCE(t.prompt, m.text, ''), t.status, t.attempts, t.created_at,
                    t.started_at, t.finished_at, t.result, t.error, t.tool_calls, t.notes
             FROM turns t LEFT JOIN messages m ON m.id = t.message_id
             WHERE t.agent_id = ?1 ORDER BY t.seq DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![agent_id, limit], |r| {
            let json = |i: usize| -> rusqlite::Result<serde_json::Value> {
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
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The thread (the id its sender knows) of the message with this key.
    pub fn thread_of(&self, dedupe_key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT COALESCE(thread, id) FROM messages WHERE dedupe_key = ?1",
                [dedupe_key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Checks a tool definition against its pin. First sight pins it
    /// (trust on first use) unless `flagged`; a changed hash quarantines
    /// it; a quarantined tool stays so until `approve_pin`.
    pub fn check_pin(
        &self,
        server: &str,
        tool: &str,
        position: usize,
        hash: &str,
        definition: &str,
        flagged: Option<&str>,
    ) -> Result<PinState, StoreError> {
        let row: Option<(Option<String>, String, Option<String>)> = self
            .conn
            .query_row(
                "SELECT approved_hash, state, reason FROM tool_pins WHERE server = ?1 AND tool = ?2",
                params![server, tool],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (state, reason, approved) = match (row, flagged) {
            (None, Some(why)) => ("quarantined", Some(why.to_string()), None),
            (None, None) => ("approved", None, Some(hash.to_string())),
            (Some((approved, state, reason)), _) if state == "quarantined" => {
                ("quarantined", reason, approved)
            }
            (Some((Some(approved), _, _)), _) if approved == hash => {
                ("approved", None, Some(approved))
            }
            (Some((approved, _, _)), _) => (
                "quarantined",
                Some("its definition changed since it was approved".to_string()),
                approved,
            ),
        };
        self.conn.execute(
            "INSERT INTO tool_pins (server, tool, approved_hash, seen_hash, seen_definition, state, reason, updated_at, position)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT(server, tool) DO UPDATE SET approved_hash = ?3, seen_hash = ?4, seen_definition = ?5, state = ?6, reason = ?7, updated_at = ?8, position = ?9",
            params![server, tool, approved, hash, definition, state, reason, now_ms(), i64::try_from(position).unwrap_or(i64::MAX)],
        )?;
        Ok(if state == "quarantined" {
            PinState::Quarantined(reason.unwrap_or_else(|| "quarantined".into()))
        } else {
            PinState::Approved
        })
    }

    /// Pins what was last seen of a tool; false when it was never seen.
    /// Pins the definition last seen, if its hash starts with `hash` (what
    /// the operator reviewed in `tools list`: a definition that changed
    /// since is not approved unseen).
    pub fn approve_pin(
        &self,
        server: &str,
        tool: &str,
        hash: &str,
    ) -> Result<Approval, StoreError> {
        let seen: Option<String> = self
            .conn
            .query_row(
                "SELECT seen_hash FROM tool_pins WHERE server = ?1 AND tool = ?2",
                params![server, tool],
                |r| r.get(0),
            )
            .optional()?;
        let Some(seen) = seen else {
            return Ok(Approval::Unknown);
        };
        if hash.len() < 12 || !seen.starts_with(hash) {
            return Ok(Approval::Mismatch(seen));
        }
        self.conn.execute(
            "UPDATE tool_pins SET approved_hash = seen_hash, state = 'approved', reason = NULL, updated_at = ?3 WHERE server = ?1 AND tool = ?2",
            params![server, tool, now_ms()],
        )?;
        Ok(Approval::Approved)
    }

    /// Every pin, by server, in the order the server last listed its tools.
    pub fn pins(&self) -> Result<Vec<PinRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT server, tool, state, reason, approved_hash, seen_hash FROM tool_pins ORDER BY server, position, tool",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(PinRow {
                server: r.get(0)?,
                tool: r.get(1)?,
                state: r.get(2)?,
                reason: r.get(3)?,
                approved_hash: r.get(4)?,
                seen_hash: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every message ever stored, oldest first (tests and audits).
    pub fn all_messages(&self) -> Result<Vec<Message>, StoreError> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY seq");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], message_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// What a finished turn sets off: the reply its sender waits for, or a
/// child's report to its parent. Replies are never refused for a full
/// inbox: the sender asked for them.
fn follow_up(
    conn: &Connection,
    agent: &Agent,
    message: &Message,
    outcome: &TurnOutcome,
) -> Result<(), StoreError> {
    let (answer, failed) = match outcome {
        TurnOutcome::Done { result } => (result.clone(), false),
        TurnOutcome::Failed { reason } => (format!("its turn failed: {reason}"), true),
    };
    let (kind, delivery, text) = if wants_reply(message) {
        conn.execute(
            "UPDATE messages SET answered = 1 WHERE id = ?1",
            [&message.id],
        )?;
        let kind = if failed { "no_reply" } else { "reply" };
        (kind, Delivery::Turn, answer)
    } else if message.kind == "instructions"
        && agent.parent_id.as_deref() == Some(message.from_id.as_str())
    {
        let verb = if failed {
            "could not finish"
        } else {
            "finished"
        };
        let text = format!("{} {verb} its instructions: {answer}", agent.name);
        ("report", Delivery::Inbox, text)
    } else {
        return Ok(());
    };
    let sender_exists = conn
        .prepare_cached("SELECT 1 FROM agents WHERE id = ?1")?
        .exists([&message.from_id])?;
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
        insert_message(conn, &reply)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, parent: Option<&str>) -> Agent {
        Agent {
            id: format!("id-{name}"),
            name: name.into(),
            role: "worker".into(),
            parent_id: parent.map(|p| format!("id-{p}")),
            workspace: None,
            depth: u32::from(parent.is_some()),
            created_at: now_ms(),
            model: None,
        }
    }

    #[test]
    fn agents_messages_and_inbox_depth() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        store.insert_agent(&agent("lead", None), None).unwrap();
        store
            .insert_agent(&agent("w1", Some("lead")), None)
            .unwrap();
        assert!(
            store
                .insert_agent(&agent("w1", Some("lead")), None)
                .is_err(),
            "names are unique"
        );
        assert_eq!(store.children("id-lead").unwrap().len(), 1);
        let from = Sender {
            id: "id-lead",
            name: "lead",
        };
        let msg = |text| NewMessage {
            from: from.clone(),
            to_id: "id-w1",
            text,
            sync: false,
            kind: "message",
            delivery: Delivery::Inbox,
            thread: None,
            dedupe_key: None,
        };
        let sent = store
            .send(&[msg("a"), msg("b"), msg("c")], Some(2))
            .unwrap();
        assert!(
            sent[0].is_some() && sent[1].is_some() && sent[2].is_none(),
            "the third does not fit"
        );
        assert_eq!(store.queued_count("id-w1").unwrap(), 2);
        let inbox = store.take_inbox("id-w1").unwrap();
        assert_eq!(
            inbox.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(store.take_inbox("id-w1").unwrap().is_empty());
        // Durable: a new connection sees the same state.
        drop(store);
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(store.recent_messages("id-w1", 10).unwrap().len(), 2);
        assert_eq!(store.agent_by_name("w1").unwrap().unwrap().depth, 1);
    }

    fn turn_message<'a>(
        from: &'a str,
        to: &'a str,
        text: &'a str,
        key: Option<&str>,
    ) -> NewMessage<'a> {
        NewMessage {
            from: Sender {
                id: from,
                name: from.trim_start_matches("id-"),
            },
            to_id: to,
            text,
            sync: true,
            kind: "message",
            delivery: Delivery::Turn,
            thread: None,
            dedupe_key: key.map(String::from),
        }
    }

    #[test]
    fn a_sync_message_is_a_turn_and_its_answer_the_senders_next_turn() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        store.insert_agent(&agent("lead", None), None).unwrap();
        store
            .insert_agent(&agent("w1", Some("lead")), None)
            .unwrap();
        let first = store
            .send(&[turn_message("id-lead", "id-w1", "q1", Some("t#1"))], None)
            .unwrap();
        let again = store
            .send(&[turn_message("id-lead", "id-w1", "q1", Some("t#1"))], None)
            .unwrap();
        assert_eq!(first, again, "a re-run finds the first message");
        store
            .send(&[turn_message("id-lead", "id-w1", "q2", None)], None)
            .unwrap();
        assert!(
            store.take_inbox("id-w1").unwrap().is_empty(),
            "turns are not inbox messages"
        );
        assert_eq!(store.agent_status("id-lead").unwrap().state, "waiting");
        // One turn per agent at a time, oldest first.
        let claimed = store.claim_turns(5).unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].message.as_ref().unwrap().text, "q1");
        assert!(store.claim_turns(5).unwrap().is_empty());
        assert_eq!(store.agent_status("id-w1").unwrap().state, "busy");
        // A restart queues it again.
        assert_eq!(store.recover_running().unwrap(), 1);
        let claimed = store.claim_turns(5).unwrap();
        assert_eq!(
            (claimed[0].attempt, claimed[0].id.clone()),
            (2, claimed[0].id.clone())
        );
        store
            .finish_turn(&TurnFinish {
                turn_id: &claimed[0].id,
                session_id: Some("s-1"),
                outcome: TurnOutcome::Done {
                    result: "a1".into(),
                },
                tool_calls: "[]".into(),
                notes: "{}".into(),
            })
            .unwrap();
        let reply = store.claim_turns(5).unwrap();
        let lead_turn = reply.iter().find(|t| t.agent.id == "id-lead").unwrap();
        let m = lead_turn.message.as_ref().unwrap();
        assert_eq!(
            (m.kind.as_str(), m.text.as_str(), m.from_name.as_str()),
            ("reply", "a1", "w1")
        );
        assert_eq!(m.thread, first[0].clone().unwrap());
        let w1_turn = reply.iter().find(|t| t.agent.id == "id-w1").unwrap();
        assert_eq!(
            w1_turn.session_id.as_deref(),
            Some("s-1"),
            "the next turn resumes"
        );
        // A failed turn fails its agent and still answers the sender.
        store
            .finish_turn(&TurnFinish {
                turn_id: &w1_turn.id,
                session_id: None,
                outcome: TurnOutcome::Failed {
                    reason: "boom".into(),
                },
                tool_calls: "[]".into(),
                notes: "{}".into(),
            })
            .unwrap();
        let status = store.agent_status("id-w1").unwrap();
        assert_eq!(
            (status.state.as_str(), status.reason.as_deref()),
            ("failed", Some("boom"))
        );
        let kinds: Vec<String> = store
            .all_messages()
            .unwrap()
            .into_iter()
            .map(|m| m.kind)
            .collect();
        assert_eq!(kinds, ["message", "message", "reply", "no_reply"]);
    }

    #[test]
    fn an_older_database_gains_the_new_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE agents (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL, parent_id TEXT, workspace TEXT, depth INTEGER NOT NULL, created_at INTEGER NOT NULL);
                 INSERT INTO agents VALUES ('id-old', 'old', 'worker', NULL, NULL, 0, 1);",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.agent_by_name("old").unwrap().unwrap().model, None);
        assert_eq!(store.agent_status("id-old").unwrap().state, "idle");
    }

    #[test]
    fn removing_an_agent_answers_whoever_waits_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        store.insert_agent(&agent("lead", None), None).unwrap();
        store
            .insert_agent(&agent("w1", Some("lead")), None)
            .unwrap();
        store
            .send(&[turn_message("id-lead", "id-w1", "q", None)], None)
            .unwrap();
        assert_eq!(store.agent_status("id-lead").unwrap().awaiting_replies, 1);
        assert!(store.remove_agent("id-w1").unwrap());
        assert_eq!(store.agent_status("id-lead").unwrap().awaiting_replies, 0);
        let next = store.claim_turns(5).unwrap();
        let m = next[0].message.as_ref().unwrap();
        assert_eq!(
            (next[0].agent.id.as_str(), m.kind.as_str(), m.text.as_str()),
            (
                "id-lead",
                "no_reply",
                "its turn failed: the agent was removed"
            )
        );
        assert!(!store.remove_agent("id-w1").unwrap());
    }

    #[test]
    fn pins_trust_first_sight_and_quarantine_changes_until_approved() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let q = |why: &str| PinState::Quarantined(why.to_string());
        assert_eq!(
            store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
            PinState::Approved
        );
        assert_eq!(
            store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
            PinState::Approved
        );
        let changed = "its definition changed since it was approved";
        assert_eq!(
            store.check_pin("s", "t", 0, "h2", "{}", None).unwrap(),
            q(changed)
        );
        // Changing back does not lift the quarantine: an operator decides.
        assert_eq!(
            store.check_pin("s", "t", 0, "h1", "{}", None).unwrap(),
            q(changed)
        );
        assert_eq!(
            store.approve_pin("s", "t", "h2").unwrap(),
            Approval::Mismatch("h1".into()),
            "a short or wrong hash approves nothing"
        );
        assert_eq!(
            store.approve_pin("s", "t", "h1").unwrap(),
            Approval::Mismatch("h1".into()),
            "at least 12 characters"
        );
        store
            .check_pin("s", "t", 0, "h1aaaaaaaaaaaaa", "{}", None)
            .unwrap();
        assert_eq!(
            store.approve_pin("s", "t", "h1aaaaaaaaaa").unwrap(),
            Approval::Approved
        );
        assert_eq!(
            store
                .check_pin("s", "t", 0, "h1aaaaaaaaaaaaa", "{}", None)
                .unwrap(),
            PinState::Approved
        );
        assert_eq!(
            store
                .check_pin("s", "hidden", 1, "h", "{}", Some("hidden character"))
                .unwrap(),
            q("hidden character")
        );
        assert_eq!(
            store.approve_pin("s", "never", "h1aaaaaaaaaa").unwrap(),
            Approval::Unknown
        );
        let pins = store.pins().unwrap();
        assert_eq!(pins.len(), 2);
        assert_eq!(
            (pins[0].tool.as_str(), pins[0].state.as_str()),
            ("t", "approved"),
            "in listed order"
        );
    }
}
