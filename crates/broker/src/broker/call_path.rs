//! The call path every tool call takes: who is calling, is the tool on
//! its menu, rate limits, the audit record, the call, the output limit.

use super::*;

impl Broker {
    /// Every tool call goes through here: scope, step limit, rate limits,
    /// the tool, output truncation, and one audit line.
    pub fn call_tool(&self, session: &mut Session, name: &str, args: Value) -> ToolOutcome {
        let start = Instant::now();
        let agent = match self.session_agent(session) {
            Ok(agent) => agent,
            Err(refusal) => return refusal,
        };
        let (outcome, decision, reason) = self.decide(&agent, session, name, args);
        self.record(&agent, name, start, outcome, decision, reason)
    }

    /// The session's agent, read once; an error result once it is removed.
    pub(super) fn session_agent(&self, session: &mut Session) -> Result<Agent, ToolOutcome> {
        let removed = self
            .removed
            .read()
            .map(|r| r.contains(&session.agent_id))
            .unwrap_or(true);
        match (&session.agent, removed) {
            (_, true) => Err(error("agent_removed", "this agent has been removed")),
            (Some(agent), false) => Ok(agent.clone()),
            (None, false) => match self.agent(&session.agent_id) {
                Ok(Some(agent)) => {
                    session.agent = Some(agent.clone());
                    Ok(agent)
                }
                Ok(None) => Err(error("agent_removed", "this agent has been removed")),
                Err(e) => Err(failure(&e)),
            },
        }
    }

    /// The dedupe key of the next call with effects in the agent's running
    /// turn: its position in the turn and what it does (`call`: the tool and
    /// its arguments), so a re-run finds only the very same call, never a
    /// different one at the same position. None outside a turn (an MCP
    /// client of the operator's).
    pub(super) fn effect_key(&self, agent_id: &str, call: &[&str]) -> Option<String> {
        use sha2::{Digest, Sha256};
        let mut running = self.running();
        let turn = running.get_mut(agent_id)?;
        turn.effects += 1;
        let digest = Sha256::digest(call.join("\0").as_bytes());
        let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Some(format!("{}#{}#{short}", turn.turn_id, turn.effects))
    }

    /// How many calls with effects the agent's running turn has made.
    fn effects_so_far(&self, agent_id: &str) -> Option<u32> {
        self.running().get(agent_id).map(|turn| turn.effects)
    }

    fn reset_effects(&self, agent_id: &str, to: Option<u32>) {
        if let (Some(turn), Some(to)) = (self.running().get_mut(agent_id), to) {
            turn.effects = to;
        }
    }

    /// One audit line per call, and the call in the agent's running turn.
    pub(super) fn record(
        &self,
        agent: &Agent,
        name: &str,
        start: Instant,
        outcome: ToolOutcome,
        decision: Decision,
        refusal: Option<Refusal>,
    ) -> ToolOutcome {
        let refusal = refusal.or_else(|| match &outcome {
            ToolOutcome::Result {
                body,
                is_error: true,
            } => Some(Refusal::ToolError(
                body["error"].as_str().unwrap_or("error").to_string(),
            )),
            ToolOutcome::Relayed(result) if result.is_error == Some(true) => {
                Some(Refusal::ToolError("error".into()))
            }
            _ if decision != Decision::Allowed => Some(Refusal::ToolError(String::new())),
            _ => None,
        });
        let reason = refusal.as_ref().map(Refusal::reason).unwrap_or_default();
        let took = start.elapsed();
        self.audit.record(&Entry {
            ts_ms: now_ms(),
            agent_id: &agent.id,
            agent: &agent.name,
            tool: name,
            decision,
            reason: &reason,
            latency_us: took.as_micros() as u64,
        });
        self.metrics
            .tool_call(name, decision, refusal.as_ref(), took);
        let mut running = self.running();
        let turn = running.get_mut(&agent.id);
        // With the audit log's ids and the turn's (`--log-format json`).
        tracing::debug!(agent = %agent.name, agent_id = %agent.id,
            turn = turn.as_ref().map_or("", |t| t.turn_id.as_str()),
            tool = name, decision = ?decision, reason = %reason, "tool call");
        if let Some(turn) = turn
            && turn.calls.len() < 100
        {
            turn.calls
                .push(json!({"tool": name, "decision": decision, "reason": reason}));
        }
        drop(running);
        outcome
    }

