//! An agent's call rates (token buckets) and its turns' tool steps,
//! counted in the database so that every daemon sees them: a daemon that
//! adopts an agent, or runs its turn again, continues its counts. Each
//! count is a conditional upsert or update (as the team's minutes,
//! store::usage): two daemons cannot both take the last token or step.

use super::db::{Db, Engine, Value, args};
use super::values::ToValue;
use super::{Store, StoreError, now_ms};

/// Units of a bucket per token: a bucket refilled at `per_minute` tokens a
/// minute gains exactly `per_minute` units a millisecond, in integers.
const UNIT: i64 = 60_000;

/// The limits one call is counted against; each optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallLimits<'a> {
    /// All the agent's calls: (per minute, burst).
    pub calls: Option<(u32, u32)>,
    /// This tool's calls: (tool, per minute, burst).
    pub tool: Option<(&'a str, u32, u32)>,
    /// The running turn's steps: (turn id, limit).
    pub steps: Option<(&'a str, u32)>,
}

/// What counting a call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallCount {
    Admitted,
    /// The turn has made its steps (no token was taken).
    StepLimit,
    /// A bucket is empty: its next token is this many milliseconds away
    /// (a token of the agent's other bucket may have been spent).
    RateLimited {
        retry_after_ms: u64,
    },
}

/// A statement's parameters, numbered as they are added.
#[derive(Default)]
struct Params(Vec<Value>);

impl Params {
    fn add(&mut self, value: impl ToValue) -> String {
        self.0.push(value.to_value());
        format!("?{}", self.0.len())
    }

    fn int(&mut self, value: i64) -> String {
        format!("CAST({} AS BIGINT)", self.add(value))
    }
}

/// One bucket: (tool key, capacity in units, units gained a millisecond).
type Bucket = (String, i64, i64);

fn buckets(limits: &CallLimits<'_>) -> [Option<Bucket>; 2] {
    let bucket = |key: String, rate: u32, burst: u32| {
        (key, i64::from(burst.max(1)) * UNIT, i64::from(rate.max(1)))
    };
    [
        // The agent's bucket is "", a tool's "/TOOL": no tool's name is
        // taken for the agent's.
        limits
            .calls
            .map(|(rate, burst)| bucket(String::new(), rate, burst)),
        limits
            .tool
            .map(|(tool, rate, burst)| bucket(format!("/{tool}"), rate, burst)),
    ]
}

/// Now in milliseconds, in a statement: the database's clock on
/// PostgreSQL (hosts' clocks may disagree), a parameter on SQLite.
fn now_sql(engine: Engine, params: &mut Params) -> String {
    match engine {
        Engine::Sqlite => params.int(now_ms()),
        Engine::Postgres => {
            "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)".into()
        }
    }
}

/// A bucket's units now (refilled since its last take, at most `cap`).
fn refilled(now: &str, cap: &str, rate: &str) -> String {
    let gained = format!(
        "(CASE WHEN {now} > agent_buckets.last_ms THEN {now} - agent_buckets.last_ms ELSE 0 END) * {rate}"
    );
    format!(
        "(CASE WHEN agent_buckets.units + {gained} >= {cap} THEN {cap} ELSE agent_buckets.units + {gained} END)"
    )
}

/// Takes one token from `bucket` of `agent` for each row of `source`
/// (a query giving one row or none); returns a row when it took one.
fn take_token_sql(
    params: &mut Params,
    now: &str,
    agent: &str,
    bucket: &Bucket,
    source: &str,
) -> String {
    let (key, cap, rate) = (
        params.add(bucket.0.as_str()),
        params.int(bucket.1),
        params.int(bucket.2),
    );
    let have = refilled(now, &cap, &rate);
    format!(
        "INSERT INTO agent_buckets (agent_id, tool, units, last_ms)
         SELECT {agent}, {key}, {cap} - {UNIT}, {now} {source}
         ON CONFLICT (agent_id, tool) DO UPDATE SET
            units = {have} - {UNIT},
            last_ms = CASE WHEN {now} > agent_buckets.last_ms THEN {now} ELSE agent_buckets.last_ms END
         WHERE {have} >= {UNIT}
         RETURNING 1"
    )
}

/// How long until `bucket` of `agent` has a token again.
fn retry_after(db: &Db, agent: &str, bucket: &Bucket) -> Result<u64, StoreError> {
    let mut params = Params::default();
    let now = now_sql(db.engine(), &mut params);
    let (agent, key) = (params.add(agent), params.add(bucket.0.as_str()));
    let have = refilled(&now, &params.int(bucket.1), &params.int(bucket.2));
    let sql = format!("SELECT {have} FROM agent_buckets WHERE agent_id = {agent} AND tool = {key}");
    let held: i64 = match db.row(&sql, &params.0)? {
        Some(row) => row.get(0)?,
        None => 0,
    };
    let missing = (UNIT - held).max(1);
    Ok(u64::try_from((missing + bucket.2 - 1) / bucket.2).unwrap_or(1))
}

impl Store {
    /// Counts one call of `agent_id` against `limits`, shared by every
    /// daemon: a step of the turn unless it has made its limit, a token
    /// from each bucket unless one is empty (then the step is not
    /// counted). On PostgreSQL one statement, committed without waiting
    /// for the disk (below); on SQLite one transaction.
    pub fn count_call(
        &self,
        agent_id: &str,
        limits: &CallLimits<'_>,
    ) -> Result<CallCount, StoreError> {
        if limits.calls.is_none() && limits.tool.is_none() && limits.steps.is_none() {
            // Nothing to count: no round trip (every tool call comes here).
            return Ok(CallCount::Admitted);
        }
        let found = match self.db.engine() {
            Engine::Postgres => count_in_one_statement(&self.db, agent_id, limits)?,
            Engine::Sqlite => self
                .db
                .transaction(|tx| count_statement_by_statement(tx, agent_id, limits))?,
        };
        match found {
            Counted::All => Ok(CallCount::Admitted),
            Counted::NoStep => Ok(CallCount::StepLimit),
            Counted::NoToken(bucket) => Ok(CallCount::RateLimited {
                retry_after_ms: retry_after(&self.db, agent_id, &bucket)?,
            }),
        }
    }

