//! Model usage per agent, day (UTC) and API, as the gateway counted it.

use serde::Serialize;

use super::db::args;
use super::{Store, StoreError, now_ms};

/// An agent's model use: today and in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ModelUsage {
    pub requests_today: u64,
    pub tokens_today: u64,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

fn today() -> i64 {
    now_ms() / 86_400_000
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
                today(),
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
            args![today()],
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
            args![agent_id, today()],
        )?;
        Ok(ModelUsage {
            requests_today: count(r.get(0)?),
            tokens_today: count(r.get(1)?),
            requests: count(r.get(2)?),
            input_tokens: count(r.get(3)?),
            output_tokens: count(r.get(4)?),
        })
    }
}
