//! Durable state in SQLite (WAL): agents and their tree, messages and
//! inboxes. Every write that a caller acknowledges is committed first; with
//! WAL and `synchronous = NORMAL` a committed transaction survives the
//! daemon being killed (power loss may lose the last ones; see docs).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
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
";

fn agent_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Agent> {
    Ok(Agent {
        id: row.get(0)?,
        name: row.get(1)?,
        role: row.get(2)?,
        parent_id: row.get(3)?,
        workspace: row.get(4)?,
        depth: row.get(5)?,
        created_at: row.get(6)?,
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
    })
}

const AGENT_COLUMNS: &str = "id, name, role, parent_id, workspace, depth, created_at";
const MESSAGE_COLUMNS: &str = "id, from_id, from_name, to_id, text, sync, kind, status, created_at";

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self { conn })
    }

    pub fn insert_agent(&self, agent: &Agent) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO agents (id, name, role, parent_id, workspace, depth, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![agent.id, agent.name, agent.role, agent.parent_id, agent.workspace, agent.depth, agent.created_at],
        )?;
        Ok(())
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

    pub fn remove_agent(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .execute("DELETE FROM agents WHERE id = ?1", [id])?
            == 1)
    }

    pub fn queued_count(&self, to_id: &str) -> Result<u32, StoreError> {
        let n: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued'",
            [to_id],
            |r| r.get(0),
        )?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Queues messages in one transaction, each only if its recipient's
    /// inbox has room (`inbox_depth`). Returns, per message, its id or
    /// `None` when that inbox was full. Committed before it returns.
    pub fn send(
        &mut self,
        messages: &[NewMessage<'_>],
        inbox_depth: Option<u32>,
    ) -> Result<Vec<Option<String>>, StoreError> {
        let tx = self.conn.transaction()?;
        let mut ids = Vec::new();
        for m in messages {
            if let Some(depth) = inbox_depth {
                let queued: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued'",
                    [m.to_id],
                    |r| r.get(0),
                )?;
                if queued >= i64::from(depth) {
                    ids.push(None);
                    continue;
                }
            }
            let id = uuid::Uuid::new_v4().to_string();
            tx.execute(
                "INSERT INTO messages (id, from_id, from_name, to_id, text, sync, kind, status, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8)",
                params![id, m.from.id, m.from.name, m.to_id, m.text, m.sync, m.kind, now_ms()],
            )?;
            ids.push(Some(id));
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
                Ok((message_row(row)?, row.get::<_, i64>(9)?))
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
        }
    }

    #[test]
    fn agents_messages_and_inbox_depth() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        store.insert_agent(&agent("lead", None)).unwrap();
        store.insert_agent(&agent("w1", Some("lead"))).unwrap();
        assert!(
            store.insert_agent(&agent("w1", Some("lead"))).is_err(),
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
}
