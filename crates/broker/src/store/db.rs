//! One connection to the state database, SQLite or PostgreSQL, behind the
//! few calls the store makes: a statement with `?N` parameters (rewritten
//! to `$N` for PostgreSQL), its rows read back as typed values, and
//! transactions. The store's queries are written once, in the SQL both
//! engines speak; only the schema has a text per engine (schema.rs).

use rusqlite::types::{ToSqlOutput, ValueRef};

use super::StoreError;
use super::pg::PgConn;
pub(super) use super::values::{Row, Value, args};

/// Which engine a database runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

pub(super) enum Db {
    Sqlite(rusqlite::Connection),
    // Boxed: the connection and its cache are large beside SQLite's handle.
    Postgres(Box<PgConn>),
}

impl Db {
    pub(super) fn engine(&self) -> Engine {
        match self {
            Self::Sqlite(_) => Engine::Sqlite,
            Self::Postgres(_) => Engine::Postgres,
        }
    }

    /// Runs a statement; returns how many rows it changed.
    pub(super) fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, StoreError> {
        let result = self.execute_uncounted(sql, args);
        super::db_stats::count(sql, &result);
        result
    }

    fn execute_uncounted(&self, sql: &str, args: &[Value]) -> Result<usize, StoreError> {
        match self {
            Self::Sqlite(conn) => Ok(conn
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(args))?),
            Self::Postgres(pg) => pg.execute(sql, args),
        }
    }

    /// Every row of a query.
    pub(super) fn rows(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        let result = self.rows_uncounted(sql, args);
        super::db_stats::count(sql, &result);
        result
    }

    fn rows_uncounted(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        match self {
            Self::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                let columns = statement.column_count();
                let mut rows = statement.query(rusqlite::params_from_iter(args))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next()? {
                    let values = (0..columns)
                        .map(|i| sqlite_value(row.get_ref(i)?, i))
                        .collect::<Result<_, _>>()?;
                    out.push(Row(values));
                }
                Ok(out)
            }
            Self::Postgres(pg) => pg.rows(sql, args),
        }
    }

    /// The first row of a query, if any.
    pub(super) fn row(&self, sql: &str, args: &[Value]) -> Result<Option<Row>, StoreError> {
        Ok(self.rows(sql, args)?.into_iter().next())
    }

    /// The first row of a query that must have one.
    pub(super) fn one(&self, sql: &str, args: &[Value]) -> Result<Row, StoreError> {
        self.row(sql, args)?.ok_or(StoreError::NoRow)
    }

    /// Now, in milliseconds since the epoch, by the database's clock where
    /// daemons on several hosts compare times (heartbeats and leases):
    /// their own clocks may disagree.
    pub(super) fn now_ms(&self) -> Result<i64, StoreError> {
        match self {
            Self::Sqlite(_) => Ok(super::now_ms()),
            Self::Postgres(_) => self
                .one(
                    "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
                    &[],
                )?
                .get(0),
        }
    }

    /// Statements without parameters or results (the schema).
    pub(super) fn batch(&self, sql: &str) -> Result<(), StoreError> {
        let result = match self {
            Self::Sqlite(conn) => Ok(conn.execute_batch(sql)?),
            Self::Postgres(pg) => pg.batch(sql),
        };
        super::db_stats::count(sql, &result);
        result
    }

    /// Runs `work` in one transaction: committed when it returns `Ok`,
    /// rolled back when it returns an error or panics. On SQLite it holds
    /// the write lock from the start (every transaction here writes): one
    /// that read first and wrote later could fail at once when another
    /// connection wrote in between, where waiting for the lock succeeds.
    /// PostgreSQL takes row locks as statements need them.
    pub(super) fn transaction<T>(
        &self,
        work: impl FnOnce(&Db) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let start = match self.engine() {
            Engine::Sqlite => "BEGIN IMMEDIATE",
            Engine::Postgres => "BEGIN",
        };
        self.batch(start)?;
        let mut open = RollbackUnlessCommitted {
            db: self,
            armed: true,
        };
        let out = work(self)?;
        self.batch("COMMIT")?;
        open.armed = false;
        Ok(out)
    }
}

/// Rolls an open transaction back when its work failed or panicked, so the
/// connection is never left inside one.
struct RollbackUnlessCommitted<'a> {
    db: &'a Db,
    armed: bool,
}

impl Drop for RollbackUnlessCommitted<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Nothing more can be done when the rollback fails: the
            // connection is gone, and with it the transaction.
            let _ = self.db.batch("ROLLBACK");
        }
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::from(rusqlite::types::Null),
            Value::Int(n) => ToSqlOutput::from(*n),
            Value::Text(text) => ToSqlOutput::from(text.as_str()),
        })
    }
}

fn sqlite_value(value: ValueRef<'_>, index: usize) -> Result<Value, StoreError> {
    match value {
        ValueRef::Null => Ok(Value::Null),
        ValueRef::Integer(n) => Ok(Value::Int(n)),
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Value::Text(text.to_owned())),
            Err(_) => Err(StoreError::Column {
                index,
                why: "a text that is not UTF-8".into(),
            }),
        },
        ValueRef::Real(_) | ValueRef::Blob(_) => Err(StoreError::Column {
            index,
            why: "a real or a blob, which the store never writes".into(),
        }),
    }
}
