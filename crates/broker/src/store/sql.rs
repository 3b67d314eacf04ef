//! Row-level statements the table families share: a message inserted
//! (with its turn when the recipient must answer), a turn inserted, a
//! message read back, an inbox counted.

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use super::now_ms;
use super::rows::*;

/// Statements through the connection's cache of prepared statements:
/// parsing one costs more than running it, and every call of an agent
/// runs some.
pub(super) trait Cached {
    fn cached_execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn cached_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn cached_execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn cached_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

pub(super) fn count(conn: &Connection, to_id: &str) -> Result<u32, StoreError> {
    let n: i64 = conn.cached_row(
        "SELECT (SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued')
              + (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued')",
        [to_id],
        |r| r.get(0),
    )?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Inserts a message, and its turn when it is delivered as one.
pub(super) fn insert_message(conn: &Connection, m: &NewMessage<'_>) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    conn.cached_execute(
        "INSERT INTO messages (id, from_id, from_name, to_id, text, sync, kind, status, created_at, thread, dedupe_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![id, m.from.id, m.from.name, m.to_id, m.text, m.sync, m.kind, m.delivery.status(), now_ms(), m.thread, m.dedupe_key],
    )?;
    if m.delivery == Delivery::Turn {
        insert_turn(conn, m.to_id, Some(&id), None)?;
    }
    Ok(id)
}

pub(super) fn message_by_id(conn: &Connection, id: &str) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1");
    Ok(conn.cached_row(&sql, [id], message_row).optional()?)
}

/// Whether the sender of `m` waits for the turn's answer as a reply.
pub(super) fn wants_reply(m: &Message) -> bool {
    m.from_id != "operator"
        && ((m.kind == MessageKind::Message && m.sync) || m.kind == MessageKind::Broadcast)
}

pub(super) fn insert_turn(
    conn: &Connection,
    agent_id: &str,
    message_id: Option<&str>,
    prompt: Option<&str>,
) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    conn.cached_execute(
        "INSERT INTO turns (id, agent_id, message_id, prompt, status, created_at) VALUES (?1, ?2, ?3, ?4, 'queued', ?5)",
        params![id, agent_id, message_id, prompt, now_ms()],
    )?;
    Ok(id)
}
