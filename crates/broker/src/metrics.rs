//! The daemon's metrics in the Prometheus exposition format, with
//! prometheus-client (the Prometheus project's Rust client): counters and
//! histograms the call path and the turn runner update as they go, gauges
//! read from the team when scraped (`GET /metrics` on the daemon's HTTP
//! endpoint, with its bearer token: `role_http`).
//!
//! An agent chooses tool names: a label takes at most `MAX_TOOL_LABELS`
//! distinct names (the rest count as `other`), and a name no role sees as
//! `unknown`, so no agent can grow the series without bound.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::audit::{Decision, Refusal};

/// Distinct tool names the tool-call series take; past it, `other`.
pub const MAX_TOOL_LABELS: usize = 256;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    provider: String,
    outcome: &'static str,
    /// Why a failed turn failed (`FailReason`); `none` otherwise.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaunchLabels {
    backend: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaunchKindLabels {
    backend: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    /// `agent` or `team`: whose budget refused.
    scope: &'static str,
    /// Which of its limits (`substrat_gateway::problems::refusal_labels`).
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DbLabels {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    /// `warm` (an agent's, kept between its turns), `pool_ready` and
    /// `pool_building` (built ahead for agents to come).
    kind: &'static str,
}

fn decision_label(decision: Decision) -> &'static str {
    match decision {
        Decision::Allowed => "allowed",
        Decision::Denied => "denied",
        Decision::Limited => "limited",
    }
}

/// What a turn came to, as `turns_total`'s `outcome` and `reason` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Done,
    Failed(crate::turns::FailReason),
    Requeued,
}

impl TurnEnd {
    fn labels(self) -> (&'static str, &'static str) {
        match self {
            TurnEnd::Done => ("done", "none"),
            TurnEnd::Failed(reason) => ("failed", reason.as_str()),
            TurnEnd::Requeued => ("requeued", "none"),
        }
    }
}

/// The team as seen at a scrape (`Broker::metrics_text` fills it).
#[derive(Debug, Default)]
pub struct TeamState {
    /// Agents by state.
    pub agents: Vec<(String, i64)>,
    pub queued_turns: i64,
    pub running_turns: i64,
    /// Upstream servers: name, up, restarts.
    pub upstreams: Vec<(String, bool, i64)>,
    /// Model requests and tokens today, every agent of the team.
    pub model_requests_today: i64,
    pub model_tokens_today: i64,
}

