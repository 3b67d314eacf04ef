//! Who may evaluate a role now (issue 39): each agent at most one
//! evaluation at a time and `AGENT_EVALS_PER_MINUTE`, all agents together
//! `AGENT_EVALS` at once; the operator (`agent spawn`, the roles HTTP
//! endpoints, `role test`) has `OPERATOR_EVALS` places of its own, which
//! no agent's flood can take. An agent refused gets `RoleError::Limited`
//! with when to try again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RoleError;
use crate::limits::TokenBucket;

/// Evaluations all agents together may run at once.
pub const AGENT_EVALS: usize = 2;
/// Evaluations the operator may run at once, whatever agents do.
pub const OPERATOR_EVALS: usize = 1;
/// Evaluations one agent may start in a minute (and at once, in a burst).
pub const AGENT_EVALS_PER_MINUTE: u32 = 30;
pub const AGENT_EVALS_BURST: u32 = 5;

#[derive(Default)]
struct State {
    operator: usize,
    agents: usize,
    by_agent: BTreeMap<String, usize>,
    buckets: BTreeMap<String, TokenBucket>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(State::default))
}

/// A place taken; given back when dropped.
#[derive(Debug)]
pub struct Admission {
    agent: Option<String>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        with_state(|s| match &self.agent {
            None => s.operator = s.operator.saturating_sub(1),
            Some(id) => {
                s.agents = s.agents.saturating_sub(1);
                if let Some(n) = s.by_agent.get_mut(id) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        s.by_agent.remove(id);
                    }
                }
            }
        });
    }
}

/// Charges `agent` one evaluation it asks for but that runs later and as
/// another (`spawn_agent` of a script role: its child's first turn
/// resolves it); Err: in how many milliseconds it may.
pub fn charge(agent: &str) -> Result<(), u64> {
    with_state(|s| {
        s.buckets
            .entry(agent.to_string())
            .or_insert_with(|| TokenBucket::new(AGENT_EVALS_PER_MINUTE, AGENT_EVALS_BURST))
            .take(Instant::now())
    })
}

/// Takes a place for one evaluation of `role` by `agent` (None: the
/// operator), or says why not; `limit` is the role's time limit (an
/// agent refused for concurrency may try again when it has passed).
pub fn admit(role: &str, agent: Option<&str>, limit: Duration) -> Result<Admission, RoleError> {
    let limited = |retry_after_ms: u64| RoleError::Limited {
        role: role.to_string(),
        retry_after_ms: retry_after_ms.max(1),
    };
    let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    with_state(|s| {
        let Some(id) = agent else {
            if s.operator >= OPERATOR_EVALS {
                return Err(RoleError::Busy {
                    role: role.to_string(),
                });
            }
            s.operator += 1;
            return Ok(Admission { agent: None });
        };
        if s.by_agent.get(id).is_some_and(|n| *n > 0) || s.agents >= AGENT_EVALS {
            return Err(limited(limit_ms));
        }
        let bucket = s
            .buckets
            .entry(id.to_string())
            .or_insert_with(|| TokenBucket::new(AGENT_EVALS_PER_MINUTE, AGENT_EVALS_BURST));
        bucket.take(Instant::now()).map_err(limited)?;
        s.agents += 1;
        *s.by_agent.entry(id.to_string()).or_default() += 1;
        Ok(Admission {
            agent: Some(id.to_string()),
        })
    })
}
