//! The budgets' counters: requests in the current minute, tokens in the
//! agent's current turn and in the current day (UTC), per agent and for the
//! team. A request is admitted before it is forwarded (its tokens are known
//! only once its response has streamed), so a budget can be overrun by the
//! one request in flight that crossed it, never by a second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::Budget;

/// Why a request was not forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{scope} budget: {limit} model requests per minute reached; retry in {retry_after_s} s"
    )]
    RequestsPerMinute {
        scope: Scope,
        limit: u32,
        retry_after_s: u64,
    },
    #[error("{scope} budget: {limit} tokens per turn used; finish the turn")]
    TokensPerTurn { scope: Scope, limit: u64 },
    #[error("{scope} budget: {limit} tokens per day used; the budget renews at 00:00 UTC")]
    TokensPerDay { scope: Scope, limit: u64 },
    /// The team's shared count could not be read (its database is
    /// unreachable): refused rather than let through uncounted.
    #[error("the team's budget cannot be checked now ({0}); retry later")]
    Unchecked(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Agent,
    Team,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Agent => "the agent's",
            Scope::Team => "the team's",
        })
    }
}

#[derive(Debug, Clone, Default)]
struct Counts {
    minute_start: Option<Instant>,
    minute_requests: u32,
    turn_tokens: u64,
    day: u64,
    day_tokens: u64,
}

impl Counts {
    /// A new day starts with no tokens counted.
    fn roll(&mut self, today: u64) {
        if self.day != today {
            (self.day, self.day_tokens) = (today, 0);
        }
    }

    fn check(
        &mut self,
        budget: &Budget,
        scope: Scope,
        now: Instant,
        today: u64,
    ) -> Result<(), Refusal> {
        self.roll(today);
        let minute_over = self
            .minute_start
            .is_none_or(|start| now.duration_since(start) >= Duration::from_secs(60));
        if minute_over {
            (self.minute_start, self.minute_requests) = (Some(now), 0);
        }
        if let Some(limit) = budget.requests_per_minute
            && self.minute_requests >= limit
        {
            let elapsed = self
                .minute_start
                .map_or(0, |s| now.duration_since(s).as_secs());
            return Err(Refusal::RequestsPerMinute {
                scope,
                limit,
                retry_after_s: 60u64.saturating_sub(elapsed).max(1),
            });
        }
        if let Some(limit) = budget.tokens_per_turn
            && self.turn_tokens >= limit
        {
            return Err(Refusal::TokensPerTurn { scope, limit });
        }
        if let Some(limit) = budget.tokens_per_day
            && self.day_tokens >= limit
        {
            return Err(Refusal::TokensPerDay { scope, limit });
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Debug, Default)]
struct LedgerState {
    agents: HashMap<String, Counts>,
    team: Counts,
}

/// Days since the epoch, UTC.
fn today() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

impl Ledger {
    /// Counts a request, or refuses it when the agent's or the team's
    /// budget is spent.
    pub fn admit(&self, agent: &str, budget: &Budget, team: &Budget) -> Result<(), Refusal> {
        self.admit_at(agent, budget, team, Instant::now(), today())
    }

    fn admit_at(
        &self,
        agent: &str,
        budget: &Budget,
        team: &Budget,
        now: Instant,
        today: u64,
    ) -> Result<(), Refusal> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *state;
        let counts = state.agents.entry(agent.to_string()).or_default();
        counts.check(budget, Scope::Agent, now, today)?;
        state.team.check(team, Scope::Team, now, today)?;
        counts.minute_requests += 1;
        state.team.minute_requests += 1;
        Ok(())
    }

    /// Adds a response's tokens to the agent's and the team's counts.
    pub fn spend(&self, agent: &str, tokens: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *state;
        let counts = state.agents.entry(agent.to_string()).or_default();
        for c in [counts, &mut state.team] {
            c.roll(today());
            c.turn_tokens = c.turn_tokens.saturating_add(tokens);
            c.day_tokens = c.day_tokens.saturating_add(tokens);
        }
    }

    /// The agent's turn starts: its per-turn count starts again.
    pub fn begin_turn(&self, agent: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .agents
            .entry(agent.to_string())
            .or_default()
            .turn_tokens = 0;
    }

    /// Tokens counted today before this daemon started (from the store),
    /// so a restart does not renew a day's budget.
    pub fn carry_over_today(&self, agent: &str, tokens: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *state;
        let counts = state.agents.entry(agent.to_string()).or_default();
        for c in [counts, &mut state.team] {
            c.roll(today());
            c.day_tokens = c.day_tokens.saturating_add(tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_refuses_once_spent_and_renews() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let rpm = Budget {
            requests_per_minute: Some(2),
            ..Budget::default()
        };
        let none = Budget::default();
        assert!(ledger.admit_at("a", &rpm, &none, t0, 1).is_ok());
        assert!(ledger.admit_at("a", &rpm, &none, t0, 1).is_ok());
        assert!(matches!(
            ledger.admit_at("a", &rpm, &none, t0 + Duration::from_secs(10), 1),
            Err(Refusal::RequestsPerMinute {
                scope: Scope::Agent,
                limit: 2,
                retry_after_s: 50
            })
        ));
        assert!(
            ledger.admit_at("b", &rpm, &none, t0, 1).is_ok(),
            "another agent's own minute"
        );
        assert!(
            ledger
                .admit_at("a", &rpm, &none, t0 + Duration::from_secs(61), 1)
                .is_ok()
        );

        let turn = Budget {
            tokens_per_turn: Some(100),
            tokens_per_day: Some(150),
            ..Budget::default()
        };
        ledger.spend("c", 100);
        assert!(matches!(
            ledger.admit_at("c", &turn, &none, t0, today()),
            Err(Refusal::TokensPerTurn { .. })
        ));
        ledger.begin_turn("c");
        assert!(ledger.admit_at("c", &turn, &none, t0, today()).is_ok());
        ledger.spend("c", 60);
        assert!(matches!(
            ledger.admit_at("c", &turn, &none, t0, today()),
            Err(Refusal::TokensPerDay { limit: 150, .. })
        ));
        ledger.begin_turn("c");
        assert!(
            matches!(
                ledger.admit_at("c", &turn, &none, t0, today()),
                Err(Refusal::TokensPerDay { .. })
            ),
            "a new turn does not renew the day"
        );

        let team = Budget {
            tokens_per_day: Some(1000),
            ..Budget::default()
        };
        ledger.carry_over_today("d", 2000);
        assert!(matches!(
            ledger.admit_at("e", &none, &team, t0, today()),
            Err(Refusal::TokensPerDay {
                scope: Scope::Team,
                ..
            })
        ));
    }
}