pub struct Metrics {
    registry: Registry,
    tool_calls: Family<ToolLabels, Counter>,
    tool_seconds: Family<DecisionLabels, Histogram>,
    denials: Family<RuleLabels, Counter>,
    turns: Family<TurnLabels, Counter>,
    turn_seconds: Family<ProviderLabels, Histogram>,
    launches: Family<LaunchLabels, Counter>,
    launch_seconds: Family<LaunchKindLabels, Histogram>,
    agents: Family<StateLabels, Gauge>,
    queued_turns: Gauge,
    running_turns: Gauge,
    upstream_up: Family<ServerLabels, Gauge>,
    upstream_restarts: Family<ServerLabels, Gauge>,
    model_requests_today: Gauge,
    model_tokens_today: Gauge,
    budget_refusals: Family<BudgetLabels, Counter>,
    db_calls: Family<DbLabels, Counter>,
    sandboxes: Family<SandboxLabels, Gauge>,
    tool_names: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("substrat");
        let tool_calls = Family::default();
        let tool_seconds = Family::<DecisionLabels, Histogram>::new_with_constructor(|| {
            // 50 µs to about 13 s.
            Histogram::new(exponential_buckets(0.00005, 4.0, 10))
        });
        let denials = Family::default();
        let turns = Family::default();
        let turn_seconds = Family::<ProviderLabels, Histogram>::new_with_constructor(|| {
            // 0.1 s to about 7 h.
            Histogram::new(exponential_buckets(0.1, 4.0, 9))
        });
        let launches = Family::default();
        let launch_seconds = Family::<LaunchKindLabels, Histogram>::new_with_constructor(|| {
            // 1 ms to about 4 min.
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        let agents = Family::default();
        let (queued_turns, running_turns) = (Gauge::default(), Gauge::default());
        let (upstream_up, upstream_restarts) = (Family::default(), Family::default());
        let (model_requests_today, model_tokens_today) = (Gauge::default(), Gauge::default());
        let (budget_refusals, db_calls, sandboxes) = Default::default();
        let r = &mut registry;
        r.register(
            "model_budget_refusals",
            "Model requests the gateway refused by a budget, by scope (agent, team) and limit (model: the role's model allowance)",
            Family::<BudgetLabels, Counter>::clone(&budget_refusals),
        );
        r.register(
            "db_calls",
            "State database calls by kind (read, write, transaction, other) and outcome",
            Family::<DbLabels, Counter>::clone(&db_calls),
        );
        r.register(
            "sandboxes",
            "Sandboxes kept: warm (an agent's) and the pool's (ready, building)",
            Family::<SandboxLabels, Gauge>::clone(&sandboxes),
        );
        r.register(
            "tool_calls",
            "Tool calls by tool and decision",
            tool_calls.clone(),
        );
        r.register(
            "tool_call_seconds",
            "Tool call latency by decision",
            tool_seconds.clone(),
        );
        r.register(
            "denials",
            "Refused tool calls by the rule that refused them",
            denials.clone(),
        );
        r.register(
            "turns",
            "Turns ended, by provider, outcome and why a failed one failed",
            turns.clone(),
        );
        r.register(
            "turn_seconds",
            "Turn duration by provider",
            turn_seconds.clone(),
        );
        r.register(
            "launches",
            "Sandbox launches by backend, kind and outcome",
            launches.clone(),
        );
        r.register(
            "launch_seconds",
            "From a turn's start to its CLI's first line, by backend and kind",
            launch_seconds.clone(),
        );
        r.register("agents", "Agents by state", agents.clone());
        r.register(
            "queued_turns",
            "Turns waiting for a slot",
            queued_turns.clone(),
        );
        r.register("running_turns", "Turns running", running_turns.clone());
        r.register(
            "upstream_up",
            "Whether an upstream server is up",
            upstream_up.clone(),
        );
        r.register(
            "upstream_restarts",
            "Restarts of an upstream server",
            upstream_restarts.clone(),
        );
        r.register(
            "model_requests_today",
            "Model requests today, the team's",
            model_requests_today.clone(),
        );
        r.register(
            "model_tokens_today",
            "Model tokens today, the team's",
            model_tokens_today.clone(),
        );
        Self {
            registry,
            tool_calls,
            tool_seconds,
            denials,
            turns,
            turn_seconds,
            launches,
            launch_seconds,
            agents,
            queued_turns,
            running_turns,
            upstream_up,
            upstream_restarts,
            model_requests_today,
            model_tokens_today,
            budget_refusals,
            db_calls,
            sandboxes,
            tool_names: Mutex::new(HashSet::new()),
        }
    }

    /// One tool call: its series, its latency, and its rule when refused.
    pub fn tool_call(
        &self,
        tool: &str,
        decision: Decision,
        refusal: Option<&Refusal>,
        took: Duration,
    ) {
        let rule = match decision {
            Decision::Allowed => None,
            _ => Some(refusal.map_or("other", Refusal::rule)),
        };
        // Out of scope, over the 40-tool cap or not existing: one answer,
        // and a name an agent made up is no label.
        let tool = if matches!(refusal, Some(Refusal::OutOfScope)) {
            "unknown".to_string()
        } else {
            self.tool_label(tool)
        };
        let decision = decision_label(decision);
        self.tool_calls
            .get_or_create(&ToolLabels { tool, decision })
            .inc();
        self.tool_seconds
            .get_or_create(&DecisionLabels { decision })
            .observe(took.as_secs_f64());
        if let Some(rule) = rule {
            self.denials.get_or_create(&RuleLabels { rule }).inc();
        }
    }

    /// `tool` while fewer than `MAX_TOOL_LABELS` names are in use, else
    /// `other`.
    fn tool_label(&self, tool: &str) -> String {
        let Ok(mut names) = self.tool_names.lock() else {
            return "other".to_string();
        };
        if names.contains(tool) || names.len() < MAX_TOOL_LABELS {
            names.insert(tool.to_string());
            tool.to_string()
        } else {
            "other".to_string()
        }
    }

    /// A turn ended (`provider`: the CLI that ran it).
    pub fn turn(&self, provider: &str, end: TurnEnd, took: Duration) {
        let provider = provider.to_string();
        let (outcome, reason) = end.labels();
        self.turns
            .get_or_create(&TurnLabels {
                provider: provider.clone(),
                outcome,
                reason,
            })
            .inc();
        self.turn_seconds
            .get_or_create(&ProviderLabels { provider })
            .observe(took.as_secs_f64());
    }

    /// A sandbox launch for a turn: `warm` when a kept sandbox served it;
    /// `to_output`: how long until its CLI's first line, if one came.
    pub fn launch(&self, backend: &str, warm: bool, started: bool, to_output: Option<Duration>) {
        let kind = if warm { "warm" } else { "cold" };
        self.launches
            .get_or_create(&LaunchLabels {
                backend: backend.to_string(),
                kind,
                outcome: if started { "started" } else { "failed" },
            })
            .inc();
        if let Some(took) = to_output {
            let labels = LaunchKindLabels {
                backend: backend.to_string(),
                kind,
            };
            self.launch_seconds
                .get_or_create(&labels)
                .observe(took.as_secs_f64());
        }
    }

    /// A model request a budget refused (`scope`, `limit`:
    /// `substrat_gateway::problems::refusal_labels`), or the model
    /// allowance (`agent`, `model`).
    pub fn budget_refusal(&self, scope: &'static str, limit: &'static str) {
        self.budget_refusals
            .get_or_create(&BudgetLabels { scope, limit })
            .inc();
    }

    /// The sandboxes kept now: agents' warm ones, the pool's ready and
    /// being built.
    pub fn sandboxes(&self, warm: usize, pool_ready: usize, pool_building: usize) {
        for (kind, n) in [
            ("warm", warm),
            ("pool_ready", pool_ready),
            ("pool_building", pool_building),
        ] {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.sandboxes.get_or_create(&SandboxLabels { kind }).set(n);
        }
    }

    /// The state database's counts (`store::db_stats`), brought up to date.
    fn sync_db_calls(&self) {
        for (op, outcome, n) in crate::store::db_stats::counts() {
            if n == 0 {
                continue;
            }
            let labels = DbLabels {
                op: op.as_str(),
                outcome: outcome.as_str(),
            };
            let counter = self.db_calls.get_or_create(&labels);
            counter.inc_by(n.saturating_sub(counter.get()));
        }
    }

    /// The exposition text, the gauges set from `team` first.
    pub fn encode(&self, team: &TeamState) -> String {
        self.sync_db_calls();
        self.agents.clear();
        for (state, n) in &team.agents {
            self.agents
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .set(*n);
        }
        self.queued_turns.set(team.queued_turns);
        self.running_turns.set(team.running_turns);
        self.upstream_up.clear();
        self.upstream_restarts.clear();
        for (server, up, restarts) in &team.upstreams {
            let labels = ServerLabels {
                server: server.clone(),
            };
            self.upstream_up.get_or_create(&labels).set(i64::from(*up));
            self.upstream_restarts.get_or_create(&labels).set(*restarts);
        }
        self.model_requests_today.set(team.model_requests_today);
        self.model_tokens_today.set(team.model_tokens_today);
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
