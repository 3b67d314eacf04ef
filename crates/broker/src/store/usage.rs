//! Model usage per agent, day (UTC) and API, as the gateway counted it.

use serde::Serialize;

use super::db::args;
use super::{Store, StoreError};

/// An agent's model use: today and in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelUsage {
    pub requests_today: u64,
    pub tokens_today: u64,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Today (UTC) by the database's clock: daemons on hosts whose clocks
/// disagree count the same day.
fn today(db: &super::db::Db) -> Result<i64, StoreError> {
    Ok(db.now_ms()? / 86_400_000)
}

/// The team's tokens today: used by every daemon's agents, and reserved
/// now by requests in flight.
fn team_day_held(db: &super::db::Db) -> Result<u64, StoreError> {
    let held: i64 = db
        .one(
            "SELECT CAST(COALESCE((SELECT SUM(input_tokens + output_tokens) FROM model_usage
                                   WHERE day = ?1), 0)
                       + COALESCE((SELECT SUM(tokens) FROM team_reservations
                                   WHERE expires_ms > ?2), 0) AS BIGINT)",
            args![today(db)?, db.now_ms()?],
        )?
        .get(0)?;
    Ok(u64::try_from(held).unwrap_or(0))
}

/// Whether the team may make one more model request (`team_admit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeamAdmission {
    Admitted,
    /// The minute's requests are spent; it ends in this many seconds.
    MinuteSpent {
        retry_after_s: u64,
    },
    /// The day's tokens are spent.
    DaySpent,
}

impl Store {
    /// Counts one answered model request.
    pub fn add_model_usage(
        &self,
        agent_id: &str,
        api: &str,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), StoreError> {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.db.execute(
            "INSERT INTO model_usage (agent_id, day, api, requests, input_tokens, output_tokens)
             VALUES (?1, ?2, ?3, 1, ?4, ?5)
             ON CONFLICT(agent_id, day, api) DO UPDATE SET requests = model_usage.requests + 1,
                input_tokens = model_usage.input_tokens + ?4,
                output_tokens = model_usage.output_tokens + ?5",
            args![
                agent_id,
                today(&self.db)?,
                api,
                clamp(input_tokens),
                clamp(output_tokens)
            ],
        )?;
        Ok(())
    }

    /// Each agent's tokens counted today (UTC): a restarted daemon's
    /// gateway starts its day budgets from these.
    pub fn model_tokens_today(&self) -> Result<Vec<(String, u64)>, StoreError> {
        // SUM of BIGINT is NUMERIC on PostgreSQL: cast back.
        let rows = self.db.rows(
            "SELECT agent_id, CAST(SUM(input_tokens + output_tokens) AS BIGINT) FROM model_usage
             WHERE day = ?1 GROUP BY agent_id ORDER BY agent_id",
            args![today(&self.db)?],
        )?;
        let mut today_by_agent = Vec::new();
        for row in rows {
            let tokens: i64 = row.get(1)?;
            today_by_agent.push((row.get(0)?, u64::try_from(tokens).unwrap_or(0)));
        }
        Ok(today_by_agent)
    }

    pub fn model_usage(&self, agent_id: &str) -> Result<ModelUsage, StoreError> {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let r = self.db.one(
            "SELECT CAST(COALESCE(SUM(CASE WHEN day = ?2 THEN requests END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN day = ?2 THEN input_tokens + output_tokens END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(requests), 0) AS BIGINT), CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT),
                    CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT)
             FROM model_usage WHERE agent_id = ?1",
            args![agent_id, today(&self.db)?],
        )?;
        Ok(ModelUsage {
            requests_today: count(r.get(0)?),
            tokens_today: count(r.get(1)?),
            requests: count(r.get(2)?),
            input_tokens: count(r.get(3)?),
            output_tokens: count(r.get(4)?),
        })
    }

    /// Counts one model request against the team's budget, shared by every
    /// daemon of the database: refused once today's tokens (all agents'
    /// recorded usage) reach `tokens_per_day`, or once this wall-clock
    /// minute holds `requests_per_minute` requests (counted only when
    /// admitted, in one statement: two daemons cannot both take the last).
    pub fn team_admit(
        &self,
        requests_per_minute: Option<u32>,
        tokens_per_day: Option<u64>,
    ) -> Result<TeamAdmission, StoreError> {
        if let Some(limit) = tokens_per_day
            && team_day_held(&self.db)? >= limit
        {
            return Ok(TeamAdmission::DaySpent);
        }
        let Some(limit) = requests_per_minute else {
            return Ok(TeamAdmission::Admitted);
        };
        let now = self.db.now_ms()?;
        let minute = now / 60_000;
        let counted = self.db.row(
            "INSERT INTO team_minutes (minute, requests) VALUES (?1, 1)
             ON CONFLICT (minute) DO UPDATE SET requests = team_minutes.requests + 1
             WHERE team_minutes.requests < ?2
             RETURNING requests",
            args![minute, limit],
        )?;
        if counted.is_some() && limit > 0 {
            return Ok(TeamAdmission::Admitted);
        }
        let left_ms = 60_000 - now % 60_000;
        Ok(TeamAdmission::MinuteSpent {
            retry_after_s: u64::try_from((left_ms + 999) / 1000).unwrap_or(60),
        })
    }

    /// Reserves `tokens` of the team's day for a request in flight (`id`,
    /// until `ttl_ms` from now at most), unless what every daemon's agents
    /// used today and reserved now already reaches `tokens_per_day`. One
    /// reservation at a time across daemons (a table lock on PostgreSQL,
    /// the write lock on SQLite), so two cannot both take the last room.
    pub fn team_reserve(
        &self,
        tokens_per_day: u64,
        id: &str,
        tokens: u64,
        ttl_ms: i64,
    ) -> Result<TeamAdmission, StoreError> {
        self.db.transaction(|tx| {
            if tx.engine() == super::Engine::Postgres {
                tx.batch("LOCK TABLE team_reservations IN EXCLUSIVE MODE")?;
            }
            if team_day_held(tx)? >= tokens_per_day {
                return Ok(TeamAdmission::DaySpent);
            }
            tx.execute(
                "INSERT INTO team_reservations (id, tokens, expires_ms) VALUES (?1, ?2, ?3)",
                args![
                    id,
                    // A budget is at most 2^40 tokens: more reserves no more.
                    i64::try_from(tokens.min(1 << 40)).unwrap_or(1 << 40),
                    tx.now_ms()?.saturating_add(ttl_ms)
                ],
            )?;
            Ok(TeamAdmission::Admitted)
        })
    }

    /// The request `id` ended (its usage is recorded): its reservation goes.
    pub fn team_release(&self, id: &str) -> Result<(), StoreError> {
        self.db
            .execute("DELETE FROM team_reservations WHERE id = ?1", args![id])?;
        Ok(())
    }

    /// Forgets the team's minutes older than an hour, and reservations
    /// past their time (a daemon that stopped without releasing them).
    pub fn prune_team_minutes(&self) -> Result<(), StoreError> {
        self.db.execute(
            "DELETE FROM team_minutes WHERE minute < ?1",
            args![self.db.now_ms()? / 60_000 - 60],
        )?;
        self.db.execute(
            "DELETE FROM team_reservations WHERE expires_ms <= ?1",
            args![self.db.now_ms()?],
        )?;
        Ok(())
    }
}