    /// The step and rate limits, on every call (built-in or upstream).
    /// Where the counts are the store's (`counts_in_store`), a call in the
    /// agent's running turn counts a step of that turn; a session outside
    /// a turn counts its own steps.
    pub(super) fn admit(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        session: &mut Session,
        name: &str,
    ) -> Result<(), (ToolOutcome, Decision, Option<Refusal>)> {
        let limit = policy.policy.mcp.tool_steps_per_turn;
        let turn = match limit {
            Some(_) if self.counts_in_store => {
                self.running().get(&agent.id).map(|t| t.turn_id.clone())
            }
            _ => None,
        };
        let counted = match (limit, &turn) {
            (Some(limit), None) if session.steps >= limit => Ok(CallCount::StepLimit),
            (Some(limit), Some(turn)) => self.take_tokens(agent, name, policy, Some((turn, limit))),
            _ => self.take_tokens(agent, name, policy, None),
        };
        match counted {
            Ok(CallCount::Admitted) => {
                if turn.is_none() {
                    session.steps += 1;
                }
                Ok(())
            }
            Ok(CallCount::StepLimit) => {
                let body = json!({"status": "step_limit", "limit": limit,
                        "message": "tool step limit of this turn reached; finish the turn"});
                Err(limited(body, Refusal::StepLimit))
            }
            Ok(CallCount::RateLimited { retry_after_ms }) => {
                let body = json!({"status": "rate_limited", "retry_after_ms": retry_after_ms});
                Err(limited(body, Refusal::RateLimited))
            }
            // A count that cannot be read refuses the call.
            Err(e) => Err((failure(&e), Decision::Denied, Some(refusal_of(&e)))),
        }
    }

    pub(super) fn decide(
        &self,
        agent: &Agent,
        session: &mut Session,
        name: &str,
        args: Value,
    ) -> (ToolOutcome, Decision, Option<Refusal>) {
        let Some(policy) = self.policy_of(agent) else {
            return (
                error("internal", format!("role `{}` has no policy", agent.role)),
                Decision::Denied,
                None,
            );
        };
        // Out of scope or over the cap is the same as not existing.
        if !self.sees_builtin(agent, name) {
            return (
                ToolOutcome::UnknownTool,
                Decision::Denied,
                Some(Refusal::OutOfScope),
            );
        }
        if let Err(refused) = self.admit(agent, policy, session, name) {
            return refused;
        }
        let effects_before = self.effects_so_far(&agent.id);
        let mut refusal = None;
        let outcome = match self.run_tool(agent, policy, name, args) {
            Ok(outcome) => outcome,
            Err(BrokerError::Invalid(message)) => ToolOutcome::InvalidArguments(message),
            Err(e) => {
                // A call that may be made again (the state database was
                // unreachable, perhaps after its commit) takes the same
                // dedupe key again: a retry finds what the first did.
                if matches!(&e, BrokerError::Store(s) if s.is_retryable()) {
                    self.reset_effects(&agent.id, effects_before);
                }
                refusal = Some(refusal_of(&e));
                failure(&e)
            }
        };
        let decision = match &outcome {
            ToolOutcome::Result {
                is_error: false, ..
            } => Decision::Allowed,
            _ => Decision::Denied,
        };
        (self.limit_output(outcome, policy), decision, refusal)
    }

