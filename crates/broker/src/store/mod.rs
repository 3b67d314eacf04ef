//! Durable state: agents and their tree, messages and inboxes, turns. In
//! SQLite (WAL) by default, or in PostgreSQL for a team across hosts. Every
//! write that a caller acknowledges is committed first; with WAL and
//! `synchronous = NORMAL` a committed SQLite transaction survives the
//! daemon being killed (power loss may lose the last ones; see docs).
//!
//! One module per table family (agents, messages, turns, pins, model usage), each adding
//! its methods to `Store`; `rows` holds the typed rows, `schema` the tables,
//! `db` the connection to either engine (`pg` the PostgreSQL side).

mod agents;
#[cfg(test)]
mod attack_tests;
mod authorities;
mod call_counts;
mod certs;
#[cfg(test)]
mod daemon_tests;
mod daemons;
mod db;
pub mod db_stats;
mod location;
mod messages;
mod pg;
mod pg_address;
mod pins;
mod placement;
#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod race_tests;
mod rows;
mod schema;
mod sql;
mod states;
#[cfg(test)]
pub(crate) mod testdb;
#[cfg(test)]
mod tests;
mod turns;
mod usage;
mod values;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

pub use authorities::{AuthorityState, NewAuthority, RetireError, RotateError, StoredAuthority};
pub use certs::NewCert;
pub use daemons::{DaemonRow, Seat};
use db::Db;
pub use db::Engine;
pub use location::StateDatabase;
pub use pg::{CALL_TIMEOUT, listen_for_turns};
pub use placement::{AgentDaemon, Offer, PlacedKind};

pub use call_counts::{CallCount, CallLimits};
pub use rows::{
    Agent, AgentStart, AgentState, AgentStatus, Approval, ClaimedTurn, Delivery, Message,
    MessageKind, MessageStatus, NewMessage, PinRow, PinState, PinStatus, Sender, StoredState,
    TurnEffect, TurnFinish, TurnKind, TurnOutcome, TurnRecord, TurnStatus,
};
pub use schema::latest_version;
pub use usage::{ModelUsage, TeamAdmission};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("state database: {}", postgres_message(.0))]
    Postgres(tokio_postgres::Error),
    /// The database cannot be reached now; the call may be made again.
    #[error("the state database is unavailable (retry later): {0}")]
    Unavailable(String),
    #[error("cannot use the state database: {0}")]
    Connect(String),
    #[error("the state database is in use: {0}")]
    InUse(String),
    #[error("the state database's address: {0}")]
    Address(String),
    #[error("state database: column {index}: {why}")]
    Column { index: usize, why: String },
    #[error("state database: no row where one was expected")]
    NoRow,
    /// The agent is another daemon's now (adopted since it was looked up).
    #[error("the agent runs on daemon {0} now: ask that daemon")]
    Elsewhere(String),
    #[error(
        "the state database is at schema version {found}, newer than this build's {known}: \
         it was written by a newer substrat-sandbox; run that one (nothing was changed)"
    )]
    Newer { found: i64, known: i64 },
}

impl StoreError {
    /// Whether the same call may succeed later: the database was
    /// unreachable, or it broke a conflict between daemons by failing this
    /// transaction (nothing of it was kept).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable(_) => true,
            Self::Postgres(e) => e.code().is_some_and(|code| {
                // serialization_failure, deadlock_detected, a statement or
                // a lock wait past the server's bound (the daemon's own).
                matches!(code.code(), "40001" | "40P01" | "57014" | "55P03")
            }),
            Self::Sql(rusqlite::Error::SqliteFailure(e, _)) => {
                matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                )
            }
            _ => false,
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        use std::error::Error;
        // A socket that failed or closed, a connection exception (class
        // 08) or a server shutting down or starting (57P01-57P03): the
        // database is unreachable now. A refused login or a bad
        // configuration is not something waiting fixes.
        // A certificate refused is not something waiting fixes either
        // (tokio-postgres says so only in its message).
        if e.to_string().contains("TLS") {
            return Self::Connect(with_source(&e));
        }
        let io = e
            .source()
            .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some());
        let unreachable = e.is_closed()
            || io
            || e.code().is_some_and(|code| {
                let code = code.code();
                code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
            });
        if unreachable {
            return Self::Unavailable(with_source(&e));
        }
        if e.code().is_none() {
            return Self::Connect(with_source(&e));
        }
        Self::Postgres(e)
    }
}

/// The server's own words (its Display is "db error" alone).
fn postgres_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => with_source(e),
    }
}

/// tokio-postgres says what failed in its error and why in its source
/// ("invalid configuration": "password missing").
fn with_source(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

pub struct Store {
    db: Db,
    /// The daemon this store claims and creates for.
    seat: Seat,
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
    /// A statement as a database writer would run it (tests of what the
    /// daemon makes of rows it did not write).
    #[cfg(test)]
    pub(crate) fn write_as_attacker(&self, sql: &str) -> Result<usize, StoreError> {
        self.db.execute(sql, &[])
    }

    /// Opens the state database where `location` says, bringing its
    /// schema to this build's version.
    pub fn open_at(location: &StateDatabase) -> Result<Self, StoreError> {
        match location {
            StateDatabase::Sqlite(path) => Self::open(path),
            StateDatabase::Postgres(url) => Self::open_postgres(url),
        }
    }

    pub fn open_postgres(url: &str) -> Result<Self, StoreError> {
        let db = Db::Postgres(Box::new(pg::PgConn::connect(url)?));
        schema::migrate(&db)?;
        Ok(Self {
            db,
            seat: Seat::default(),
        })
    }

    pub fn engine(&self) -> Engine {
        self.db.engine()
    }

    /// For a daemon, once seated: on PostgreSQL, holds the lock that keeps
    /// a second process with this daemon's id off the database (schema)
    /// for as long as this store lives; on SQLite, one daemon in all, the
    /// daemon locks a file beside the database instead.
    pub fn hold_daemon_lock(&self) -> Result<(), StoreError> {
        match &self.db {
            Db::Sqlite(_) => Ok(()),
            Db::Postgres(pg) => pg.hold_daemon_lock(&self.seat.daemon_id),
        }
    }

    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
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
        let db = Db::Sqlite(conn);
        schema::migrate(&db)?;
        Ok(Self {
            db,
            seat: Seat::default(),
        })
    }
}
