//! The budgets' counters: requests in the current minute, requests at
//! once, tokens in the agent's current turn and in the current day (UTC),
//! per agent and for the team.
//!
//! A request is admitted before it is forwarded, taking a slot (one of
//! the requests at once), and reserves its worst case in tokens once its
//! body is read: its input's size plus the most output it may ask for.
//! It is admitted only while the tokens spent plus those reserved by the
//! requests in flight are under the budget, and settles what it really
//! used when its answer ends (its reservation, when the answer's usage
//! cannot be read). So however many requests run at once, a budget is
//! overrun by at most the one request admitted last.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::Budget;

/// An agent's requests at once when its budget does not say.
pub const DEFAULT_AGENT_CONCURRENT: u32 = substrat_policy::model::DEFAULT_CONCURRENT_REQUESTS;
/// The team's requests at once when the daemon is not told.
pub const DEFAULT_TEAM_CONCURRENT: u32 = 64;

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
    #[error("{scope} budget: {limit} model requests at once; retry when one has ended")]
    Concurrent { scope: Scope, limit: u32 },
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
    /// Tokens reserved by the requests in flight.
    reserved: u64,
    in_flight: u32,
}

impl Counts {
    /// A new day starts with no tokens counted.
    fn roll(&mut self, today: u64) {
        if self.day != today {
            (self.day, self.day_tokens) = (today, 0);
        }
    }

    /// The minute's count and the requests at once.
    fn check_requests(
        &mut self,
        budget: &Budget,
        scope: Scope,
        default_concurrent: u32,
        now: Instant,
    ) -> Result<(), Refusal> {
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
        let limit = budget.concurrent_requests.unwrap_or(default_concurrent);
        if self.in_flight >= limit {
            return Err(Refusal::Concurrent { scope, limit });
        }
        Ok(())
    }

    /// Tokens spent and reserved against the turn's and the day's budget.
    fn check_tokens(&mut self, budget: &Budget, scope: Scope, today: u64) -> Result<(), Refusal> {
        self.roll(today);
        if let Some(limit) = budget.tokens_per_turn
            && self.turn_tokens.saturating_add(self.reserved) >= limit
        {
            return Err(Refusal::TokensPerTurn { scope, limit });
        }
        if let Some(limit) = budget.tokens_per_day
            && self.day_tokens.saturating_add(self.reserved) >= limit
        {
            return Err(Refusal::TokensPerDay { scope, limit });
        }
        Ok(())
    }