    /// Takes a token from the agent's buckets (all its calls, and this
    /// tool's), and a step of `turn` (its id and limit) if given: in the
    /// store (`counts_in_store`), where every daemon that runs the agent
    /// sees them, or the tokens in this daemon's memory.
    pub(super) fn take_tokens(
        &self,
        agent: &Agent,
        tool: &str,
        policy: &LoadedPolicy,
        turn: Option<(&str, u32)>,
    ) -> Result<CallCount, BrokerError> {
        let mcp = &policy.policy.mcp;
        let limits = CallLimits {
            calls: mcp
                .calls_per_minute
                .map(|rate| (rate, mcp.burst.unwrap_or(rate))),
            tool: mcp
                .per_tool_calls_per_minute
                .map(|rate| (tool, rate, mcp.per_tool_burst.unwrap_or(rate))),
            steps: turn,
        };
        if self.counts_in_store {
            return Ok(self.store().count_call(&agent.id, &limits)?);
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock_anyway();
        let all = limits.calls.map(|(rate, burst)| (None, rate, burst));
        let this_tool = limits
            .tool
            .map(|(tool, rate, burst)| (Some(tool.to_string()), rate, burst));
        for (tool, rate, burst) in all.into_iter().chain(this_tool) {
            let taken = buckets
                .entry((agent.id.clone(), tool))
                .or_insert_with(|| TokenBucket::new(rate, burst))
                .take(now);
            if let Err(retry_after_ms) = taken {
                return Ok(CallCount::RateLimited { retry_after_ms });
            }
        }
        Ok(CallCount::Admitted)
    }

    /// The role's output limit on what the agent reads: the text of a
    /// built-in's body (as the agent gets it, not its JSON encoding), each
    /// block of an upstream's result (crate::output_budget).
    pub(super) fn limit_output(&self, outcome: ToolOutcome, policy: &LoadedPolicy) -> ToolOutcome {
        let Some(limit) = policy.policy.mcp.max_output_bytes else {
            return outcome;
        };
        let budget = usize::try_from(limit.0).unwrap_or(usize::MAX);
        match outcome {
            ToolOutcome::Result { body, is_error } => {
                let text = match &body {
                    Value::String(text) => text.len(),
                    other => other.to_string().len(),
                };
                if text <= budget {
                    return ToolOutcome::Result { body, is_error };
                }
                let text = match body {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                ToolOutcome::Result {
                    body: Value::String(crate::output_budget::cut_text(&text, budget)),
                    is_error,
                }
            }
            ToolOutcome::Relayed(mut result) => {
                crate::output_budget::cut_to_budget(&mut result, budget);
                ToolOutcome::Relayed(result)
            }
            outcome => outcome,
        }
    }

    pub(super) fn run_tool(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        name: &str,
        args: Value,
    ) -> Result<ToolOutcome, BrokerError> {
        let parse =
            |e: serde_json::Error| BrokerError::Invalid(format!("arguments of {name}: {e}"));
        match name {
            "send_message" => {
                self.send_message(agent, policy, serde_json::from_value(args).map_err(parse)?)
            }
            "broadcast" => {
                self.broadcast(agent, policy, serde_json::from_value(args).map_err(parse)?)
            }
            "check_inbox" => {
                let _: NoArgs = serde_json::from_value(args).map_err(parse)?;
                self.check_inbox(agent, policy)
            }
            "spawn_agent" => {
                self.spawn_agent(agent, policy, serde_json::from_value(args).map_err(parse)?)
            }
            "inspect_agent" => {
                self.inspect_agent(agent, serde_json::from_value(args).map_err(parse)?)
            }
            _ => Ok(ToolOutcome::UnknownTool),
        }
    }
}

/// A call that failed in the broker: `unavailable` when the same call may
/// succeed later (the state database unreachable), else `internal`.
fn failure(e: &BrokerError) -> ToolOutcome {
    let Refusal::ToolError(code) = refusal_of(e) else {
        return error("unavailable", e.to_string());
    };
    error(&code, e.to_string())
}

/// Why a call that failed in the broker was not allowed.
fn refusal_of(e: &BrokerError) -> Refusal {
    match e {
        BrokerError::Store(store) if store.is_retryable() => Refusal::Unavailable,
        _ => Refusal::ToolError("internal".into()),
    }
}
