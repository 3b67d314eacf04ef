//! Calls to the state database, counted by what they do and how they
//! ended, for the metrics (`substrat_db_calls_total`): a few fixed kinds,
//! never the statement's text. Counted for the process (a daemon has one
//! store; the tests' stores in one process add up).

use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// What a statement does, by its first word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbOp {
    /// SELECT, WITH.
    Read,
    /// INSERT, UPDATE, DELETE.
    Write,
    /// BEGIN, COMMIT, ROLLBACK.
    Transaction,
    /// The schema, pragmas, locks, notifications.
    Other,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbOutcome {
    Ok,
    /// The database was unreachable or broke a conflict: may be retried.
    Retryable,
    Error,
}

impl DbOp {
    pub const ALL: [DbOp; 4] = [DbOp::Read, DbOp::Write, DbOp::Transaction, DbOp::Other];

    pub fn of(sql: &str) -> Self {
        let word = sql.split_whitespace().next().unwrap_or("");
        let is = |w: &str| word.eq_ignore_ascii_case(w);
        if is("SELECT") || is("WITH") {
            DbOp::Read
        } else if is("INSERT") || is("UPDATE") || is("DELETE") {
            DbOp::Write
        } else if is("BEGIN") || is("COMMIT") || is("ROLLBACK") {
            DbOp::Transaction
        } else {
            DbOp::Other
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DbOp::Read => "read",
            DbOp::Write => "write",
            DbOp::Transaction => "transaction",
            DbOp::Other => "other",
        }
    }
}

impl DbOutcome {
    pub const ALL: [DbOutcome; 3] = [DbOutcome::Ok, DbOutcome::Retryable, DbOutcome::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            DbOutcome::Ok => "ok",
            DbOutcome::Retryable => "retryable_error",
            DbOutcome::Error => "error",
        }
    }
}

static COUNTS: [[AtomicU64; 3]; 4] = [const { [const { AtomicU64::new(0) }; 3] }; 4];

/// Counts one call of `sql` that ended in `result`.
pub(super) fn count<T>(sql: &str, result: &Result<T, StoreError>) {
    let outcome = match result {
        Ok(_) => DbOutcome::Ok,
        Err(e) if e.is_retryable() => DbOutcome::Retryable,
        Err(_) => DbOutcome::Error,
    };
    COUNTS[DbOp::of(sql) as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
}

/// Every (kind, outcome) with its count so far.
pub fn counts() -> Vec<(DbOp, DbOutcome, u64)> {
    let mut all = Vec::new();
    for op in DbOp::ALL {
        for outcome in DbOutcome::ALL {
            let n = COUNTS[op as usize][outcome as usize].load(Ordering::Relaxed);
            all.push((op, outcome, n));
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_known_by_their_first_word() {
        assert_eq!(DbOp::of("  select 1"), DbOp::Read);
        assert_eq!(DbOp::of("WITH x AS (SELECT 1) SELECT * FROM x"), DbOp::Read);
        assert_eq!(DbOp::of("\nINSERT INTO t VALUES (1)"), DbOp::Write);
        assert_eq!(DbOp::of("BEGIN IMMEDIATE"), DbOp::Transaction);
        assert_eq!(DbOp::of("CREATE TABLE t (x)"), DbOp::Other);
        assert_eq!(DbOp::of(""), DbOp::Other);
    }

    #[test]
    fn calls_are_counted_by_kind_and_outcome() {
        let before = |op, outcome| {
            counts()
                .into_iter()
                .find(|&(o, r, _)| o == op && r == outcome)
                .map_or(0, |(_, _, n)| n)
        };
        let (reads, errors) = (
            before(DbOp::Read, DbOutcome::Ok),
            before(DbOp::Write, DbOutcome::Error),
        );
        count("SELECT 1", &Ok::<(), StoreError>(()));
        count("UPDATE t SET x = 1", &Err::<(), _>(StoreError::NoRow));
        assert!(before(DbOp::Read, DbOutcome::Ok) > reads);
        assert!(before(DbOp::Write, DbOutcome::Error) > errors);
    }
}
