//! What went wrong with an agent's model requests, kept for the turn
//! runner (a failed turn says why: `take_errors` at its end), and the
//! labels of a budget's refusal (the `UsageSink` is told of each, for the
//! metrics). Bounded: the last `KEEP_ERRORS` per agent, each reason at
//! most `MAX_REASON` bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;

use crate::ledger::{Refusal, Scope};

/// The last this many errors are kept per agent.
pub const KEEP_ERRORS: usize = 5;
/// A kept reason's longest text, in bytes.
pub const MAX_REASON: usize = 256;

/// Who said no to a model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The gateway refused it (a wrong key, a path, a body over its limit).
    Refused,
    /// A budget of the agent's or the team's refused it.
    Budget,
    /// The role's model allowance refused it (`model.models`, or a model
    /// that is no model name).
    Model,
    /// The upstream answered with an error status.
    Upstream,
    /// The upstream could not be reached.
    Unreachable,
}

/// One model request that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelError {
    pub kind: ErrorKind,
    pub status: u16,
    pub reason: String,
}

/// A budget refusal's labels: the scope, the limit.
pub fn refusal_labels(refusal: &Refusal) -> (&'static str, &'static str) {
    let scope = |s: &Scope| match s {
        Scope::Agent => "agent",
        Scope::Team => "team",
    };
    match refusal {
        Refusal::RequestsPerMinute { scope: s, .. } => (scope(s), "requests_per_minute"),
        Refusal::Concurrent { scope: s, .. } => (scope(s), "concurrent"),
        Refusal::TokensPerTurn { scope: s, .. } => (scope(s), "tokens_per_turn"),
        Refusal::TokensPerDay { scope: s, .. } => (scope(s), "tokens_per_day"),
        Refusal::Unchecked(_) => ("team", "unchecked"),
    }
}

#[derive(Debug, Default)]
pub(crate) struct Problems {
    errors: Mutex<HashMap<String, VecDeque<ModelError>>>,
}

impl Problems {
    pub(crate) fn error(&self, agent: &str, kind: ErrorKind, status: u16, reason: &str) {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        let kept = errors.entry(agent.to_string()).or_default();
        if kept.len() == KEEP_ERRORS {
            kept.pop_front();
        }
        kept.push_back(ModelError {
            kind,
            status,
            reason: cut(reason, MAX_REASON),
        });
    }

    pub(crate) fn take_errors(&self, agent: &str) -> Vec<ModelError> {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        errors.remove(agent).map(Vec::from).unwrap_or_default()
    }
}

fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_the_last_few_cut_and_taken_once() {
        let p = Problems::default();
        for i in 0..KEEP_ERRORS + 2 {
            p.error(
                "a1",
                ErrorKind::Upstream,
                500,
                &format!("{i}{}", "é".repeat(300)),
            );
        }
        let kept = p.take_errors("a1");
        assert_eq!(kept.len(), KEEP_ERRORS);
        assert!(kept[0].reason.starts_with('2'), "{:?}", kept[0]);
        assert!(kept.iter().all(|e| e.reason.len() <= MAX_REASON));
        assert!(p.take_errors("a1").is_empty());
    }

    #[test]
    fn budget_refusals_are_labelled_by_scope_and_limit() {
        let day = Refusal::TokensPerDay {
            scope: Scope::Team,
            limit: 10,
        };
        assert_eq!(refusal_labels(&day), ("team", "tokens_per_day"));
        let at_once = Refusal::Concurrent {
            scope: Scope::Agent,
            limit: 1,
        };
        assert_eq!(refusal_labels(&at_once), ("agent", "concurrent"));
    }
}