    fn spend(&mut self, tokens: u64, today: u64) {
        self.roll(today);
        self.turn_tokens = self.turn_tokens.saturating_add(tokens);
        self.day_tokens = self.day_tokens.saturating_add(tokens);
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

impl LedgerState {
    /// The agent's counts and the team's.
    fn both(&mut self, agent: &str) -> (&mut Counts, &mut Counts) {
        let counts = self.agents.entry(agent.to_string()).or_default();
        (counts, &mut self.team)
    }
}

/// Days since the epoch, UTC.
fn today() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

/// An admitted request: one of the requests at once, and the tokens it
/// reserved. Dropped unsettled, it spends its whole reservation.
#[derive(Debug)]
pub struct Slot {
    ledger: Arc<Ledger>,
    agent: String,
    reserved: u64,
    settled: bool,
}

impl Ledger {
    fn state(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request (a slot, the minute's count), or refuses it when
    /// the agent's or the team's budget is spent or its requests at once
    /// are all taken.
    pub fn admit(
        self: &Arc<Self>,
        agent: &str,
        budget: &Budget,
        team: &Budget,
    ) -> Result<Slot, Refusal> {
        self.admit_at(agent, budget, team, Instant::now(), today())
    }

    fn admit_at(
        self: &Arc<Self>,
        agent: &str,
        budget: &Budget,
        team: &Budget,
        now: Instant,
        today: u64,
    ) -> Result<Slot, Refusal> {
        let mut state = self.state();
        let (counts, team_counts) = state.both(agent);
        counts.check_requests(budget, Scope::Agent, DEFAULT_AGENT_CONCURRENT, now)?;
        team_counts.check_requests(team, Scope::Team, DEFAULT_TEAM_CONCURRENT, now)?;
        counts.check_tokens(budget, Scope::Agent, today)?;
        team_counts.check_tokens(team, Scope::Team, today)?;
        for c in [counts, team_counts] {
            c.minute_requests += 1;
            c.in_flight += 1;
        }
        Ok(Slot {
            ledger: self.clone(),
            agent: agent.to_string(),
            reserved: 0,
            settled: false,
        })
    }

    /// Adds tokens to the agent's and the team's counts.
    pub fn spend(&self, agent: &str, tokens: u64) {
        let mut state = self.state();
        let (counts, team) = state.both(agent);
        let today = today();
        counts.spend(tokens, today);
        team.spend(tokens, today);
    }

    /// The agent's turn starts: its per-turn count starts again.
    pub fn begin_turn(&self, agent: &str) {
        self.state()
            .agents
            .entry(agent.to_string())
            .or_default()
            .turn_tokens = 0;
    }

    /// Tokens counted today before this daemon started (from the store),
    /// so a restart does not renew a day's budget.
    pub fn carry_over_today(&self, agent: &str, tokens: u64) {
        let mut state = self.state();
        let (counts, team) = state.both(agent);
        for c in [counts, team] {
            c.roll(today());
            c.day_tokens = c.day_tokens.saturating_add(tokens);
        }
    }
}

impl Slot {
    /// Reserves `tokens` (the request's worst case), or refuses when the
    /// budget is spent by now (with what the requests in flight hold).
    pub fn reserve(&mut self, tokens: u64, budget: &Budget, team: &Budget) -> Result<(), Refusal> {
        let mut state = self.ledger.state();
        let (counts, team_counts) = state.both(&self.agent);
        let today = today();
        counts.check_tokens(budget, Scope::Agent, today)?;
        team_counts.check_tokens(team, Scope::Team, today)?;
        for c in [counts, team_counts] {
            c.reserved = c.reserved.saturating_add(tokens);
        }
        self.reserved = self.reserved.saturating_add(tokens);
        Ok(())
    }

    /// The tokens reserved.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The request ended having used `tokens`: its reservation is
    /// released and its use counted.
    pub fn settle(mut self, tokens: u64) {
        self.finish(tokens);
    }

    fn finish(&mut self, tokens: u64) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let mut state = self.ledger.state();
        let (counts, team) = state.both(&self.agent);
        let today = today();
        for c in [counts, team] {
            c.reserved = c.reserved.saturating_sub(self.reserved);
            c.in_flight = c.in_flight.saturating_sub(1);
            c.spend(tokens, today);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.finish(self.reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_refuses_once_spent_and_renews() {
        let ledger = Arc::new(Ledger::default());
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

    #[test]
    fn requests_at_once_are_bounded_and_a_slot_frees_its_place() {
        let ledger = Arc::new(Ledger::default());
        let two = Budget {
            concurrent_requests: Some(2),
            ..Budget::default()
        };
        let none = Budget::default();
        let a = ledger.admit("a", &two, &none).unwrap();
        let _b = ledger.admit("a", &two, &none).unwrap();
        assert_eq!(
            ledger.admit("a", &two, &none).unwrap_err(),
            Refusal::Concurrent {
                scope: Scope::Agent,
                limit: 2
            }
        );
        a.settle(0);
        let _c = ledger.admit("a", &two, &none).unwrap();
        // The team's bound holds across agents; unset, the defaults hold.
        let team = Budget {
            concurrent_requests: Some(3),
            ..Budget::default()
        };
        let _d = ledger.admit("b", &none, &team).unwrap();
        assert!(matches!(
            ledger.admit("c", &none, &team),
            Err(Refusal::Concurrent {
                scope: Scope::Team,
                limit: 3
            })
        ));
        let held: Vec<Slot> = (0..DEFAULT_AGENT_CONCURRENT)
            .map(|_| ledger.admit("e", &none, &none).unwrap())
            .collect();
        assert!(matches!(
            ledger.admit("e", &none, &none),
            Err(Refusal::Concurrent {
                limit: DEFAULT_AGENT_CONCURRENT,
                ..
            })
        ));
        drop(held);
    }

    /// Many requests at once against a budget of 1,000 tokens per turn,
    /// each really using 300 (under its reservation of 400): the total is
    /// over the budget by less than one request's reservation.
    #[test]
    fn requests_at_once_overrun_a_budget_by_at_most_one() {
        let ledger = Arc::new(Ledger::default());
        let budget = Budget {
            tokens_per_turn: Some(1000),
            concurrent_requests: Some(100),
            ..Budget::default()
        };
        let none = Budget::default();
        let mut in_flight = Vec::new();
        let mut refused = 0;
        for _ in 0..50 {
            match ledger.admit("a", &budget, &none) {
                Ok(mut slot) => match slot.reserve(400, &budget, &none) {
                    Ok(()) => in_flight.push(slot),
                    Err(_) => refused += 1,
                },
                Err(_) => refused += 1,
            }
        }
        assert_eq!((in_flight.len(), refused), (3, 47), "1000 > 0, 400, 800");
        for slot in in_flight {
            slot.settle(300);
        }
        let spent = ledger.state().agents["a"].turn_tokens;
        assert_eq!(spent, 900);
        // A slot dropped unsettled (an answer whose usage was not read)
        // spends its whole reservation.
        let mut slot = ledger.admit("a", &budget, &none).unwrap();
        slot.reserve(400, &budget, &none).unwrap();
        drop(slot);
        let counts = ledger.state().agents["a"].clone();
        assert_eq!(
            (counts.turn_tokens, counts.reserved, counts.in_flight),
            (1300, 0, 0)
        );
        assert!(matches!(
            ledger.admit("a", &budget, &none),
            Err(Refusal::TokensPerTurn { .. })
        ));
    }
}
