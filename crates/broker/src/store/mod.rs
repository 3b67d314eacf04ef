//! Durable state in SQLite (WAL): agents and their tree, messages and
//! inboxes. Every write that a caller acknowledges is committed first; with
//! WAL and `synchronous = NORMAL` a committed transaction survives the
//! daemon being killed (power loss may lose the last ones; see docs).
//!
//! One module per table family (agents, messages, turns, pins, model usage), each adding
//! its methods to `Store`; `rows` holds the typed rows, `schema` the tables.

mod agents;
mod certs;
mod messages;
mod pins;
mod rows;
mod schema;
mod sql;
mod states;
#[cfg(test)]
mod tests;
mod turns;
mod usage;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

pub use rows::{
    Agent, AgentState, AgentStatus, Approval, ClaimedTurn, Delivery, Message, MessageKind,
    MessageStatus, NewMessage, PinRow, PinState, PinStatus, Sender, StoredState, TurnEffect,
    TurnFinish, TurnKind, TurnOutcome, TurnRecord, TurnStatus,
};
pub use schema::latest_version;
pub use usage::ModelUsage;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error(
        "the state database is at schema version {found}, newer than this build's {known}: \
         it was written by a newer substrat-sandbox; run that one (nothing was changed)"
    )]
    Newer { found: i64, known: i64 },
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

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Plans fixed at prepare: without this, a statement with a bound
        // value that a partial index's WHERE might match (messages_dedupe)
        // is compiled again on every run, a quarter of the daemon's time
        // under check_inbox load (perf, 2026-11-25).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        conn.set_prepared_statement_cache_capacity(64);
        schema::migrate(&mut conn)?;
        Ok(Self { conn })
    }
}
