//! Row-level statements the table families share: a message inserted
//! (with its turn when the recipient must answer), a turn inserted, a
//! message read back, an inbox counted.

use super::StoreError;
use super::db::{Db, Engine, args};
use super::now_ms;
use super::rows::*;

pub(super) fn count(db: &Db, to_id: &str) -> Result<u32, StoreError> {
    let n: i64 = db
        .one(
            "SELECT (SELECT COUNT(*) FROM messages WHERE to_id = ?1 AND status = 'queued')
                  + (SELECT COUNT(*) FROM turns WHERE agent_id = ?1 AND status = 'queued')",
            args![to_id],
        )?
        .get(0)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Inserts a message, and its turn when it is delivered as one; fails
/// when its dedupe key is taken.
pub(super) fn insert_message(db: &Db, m: &NewMessage<'_>) -> Result<String, StoreError> {
    insert_message_once(db, m, "")
}

/// Inserts a message unless its dedupe key is taken: by another daemon's
/// transaction too, committed meanwhile (the unique index waits for it).
/// Returns the id of the message stored with the key.
pub(super) fn send_message_once(db: &Db, m: &NewMessage<'_>) -> Result<String, StoreError> {
    let on_conflict = " ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING";
    insert_message_once(db, m, on_conflict)
}

fn insert_message_once(
    db: &Db,
    m: &NewMessage<'_>,
    on_conflict: &str,
) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    let inserted = db.execute(
        &format!("INSERT INTO messages (id, from_id, from_name, to_id, text, sync, kind, status, created_at, thread, dedupe_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11){on_conflict}"),
        args![id, m.from.id, m.from.name, m.to_id, m.text, m.sync, m.kind, m.delivery.status(), now_ms(), m.thread, m.dedupe_key],
    )?;
    if inserted == 0
        && let Some(key) = &m.dedupe_key
    {
        return message_with_key(db, key)?.ok_or(StoreError::NoRow);
    }
    if m.delivery == Delivery::Turn {
        insert_turn(db, m.to_id, Some(&id), None)?;
    }
    Ok(id)
}

/// The id of the message stored with this dedupe key, if any.
pub(super) fn message_with_key(db: &Db, key: &str) -> Result<Option<String>, StoreError> {
    db.row("SELECT id FROM messages WHERE dedupe_key = ?1", args![key])?
        .map(|row| row.get(0))
        .transpose()
}

/// PostgreSQL: holds, to the transaction's end, a lock on each recipient's
/// inbox, so its depth is counted and written by one daemon at a time
/// (read committed lets two count the same room). Taken in the ids'
/// order, so two sends to the same recipients cannot wait for each other.
/// SQLite's IMMEDIATE transaction already holds the database's one write
/// lock.
pub(super) fn lock_inboxes<'a>(
    db: &Db,
    recipients: impl Iterator<Item = &'a str>,
) -> Result<(), StoreError> {
    if db.engine() != Engine::Postgres {
        return Ok(());
    }
    let recipients: std::collections::BTreeSet<&str> = recipients.collect();
    for to_id in recipients {
        // The first key is this program's inbox lock (the daemon lock's
        // is 73370026); the second names the schema and the recipient.
        db.execute(
            "SELECT pg_advisory_xact_lock(73370027, hashtext(current_schema() || ':' || ?1))",
            args![to_id],
        )?;
    }
    Ok(())
}

pub(super) fn message_by_id(db: &Db, id: &str) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?1");
    db.row(&sql, args![id])?
        .as_ref()
        .map(message_row)
        .transpose()
}

/// Whether the sender of `m` waits for the turn's answer as a reply.
pub(super) fn wants_reply(m: &Message) -> bool {
    m.from_id != "operator"
        && ((m.kind == MessageKind::Message && m.sync) || m.kind == MessageKind::Broadcast)
}

pub(super) fn insert_turn(
    db: &Db,
    agent_id: &str,
    message_id: Option<&str>,
    prompt: Option<&str>,
) -> Result<String, StoreError> {
    let id = uuid::Uuid::new_v4().to_string();
    db.execute(
        "INSERT INTO turns (id, agent_id, message_id, prompt, status, created_at) VALUES (?1, ?2, ?3, ?4, 'queued', ?5)",
        args![id, agent_id, message_id, prompt, now_ms()],
    )?;
    // Other daemons of the database learn of it at once, when the
    // transaction commits (their poll is the fallback): the payload names
    // the daemon that runs the agent.
    if db.engine() == Engine::Postgres {
        db.execute(
            "SELECT pg_notify('substrat_turns', COALESCE((SELECT daemon_id FROM agents WHERE id = ?1), ''))",
            args![agent_id],
        )?;
    }
    Ok(id)
}