    /// The tool steps a turn has made.
    pub fn turn_steps(&self, turn_id: &str) -> Result<u32, StoreError> {
        let steps: i64 = self
            .db
            .one("SELECT steps FROM turns WHERE id = ?1", args![turn_id])?
            .get(0)?;
        Ok(u32::try_from(steps).unwrap_or(u32::MAX))
    }
}

enum Counted {
    All,
    NoStep,
    NoToken(Bucket),
}

/// PostgreSQL: the whole count in one statement, one round trip. Each
/// part runs only on the row of the part before: a turn with steps left,
/// a token from the agent's bucket, one from the tool's, then the step
/// (checked again under the turn's row lock: two daemons cannot both
/// take the last). Committed with `synchronous_commit` off for this
/// statement alone: a count is worth no wait for the disk on every tool
/// call (an fsync, 3 ms here), and a count lost with the server (never
/// with a daemon) costs an agent a few calls' worth of its limit.
fn count_in_one_statement(
    db: &Db,
    agent_id: &str,
    limits: &CallLimits<'_>,
) -> Result<Counted, StoreError> {
    let mut params = Params::default();
    let now = now_sql(Engine::Postgres, &mut params);
    let buckets = buckets(limits);
    // Bound only where used: PostgreSQL types every parameter from its use.
    let agent = if buckets.iter().any(Option::is_some) {
        params.add(agent_id)
    } else {
        String::new()
    };
    let mut parts =
        vec!["quick AS (SELECT set_config('synchronous_commit', 'off', true) AS off)".to_string()];
    let room = match limits.steps {
        Some((turn, limit)) => {
            let (turn, limit) = (params.add(turn), params.int(i64::from(limit)));
            parts.push(format!(
                "room AS (SELECT 1 FROM quick WHERE (SELECT steps FROM turns WHERE id = {turn}) < {limit})"
            ));
            Some((turn, limit))
        }
        None => {
            parts.push("room AS (SELECT 1 FROM quick)".into());
            None
        }
    };
    let mut source = "room";
    for (name, bucket) in ["calls", "tool"].into_iter().zip(&buckets) {
        let Some(bucket) = bucket else {
            parts.push(format!("{name} AS (SELECT 1 FROM {source})"));
            source = name;
            continue;
        };
        let take = take_token_sql(&mut params, &now, &agent, bucket, &format!("FROM {source}"));
        parts.push(format!("{name} AS ({take})"));
        source = name;
    }
    match &room {
        Some((turn, limit)) => parts.push(format!(
            "step AS (UPDATE turns SET steps = steps + 1 FROM tool WHERE id = {turn} AND steps < {limit} RETURNING 1)"
        )),
        None => parts.push("step AS (SELECT 1 FROM tool)".into()),
    }
    let sql = format!(
        "WITH {} SELECT (SELECT COUNT(*) FROM room), (SELECT COUNT(*) FROM calls),
                (SELECT COUNT(*) FROM tool), (SELECT COUNT(*) FROM step)",
        parts.join(",\n")
    );
    let row = db.one(&sql, &params.0)?;
    let [room, calls, tool, step]: [i64; 4] = [row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?];
    Ok(outcome(room, calls, tool, step, buckets))
}

fn outcome(room: i64, calls: i64, tool: i64, step: i64, buckets: [Option<Bucket>; 2]) -> Counted {
    let [calls_bucket, tool_bucket] = buckets;
    match (room, calls, tool, step, calls_bucket, tool_bucket) {
        (0, ..) => Counted::NoStep,
        (_, 0, _, _, Some(bucket), _) | (_, _, 0, _, _, Some(bucket)) => Counted::NoToken(bucket),
        // A step taken by another daemon since `room` was read.
        (_, _, _, 0, ..) => Counted::NoStep,
        _ => Counted::All,
    }
}

/// SQLite: the same count, a statement at a time, in the caller's
/// transaction (which holds the write lock).
fn count_statement_by_statement(
    tx: &Db,
    agent_id: &str,
    limits: &CallLimits<'_>,
) -> Result<Counted, StoreError> {
    if let Some((turn, limit)) = limits.steps {
        // A turn not found has no steps left (as on PostgreSQL).
        let steps: i64 = match tx.row("SELECT steps FROM turns WHERE id = ?1", args![turn])? {
            Some(row) => row.get(0)?,
            None => i64::MAX,
        };
        if steps >= i64::from(limit) {
            return Ok(Counted::NoStep);
        }
    }
    for bucket in buckets(limits).into_iter().flatten() {
        let mut params = Params::default();
        let now = now_sql(Engine::Sqlite, &mut params);
        let agent = params.add(agent_id);
        // SQLite reads ON CONFLICT after a SELECT with a WHERE clause.
        let sql = take_token_sql(&mut params, &now, &agent, &bucket, "WHERE true");
        if tx.row(&sql, &params.0)?.is_none() {
            return Ok(Counted::NoToken(bucket));
        }
    }
    if let Some((turn, _)) = limits.steps {
        tx.execute(
            "UPDATE turns SET steps = steps + 1 WHERE id = ?1",
            args![turn],
        )?;
    }
    Ok(Counted::All)
}
