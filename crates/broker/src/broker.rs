//! The broker's decisions: team rules, limits on the call path, the tools
//! themselves, and the operator's control operations. Independent of the
//! transport, so it is tested directly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Value, json};
use substrat_policy::LoadedPolicy;

use crate::audit::{Audit, Decision, Entry};
use crate::limits::{TokenBucket, truncate_output};
use crate::locks::LockAnyway;
use crate::store::{
    Agent, AgentStatus, ClaimedTurn, Delivery, NewMessage, Sender, Store, StoreError, TurnFinish,
    TurnRecord, now_ms,
};
use crate::tools::{
    self, BroadcastArgs, InspectAgentArgs, NoArgs, SendMessageArgs, SpawnAgentArgs,
};
use crate::upstream::config::UpstreamConfig;
use crate::upstream::menu::{self, Menu, PinState, UpstreamTool};
use crate::upstream::runtime::{self, Upstreams};

/// How many messages `inspect_agent` shows.
pub const RECENT_MESSAGES: u32 = 10;
/// How many turns `inspect_agent` and `agent inspect` show.
pub const RECENT_TURNS: u32 = 5;
/// The prompt of a turn that only continues a resumed session.
pub const RESUME_PROMPT: &str = "You were suspended and are resumed now. Continue your work.";

/// Why a running turn is being stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// `agent kill`: the turn fails and the agent is marked failed.
    Kill,
    /// `agent suspend`: the turn goes back to the queue.
    Suspend,
}

/// A turn running now: who runs it, and what the broker saw during it.
#[derive(Debug, Default)]
pub struct RunningTurn {
    pub turn_id: String,
    /// The launcher's pid, once it is started.
    pub pid: Option<u32>,
    pub stop: Option<StopReason>,
    /// Tool calls the broker decided during this turn: tool, decision, reason.
    pub calls: Vec<Value>,
    /// Calls with effects (messages, spawns) so far in this attempt: each
    /// gets a dedupe key `turn-id#n`, so a re-run does not repeat them.
    effects: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// The outcome of a tool call as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// A result (possibly an error result the agent can act on).
    Result { body: Value, is_error: bool },
    /// The tool does not exist for this agent (unknown or out of scope).
    UnknownTool,
    /// The arguments do not fit the tool's schema.
    InvalidArguments(String),
}

/// One MCP session of one agent: a turn.
#[derive(Debug)]
pub struct Session {
    pub agent_id: String,
    pub steps: u32,
    /// The agent's record, read once per session: an agent's row never
    /// changes, only its removal matters, which the broker tracks in memory.
    pub agent: Option<Agent>,
}

impl Session {
    pub fn new(agent_id: String) -> Self {
        Self {
            agent_id,
            steps: 0,
            agent: None,
        }
    }
}

/// Roles by name: a policy plus its persona.
pub type Roles = BTreeMap<String, LoadedPolicy>;

/// Agents made or removed, for whoever serves their sockets.
#[derive(Debug, Clone)]
pub enum AgentEvent {
    Created(Agent),
    Removed(String),
}

pub struct Broker {
    events: Mutex<Option<tokio::sync::mpsc::UnboundedSender<AgentEvent>>>,
    /// Agents removed while connections of theirs may still be open.
    removed: std::sync::RwLock<std::collections::HashSet<String>>,
    store: Mutex<Store>,
    roles: Roles,
    state_dir: PathBuf,
    audit: Audit,
    buckets: Mutex<HashMap<(String, Option<String>), TokenBucket>>,
    /// Turns running now, by agent id (one per agent at most).
    running: Mutex<HashMap<String, RunningTurn>>,
    /// Wakes the turn scheduler when turns are queued or agents resume.
    pub wake: tokio::sync::Notify,
    upstreams: Upstreams,
    /// Menus by role, with the upstream version they were built for.
    menus: Mutex<HashMap<String, (u64, Arc<Menu>)>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

fn error(code: &str, message: impl Into<String>) -> ToolOutcome {
    ToolOutcome::Result {
        body: json!({"status": "error", "error": code, "message": message.into()}),
        is_error: true,
    }
}

/// A call refused by a limit: an error result the agent can act on.
fn limited(body: Value, reason: &str) -> (ToolOutcome, Decision, Option<String>) {
    (
        ToolOutcome::Result {
            body,
            is_error: true,
        },
        Decision::Limited,
        Some(reason.to_string()),
    )
}

fn ok(body: Value) -> ToolOutcome {
    ToolOutcome::Result {
        body,
        is_error: false,
    }
}

impl Broker {
    pub fn new(store: Store, roles: Roles, state_dir: PathBuf, audit: Audit) -> Self {
        Self {
            events: Mutex::new(None),
            removed: Default::default(),
            store: Mutex::new(store),
            roles,
            state_dir,
            audit,
            buckets: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            upstreams: Upstreams::default(),
            menus: Mutex::new(HashMap::new()),
        }
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, RunningTurn>> {
        self.running.lock_anyway()
    }

    /// The dedupe key of the next call with effects in the agent's running
    /// turn: its position in the turn and what it does (`call`: the tool and
    /// its arguments), so a re-run finds only the very same call, never a
    /// different one at the same position. None outside a turn (an MCP
    /// client of the operator's).
    fn effect_key(&self, agent_id: &str, call: &[&str]) -> Option<String> {
        use sha2::{Digest, Sha256};
        let mut running = self.running();
        let turn = running.get_mut(agent_id)?;
        turn.effects += 1;
        let digest = Sha256::digest(call.join("\0").as_bytes());
        let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Some(format!("{}#{}#{short}", turn.turn_id, turn.effects))
    }

    /// Where to announce agents made or removed (the daemon's socket manager).
    pub fn set_events(&self, tx: tokio::sync::mpsc::UnboundedSender<AgentEvent>) {
        *self.events.lock_anyway() = Some(tx);
    }

    fn announce(&self, event: AgentEvent) {
        if let Some(tx) = self.events.lock_anyway().as_ref() {
            let _ = tx.send(event);
        }
    }

    pub fn roles(&self) -> &Roles {
        &self.roles
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock would be a bug; the data stays consistent
        // because every write is one SQLite transaction.
        self.store.lock_anyway()
    }

    pub fn agent(&self, id: &str) -> Result<Option<Agent>, BrokerError> {
        Ok(self.store().agent_by_id(id)?)
    }

    pub fn agent_named(&self, name: &str) -> Result<Option<Agent>, BrokerError> {
        Ok(self.store().agent_by_name(name)?)
    }

    pub fn agents(&self) -> Result<Vec<Agent>, BrokerError> {
        Ok(self.store().agents()?)
    }

    /// The policy of an agent's role; roles are checked when agents are made.
    pub fn policy_of(&self, agent: &Agent) -> Option<&LoadedPolicy> {
        self.roles.get(&agent.role)
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Where an agent's socket lives.
    pub fn socket_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("agents").join(id).join("broker.sock")
    }

    // ------------------------------------------------------------ the call path

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
    fn session_agent(&self, session: &mut Session) -> Result<Agent, ToolOutcome> {
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
                Err(e) => Err(error("internal", e.to_string())),
            },
        }
    }

    /// One audit line per call, and the call in the agent's running turn.
    fn record(
        &self,
        agent: &Agent,
        name: &str,
        start: Instant,
        outcome: ToolOutcome,
        decision: Decision,
        reason: Option<String>,
    ) -> ToolOutcome {
        let reason = reason.unwrap_or_else(|| match &outcome {
            ToolOutcome::Result {
                body,
                is_error: true,
            } => body["error"].as_str().unwrap_or("error").to_string(),
            _ => String::new(),
        });
        self.audit.record(&Entry {
            ts_ms: now_ms(),
            agent_id: &agent.id,
            agent: &agent.name,
            tool: name,
            decision,
            reason: &reason,
            latency_us: start.elapsed().as_micros() as u64,
        });
        if let Some(turn) = self.running().get_mut(&agent.id)
            && turn.calls.len() < 100
        {
            turn.calls
                .push(json!({"tool": name, "decision": decision, "reason": reason}));
        }
        outcome
    }

    /// The step and rate limits, on every call (built-in or upstream).
    fn admit(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        session: &mut Session,
        name: &str,
    ) -> Result<(), (ToolOutcome, Decision, Option<String>)> {
        if let Some(limit) = policy.policy.mcp.tool_steps_per_turn
            && session.steps >= limit
        {
            let body = json!({"status": "step_limit", "limit": limit,
                    "message": "tool step limit of this turn reached; finish the turn"});
            return Err(limited(body, "step_limit"));
        }
        if let Err(retry_after_ms) = self.take_tokens(agent, name, policy) {
            let body = json!({"status": "rate_limited", "retry_after_ms": retry_after_ms});
            return Err(limited(body, "rate_limited"));
        }
        session.steps += 1;
        Ok(())
    }

    fn decide(
        &self,
        agent: &Agent,
        session: &mut Session,
        name: &str,
        args: Value,
    ) -> (ToolOutcome, Decision, Option<String>) {
        let Some(policy) = self.policy_of(agent) else {
            return (
                error("internal", format!("role `{}` has no policy", agent.role)),
                Decision::Denied,
                None,
            );
        };
        // Out of scope or over the cap is the same as not existing.
        if !tools::visible_tools(&policy.policy).contains(&name) {
            return (
                ToolOutcome::UnknownTool,
                Decision::Denied,
                Some("unknown_or_out_of_scope".into()),
            );
        }
        if let Err(refused) = self.admit(agent, policy, session, name) {
            return refused;
        }
        let outcome = match self.run_tool(agent, policy, name, args) {
            Ok(outcome) => outcome,
            Err(BrokerError::Invalid(message)) => ToolOutcome::InvalidArguments(message),
            Err(e) => error("internal", e.to_string()),
        };
        let decision = match &outcome {
            ToolOutcome::Result {
                is_error: false, ..
            } => Decision::Allowed,
            _ => Decision::Denied,
        };
        (self.limit_output(outcome, policy), decision, None)
    }

    // ------------------------------------------------------------ upstream tools

    pub fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }

    /// Serves these upstream servers (their tasks start with `spawn_all`).
    pub fn with_upstreams(mut self, config: UpstreamConfig) -> Self {
        self.upstreams = Upstreams::new(config);
        self
    }

    /// The agent's menu: built-ins, then upstream tools, scoped and capped.
    /// Built once per role and upstream version; what it drops is audited
    /// then.
    pub fn menu(&self, agent: &Agent) -> Arc<Menu> {
        self.menu_for_role(&agent.role)
    }

    /// The menu of a role (empty for an unknown one).
    pub fn menu_for_role(&self, role: &str) -> Arc<Menu> {
        let version = self.upstreams.version();
        let Some(policy) = self.roles.get(role) else {
            return Arc::new(Menu::default());
        };
        let mut menus = self.menus.lock_anyway();
        if let Some((v, menu)) = menus.get(role)
            && *v == version
        {
            return menu.clone();
        }
        let menu = Arc::new(menu::build(&policy.policy, &self.upstreams.server_tools()));
        for dropped in &menu.dropped {
            self.audit.record(&Entry {
                ts_ms: now_ms(),
                agent_id: "",
                agent: &format!("(role {role})"),
                tool: &dropped.name,
                decision: Decision::Denied,
                reason: &format!("menu: {}", dropped.reason),
                latency_us: 0,
            });
        }
        menus.insert(role.to_string(), (version, menu.clone()));
        menu
    }

    /// The definitions of the agent's upstream tools, by menu name.
    pub fn upstream_definitions(&self, agent: &Agent) -> Vec<(String, UpstreamTool)> {
        let menu = self.menu(agent);
        let servers = self.upstreams.server_tools();
        menu.entries
            .iter()
            .filter_map(|e| {
                let server = e.server.as_deref()?;
                let tools = &servers.iter().find(|s| s.server == server)?.tools;
                let (tool, _) = tools.iter().find(|(t, _)| t.name == e.tool)?;
                Some((e.name.clone(), tool.clone()))
            })
            .collect()
    }

    /// A call to an upstream tool: the same scope, step, rate and output
    /// limits as a built-in, then the server, with its timeout. No lock is
    /// held while the server works.
    pub async fn call_upstream(
        &self,
        session: &Mutex<Session>,
        name: &str,
        args: serde_json::Map<String, Value>,
    ) -> ToolOutcome {
        let start = Instant::now();
        let admitted = {
            let mut session = session.lock_anyway();
            match self.session_agent(&mut session) {
                Err(refusal) => return refusal,
                Ok(agent) => {
                    let menu = self.menu(&agent);
                    let target = menu
                        .find(name)
                        .and_then(|e| Some((e.server.clone()?, e.tool.clone())));
                    match (self.policy_of(&agent), target) {
                        (Some(policy), Some(target)) => {
                            match self.admit(&agent, policy, &mut session, name) {
                                Ok(()) => Ok((agent, policy, target)),
                                Err(refused) => Err((agent, refused)),
                            }
                        }
                        _ => Err((
                            agent,
                            (
                                ToolOutcome::UnknownTool,
                                Decision::Denied,
                                Some("unknown_or_out_of_scope".into()),
                            ),
                        )),
                    }
                }
            }
        };
        let (agent, policy, (server, tool)) = match admitted {
            Ok(admitted) => admitted,
            Err((agent, (outcome, decision, reason))) => {
                return self.record(&agent, name, start, outcome, decision, reason);
            }
        };
        let (outcome, decision, reason) = match self.upstreams.call(&server, &tool, args).await {
            Ok(result) => (
                ToolOutcome::Result {
                    body: Value::String(result_text(&result)),
                    is_error: result.is_error.unwrap_or(false),
                },
                Decision::Allowed,
                None,
            ),
            Err(message) => (
                error("upstream", message.clone()),
                Decision::Denied,
                Some(format!("upstream: {message}")),
            ),
        };
        let outcome = self.limit_output(outcome, policy);
        self.record(&agent, name, start, outcome, decision, reason)
    }

    /// Checks a tool's definition against its pin; a quarantine is audited.
    pub fn check_pin(
        &self,
        server: &str,
        position: usize,
        tool: &UpstreamTool,
    ) -> Result<PinState, BrokerError> {
        let (hash, definition, flagged) = runtime::pin_inputs(tool);
        let state = self.store().check_pin(
            server,
            &tool.name,
            position,
            &hash,
            &definition,
            flagged.as_deref(),
        )?;
        if let PinState::Quarantined(why) = &state {
            self.audit.record(&Entry {
                ts_ms: now_ms(),
                agent_id: "",
                agent: "(upstream)",
                tool: &format!("{server}_{}", tool.name),
                decision: Decision::Denied,
                reason: &format!("quarantined: {why}"),
                latency_us: 0,
            });
        }
        Ok(state)
    }

    pub fn approve_pin(
        &self,
        server: &str,
        tool: &str,
        hash: &str,
    ) -> Result<crate::store::Approval, BrokerError> {
        let approval = self.store().approve_pin(server, tool, hash)?;
        if approval == crate::store::Approval::Approved {
            self.upstreams.approved(server, tool);
        }
        Ok(approval)
    }

    pub fn pins(&self) -> Result<Vec<crate::store::PinRow>, BrokerError> {
        Ok(self.store().pins()?)
    }

    fn take_tokens(&self, agent: &Agent, tool: &str, policy: &LoadedPolicy) -> Result<(), u64> {
        let mcp = &policy.policy.mcp;
        let now = Instant::now();
        let mut buckets = self.buckets.lock_anyway();
        if let Some(rate) = mcp.calls_per_minute {
            let burst = mcp.burst.unwrap_or(rate);
            let bucket = buckets
                .entry((agent.id.clone(), None))
                .or_insert_with(|| TokenBucket::new(rate, burst));
            bucket.take(now)?;
        }
        if let Some(rate) = mcp.per_tool_calls_per_minute {
            let burst = mcp.per_tool_burst.unwrap_or(rate);
            let key = (agent.id.clone(), Some(tool.to_string()));
            let bucket = buckets
                .entry(key)
                .or_insert_with(|| TokenBucket::new(rate, burst));
            bucket.take(now)?;
        }
        Ok(())
    }

    fn limit_output(&self, outcome: ToolOutcome, policy: &LoadedPolicy) -> ToolOutcome {
        match (outcome, policy.policy.mcp.max_output_bytes) {
            (ToolOutcome::Result { body, is_error }, Some(limit)) => {
                let text = body.to_string();
                if text.len() as u64 <= limit.0 {
                    ToolOutcome::Result { body, is_error }
                } else {
                    let cut = truncate_output(text, usize::try_from(limit.0).unwrap_or(usize::MAX));
                    ToolOutcome::Result {
                        body: Value::String(cut),
                        is_error,
                    }
                }
            }
            (outcome, _) => outcome,
        }
    }

    fn run_tool(
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
                self.check_inbox(agent)
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

    // ------------------------------------------------------------ team rules

    /// Parent, children and siblings: whom an agent may message.
    fn may_message(from: &Agent, to: &Agent) -> bool {
        let parent = to.parent_id.as_deref() == Some(from.id.as_str())
            || from.parent_id.as_deref() == Some(to.id.as_str());
        let sibling =
            from.id != to.id && from.parent_id.is_some() && from.parent_id == to.parent_id;
        parent || sibling
    }

    /// Whether `boss` is an ancestor of `agent`.
    fn is_subordinate(&self, boss: &Agent, agent: &Agent) -> Result<bool, BrokerError> {
        let store = self.store();
        let mut current = agent.parent_id.clone();
        while let Some(id) = current {
            if id == boss.id {
                return Ok(true);
            }
            current = store.agent_by_id(&id)?.and_then(|a| a.parent_id);
        }
        Ok(false)
    }

    fn text_too_large(policy: &LoadedPolicy, text: &str) -> Option<ToolOutcome> {
        let limit = policy.policy.mcp.max_message_bytes?;
        (text.len() as u64 > limit.0).then(|| {
            error(
                "message_too_large",
                format!(
                    "the text is {} bytes; this role allows {}",
                    text.len(),
                    limit.0
                ),
            )
        })
    }

    fn send_message(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: SendMessageArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        if let Some(too_large) = Self::text_too_large(policy, &args.text) {
            return Ok(too_large);
        }
        // One answer for "no such agent" and "not in your team": names of
        // other teams are not to be probed.
        let recipient = match self.agent_named(&args.recipient)? {
            Some(r) if Self::may_message(agent, &r) => r,
            _ => {
                return Ok(error(
                    "unknown_recipient",
                    format!(
                        "no agent `{}` in your team (parent, children, siblings)",
                        args.recipient
                    ),
                ));
            }
        };
        let depth = self
            .policy_of(&recipient)
            .and_then(|p| p.policy.mcp.inbox_depth);
        let from = Sender {
            id: &agent.id,
            name: &agent.name,
        };
        // A sync message is the recipient's next turn (its answer comes
        // back as the sender's); an async one waits for check_inbox.
        let message = NewMessage {
            from,
            to_id: &recipient.id,
            text: &args.text,
            sync: args.sync,
            kind: "message",
            delivery: if args.sync {
                Delivery::Turn
            } else {
                Delivery::Inbox
            },
            thread: None,
            dedupe_key: self.effect_key(
                &agent.id,
                &[
                    "send_message",
                    &args.recipient,
                    &args.text,
                    if args.sync { "sync" } else { "async" },
                ],
            ),
        };
        match self.store().send(&[message], depth)?.pop().flatten() {
            Some(id) => {
                self.wake.notify_one();
                Ok(ok(
                    json!({"status": "sent", "message_id": id, "waiting_for_reply": args.sync}),
                ))
            }
            None => Ok(error(
                "inbox_full",
                format!("the inbox of `{}` is full; try again later", recipient.name),
            )),
        }
    }

    fn broadcast(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: BroadcastArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        if let Some(too_large) = Self::text_too_large(policy, &args.text) {
            return Ok(too_large);
        }
        let siblings: Vec<Agent> = match &agent.parent_id {
            Some(parent) => self
                .store()
                .children(parent)?
                .into_iter()
                .filter(|a| a.id != agent.id)
                .collect(),
            // A root agent has no siblings: its team is its children.
            None => self.store().children(&agent.id)?,
        };
        if let Some(fanout) = policy.policy.mcp.broadcast_fanout
            && siblings.len() > fanout as usize
        {
            return Ok(error(
                "broadcast_fanout",
                format!(
                    "{} siblings; this role may broadcast to {fanout}",
                    siblings.len()
                ),
            ));
        }
        let from = Sender {
            id: &agent.id,
            name: &agent.name,
        };
        let key = self.effect_key(&agent.id, &["broadcast", &args.text]);
        let mut store = self.store();
        // A re-run finds its first run's broadcast id.
        let broadcast_id = match (&key, siblings.first()) {
            (Some(key), Some(first)) => store.thread_of(&format!("{key}/{}", first.id))?,
            _ => None,
        }
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut sent = 0;
        let mut undelivered = Vec::new();
        // Each recipient's own inbox depth applies.
        for sibling in &siblings {
            let depth = self
                .policy_of(sibling)
                .and_then(|p| p.policy.mcp.inbox_depth);
            // Each sibling answers in a turn of its own; each answer comes
            // back as its own reply.
            let message = NewMessage {
                from: from.clone(),
                to_id: &sibling.id,
                text: &args.text,
                sync: false,
                kind: "broadcast",
                delivery: Delivery::Turn,
                thread: Some(&broadcast_id),
                dedupe_key: key.as_ref().map(|k| format!("{k}/{}", sibling.id)),
            };
            match store.send(&[message], depth)?.pop().flatten() {
                Some(_) => sent += 1,
                None => undelivered.push(json!({"name": sibling.name, "reason": "inbox_full"})),
            }
        }
        drop(store);
        self.wake.notify_one();
        Ok(ok(
            json!({"status": "sent", "message_id": broadcast_id, "recipient_count": sent, "undelivered": undelivered}),
        ))
    }

    fn check_inbox(&self, agent: &Agent) -> Result<ToolOutcome, BrokerError> {
        let messages = self.store().take_inbox(&agent.id)?;
        let list: Vec<Value> = messages
            .iter()
            .map(|m| json!({"from": m.from_name, "text": m.text, "message_id": m.id}))
            .collect();
        Ok(ok(json!({"messages": list})))
    }

    fn spawn_agent(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: SpawnAgentArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        let mcp = &policy.policy.mcp;
        let depth = agent.depth + 1;
        if mcp.spawn_depth.is_some_and(|max| depth > max) {
            return Ok(error(
                "spawn_depth",
                format!(
                    "a child of this agent would be at depth {depth}; this role allows {}",
                    mcp.spawn_depth.unwrap_or(0)
                ),
            ));
        }
        let children = self.store().children(&agent.id)?.len();
        if mcp
            .children_per_agent
            .is_some_and(|max| children >= max as usize)
        {
            return Ok(error(
                "children_limit",
                format!("this agent has {children} children, the most its role allows"),
            ));
        }
        if let Some(too_large) = Self::text_too_large(policy, &args.instructions) {
            return Ok(too_large);
        }
        let workspace = match (&args.workspace_subdir, &agent.workspace) {
            (None, ws) => ws.clone(),
            (Some(_), None) => {
                return Ok(error(
                    "workspace",
                    "this agent has no workspace to take a subdirectory of",
                ));
            }
            (Some(sub), Some(ws)) => match resolve_subdir(Path::new(ws), sub) {
                Ok(path) => Some(path.display().to_string()),
                Err(message) => return Ok(error("workspace", message)),
            },
        };
        let key = self.effect_key(
            &agent.id,
            &[
                "spawn_agent",
                &args.name,
                &args.role,
                args.workspace_subdir.as_deref().unwrap_or(""),
                &args.instructions,
            ],
        );
        // A re-run of the turn that made this child finds it.
        if let Some(key) = &key
            && let Some(child) = self.store().agent_created_by(key)?
        {
            return Ok(ok(
                json!({"status": "created", "agent_id": child.id, "name": child.name}),
            ));
        }
        let request = NewAgent {
            name: args.name,
            role: args.role,
            parent: Some(agent.clone()),
            workspace,
            model: agent.model.clone(),
            instructions: Some(args.instructions),
            created_by: key,
        };
        match self.create_agent(request) {
            Ok(child) => Ok(ok(
                json!({"status": "created", "agent_id": child.id, "name": child.name}),
            )),
            Err(CreateError::Refused(code, message)) => Ok(error(code, message)),
            Err(CreateError::Broker(e)) => Err(e),
        }
    }

    fn inspect_agent(
        &self,
        agent: &Agent,
        args: InspectAgentArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        let target = match self.agent_named(&args.name)? {
            Some(t) if self.is_subordinate(agent, &t)? => t,
            _ => {
                return Ok(error(
                    "unknown_subordinate",
                    format!("no subordinate named `{}`", args.name),
                ));
            }
        };
        Ok(ok(self.activity(&target)?))
    }

    /// What `inspect_agent` and `agent inspect` show: the state and the last
    /// messages the agent sent or received, newest first.
    pub fn activity(&self, target: &Agent) -> Result<Value, BrokerError> {
        let store = self.store();
        let recent = store.recent_messages(&target.id, RECENT_MESSAGES)?;
        let queued = store.queued_count(&target.id)?;
        let mut messages = Vec::new();
        for m in recent {
            let (direction, counterpart) = if m.to_id == target.id {
                ("in", m.from_name.clone())
            } else {
                (
                    "out",
                    store
                        .agent_by_id(&m.to_id)?
                        .map(|a| a.name)
                        .unwrap_or_else(|| "(removed)".into()),
                )
            };
            let text: String = m.text.chars().take(500).collect();
            messages.push(
                json!({"direction": direction, "counterpart": counterpart, "text": text,
                "message_id": m.id, "status": m.status, "kind": m.kind, "at_ms": m.created_at}),
            );
        }
        let status = store.agent_status(&target.id)?;
        let turns = store.recent_turns(&target.id, RECENT_TURNS)?;
        drop(store);
        let menu = self.menu(target);
        Ok(json!({
            "name": target.name, "role": target.role, "state": status.state,
            "reason": status.reason, "session_id": status.session_id,
            "queued_messages": queued, "queued_turns": status.queued_turns,
            "awaiting_replies": status.awaiting_replies,
            "recent_turns": turns.iter().map(turn_summary).collect::<Vec<_>>(),
            "recent_messages": messages,
            "tools": menu.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            "dropped_tools": menu.dropped,
        }))
    }

    pub fn status(&self, agent: &Agent) -> Result<AgentStatus, BrokerError> {
        Ok(self.store().agent_status(&agent.id)?)
    }

    // ------------------------------------------------------------ operator control

    pub fn create_agent(&self, request: NewAgent) -> Result<Agent, CreateError> {
        let refuse = |code: &'static str, message: String| Err(CreateError::Refused(code, message));
        if !valid_name(&request.name) {
            return refuse(
                "invalid_name",
                format!(
                    "`{}` is not a valid agent name (1-64 of letters, digits, `-`, `_`, `.`)",
                    request.name
                ),
            );
        }
        if !self.roles.contains_key(&request.role) {
            let known: Vec<&str> = self.roles.keys().map(String::as_str).collect();
            return refuse(
                "unknown_role",
                format!("no role `{}` (known: {})", request.role, known.join(", ")),
            );
        }
        if self
            .agent_named(&request.name)
            .map_err(CreateError::Broker)?
            .is_some()
        {
            return refuse(
                "name_taken",
                format!("an agent named `{}` exists", request.name),
            );
        }
        let agent = Agent {
            id: uuid::Uuid::new_v4().to_string(),
            name: request.name,
            role: request.role,
            parent_id: request.parent.as_ref().map(|p| p.id.clone()),
            workspace: request.workspace,
            depth: request.parent.as_ref().map_or(0, |p| p.depth + 1),
            created_at: now_ms(),
            model: request.model,
        };
        let from = match &request.parent {
            Some(p) => Sender {
                id: &p.id,
                name: &p.name,
            },
            None => Sender {
                id: "operator",
                name: "operator",
            },
        };
        {
            let mut store = self.store();
            let broker = |e: StoreError| CreateError::Broker(e.into());
            store
                .insert_agent(&agent, request.created_by.as_deref())
                .map_err(broker)?;
            // The instructions are the first turn's prompt.
            if let Some(text) = &request.instructions {
                let first = NewMessage {
                    from,
                    to_id: &agent.id,
                    text,
                    sync: false,
                    kind: "instructions",
                    delivery: Delivery::Turn,
                    thread: None,
                    dedupe_key: None,
                };
                store.send(&[first], None).map_err(broker)?;
            }
        }
        self.announce(AgentEvent::Created(agent.clone()));
        self.wake.notify_one();
        Ok(agent)
    }

    pub fn remove_agent(&self, agent: &Agent) -> Result<(), CreateError> {
        // One store lock for the checks and the removal: no turn can be
        // claimed for the agent in between.
        let mut store = self.store();
        let children = store
            .children(&agent.id)
            .map_err(|e| CreateError::Broker(e.into()))?;
        if self.running().contains_key(&agent.id) {
            return Err(CreateError::Refused(
                "busy",
                format!("`{}` is running a turn; kill it first", agent.name),
            ));
        }
        if !children.is_empty() {
            let names: Vec<String> = children.into_iter().map(|c| c.name).collect();
            return Err(CreateError::Refused(
                "has_children",
                format!(
                    "`{}` has children ({}); remove them first",
                    agent.name,
                    names.join(", ")
                ),
            ));
        }
        store
            .remove_agent(&agent.id)
            .map_err(|e| CreateError::Broker(e.into()))?;
        drop(store);
        // Sessions still open refuse every further call.
        if let Ok(mut removed) = self.removed.write() {
            removed.insert(agent.id.clone());
        }
        self.announce(AgentEvent::Removed(agent.id.clone()));
        Ok(())
    }

    /// A message from the operator (`agent send`): the agent's next turn,
    /// subject to the inbox depth.
    pub fn operator_send(&self, to: &Agent, text: &str) -> Result<Option<String>, BrokerError> {
        let depth = self.policy_of(to).and_then(|p| p.policy.mcp.inbox_depth);
        let message = NewMessage {
            from: Sender {
                id: "operator",
                name: "operator",
            },
            to_id: &to.id,
            text,
            sync: false,
            kind: "operator",
            delivery: Delivery::Turn,
            thread: None,
            dedupe_key: None,
        };
        let id = self.store().send(&[message], depth)?.pop().flatten();
        self.wake.notify_one();
        Ok(id)
    }

    // ------------------------------------------------------------ turns

    /// Takes queued turns to run (see `Store::claim_turns`) and registers
    /// each as running, so tool calls and stops find it.
    pub fn claim_turns(&self, limit: usize) -> Result<Vec<ClaimedTurn>, BrokerError> {
        // The store stays locked until the turns are registered: a kill,
        // suspend or removal (which take the store first) sees them.
        // Lock order everywhere: store, then running.
        let mut store = self.store();
        let turns = store.claim_turns(limit)?;
        let mut running = self.running();
        for t in &turns {
            running.insert(
                t.agent.id.clone(),
                RunningTurn {
                    turn_id: t.id.clone(),
                    ..RunningTurn::default()
                },
            );
        }
        Ok(turns)
    }

    /// Records the launcher's pid; returns a stop asked for before it started.
    pub fn turn_started(&self, agent_id: &str, pid: u32) -> Option<StopReason> {
        let mut running = self.running();
        let turn = running.get_mut(agent_id)?;
        turn.pid = Some(pid);
        turn.stop.clone()
    }

    /// Ends the running turn's registration: what the broker saw during it.
    pub fn turn_ended(&self, agent_id: &str) -> Option<RunningTurn> {
        self.running().remove(agent_id)
    }

    pub fn finish_turn(&self, finish: &TurnFinish<'_>) -> Result<(), BrokerError> {
        self.store().finish_turn(finish)?;
        self.wake.notify_one();
        Ok(())
    }

    pub fn set_turn_prompt(&self, turn_id: &str, prompt: &str) -> Result<(), BrokerError> {
        Ok(self.store().set_turn_prompt(turn_id, prompt)?)
    }

    pub fn requeue_turn(&self, turn_id: &str) -> Result<(), BrokerError> {
        Ok(self.store().requeue_turn(turn_id)?)
    }

    /// After a restart: turns that were running are queued again.
    pub fn recover_running(&self) -> Result<usize, BrokerError> {
        Ok(self.store().recover_running()?)
    }

    /// Asks the agent's running turn to stop: SIGTERM to its launcher,
    /// which ends the whole sandbox. Returns whether a turn was running.
    fn stop_turn(&self, agent_id: &str, reason: StopReason) -> bool {
        let mut running = self.running();
        let Some(turn) = running.get_mut(agent_id) else {
            return false;
        };
        turn.stop = Some(reason);
        if let Some(pid) = turn.pid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        true
    }

    /// No new turns; a running one is stopped and queued again.
    pub fn suspend(&self, agent: &Agent) -> Result<bool, BrokerError> {
        self.store().set_agent_state(&agent.id, "suspended", None)?;
        Ok(self.stop_turn(&agent.id, StopReason::Suspend))
    }

    /// Back to active; with nothing queued, a turn that continues the
    /// session (`--resume`) is queued. Returns whether that turn was queued.
    pub fn resume(&self, agent: &Agent) -> Result<bool, CreateError> {
        let store = self.store();
        let status = store.agent_status(&agent.id).map_err(BrokerError::from)?;
        if status.state != "suspended" && status.state != "failed" {
            return Err(CreateError::Refused(
                "not_stopped",
                format!(
                    "`{}` is {}; only a suspended or failed agent can be resumed",
                    agent.name, status.state
                ),
            ));
        }
        store
            .set_agent_state(&agent.id, "active", None)
            .map_err(BrokerError::from)?;
        let continued = status.queued_turns == 0 && status.session_id.is_some();
        if continued {
            store
                .queue_prompt(&agent.id, RESUME_PROMPT)
                .map_err(BrokerError::from)?;
        }
        drop(store);
        self.wake.notify_one();
        Ok(continued)
    }

    /// Stops the running turn; the agent is failed until resumed.
    pub fn kill(&self, agent: &Agent) -> Result<bool, BrokerError> {
        let reason = "killed by the operator";
        self.store()
            .set_agent_state(&agent.id, "failed", Some(reason))?;
        Ok(self.stop_turn(&agent.id, StopReason::Kill))
    }

    /// Records a refused request that never reached a tool (identity
    /// spoofing, protocol abuse) in the audit log.
    pub fn audit_refusal(&self, agent_id: &str, what: &str, reason: &str) {
        let name = self
            .agent(agent_id)
            .ok()
            .flatten()
            .map(|a| a.name)
            .unwrap_or_default();
        self.audit.record(&Entry {
            ts_ms: now_ms(),
            agent_id,
            agent: &name,
            tool: what,
            decision: Decision::Denied,
            reason,
            latency_us: 0,
        });
    }
}

#[derive(Debug, Default)]
pub struct NewAgent {
    pub name: String,
    pub role: String,
    pub parent: Option<Agent>,
    pub workspace: Option<String>,
    pub model: Option<String>,
    /// The first turn's prompt; none: registered only, no turn queued.
    pub instructions: Option<String>,
    /// The dedupe key of the spawn_agent call making it.
    pub created_by: Option<String>,
}

/// A turn as `agent inspect` shows it: prompt and result cut to 500 chars.
fn turn_summary(t: &TurnRecord) -> Value {
    let cut = |s: &str| -> String { s.chars().take(500).collect() };
    json!({
        "turn_id": t.id, "kind": t.kind, "status": t.status, "attempts": t.attempts,
        "prompt": cut(&t.prompt), "result": t.result.as_deref().map(cut),
        "error": t.error, "tool_calls": t.tool_calls, "stream_notes": t.notes,
        "queued_at_ms": t.created_at, "started_at_ms": t.started_at, "finished_at_ms": t.finished_at,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{1}")]
    Refused(&'static str, String),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "operator"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.')
}

/// A subdirectory of `workspace`: relative, no `..`, and reached without
/// following any symlink (a link planted on the way is refused, nothing is
/// created outside). Missing components are created.
fn resolve_subdir(workspace: &Path, subdir: &str) -> Result<PathBuf, String> {
    use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat, openat2};
    use nix::sys::stat::{Mode, mkdirat};
    let relative = Path::new(subdir);
    if relative.is_absolute() || subdir.is_empty() {
        return Err(format!(
            "workspace_subdir `{subdir}` must be a relative path inside your workspace"
        ));
    }
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "workspace_subdir `{subdir}` may not contain `.` or `..`"
        ));
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    let mut dir = openat2(AT_FDCWD, workspace, how)
        .map_err(|e| format!("your workspace {}: {}", workspace.display(), e.desc()))?;
    for component in relative.components() {
        let name = component.as_os_str();
        dir = match openat(&dir, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(nix::errno::Errno::ENOENT) => {
                mkdirat(&dir, name, Mode::from_bits_truncate(0o755))
                    .map_err(|e| format!("cannot create `{subdir}`: {}", e.desc()))?;
                openat(&dir, name, flags, Mode::empty())
                    .map_err(|e| format!("`{subdir}`: {}", e.desc()))?
            }
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(format!(
                    "workspace_subdir `{subdir}` leads outside your workspace (a symlink or a file on the way)"
                ));
            }
            Err(e) => return Err(format!("`{subdir}`: {}", e.desc())),
        };
    }
    Ok(workspace.join(relative))
}

/// An upstream result as text: text blocks joined; other blocks (images,
/// audio, resources) are named, not relayed.
fn result_text(result: &rmcp::model::CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        match block.as_text() {
            Some(text) => parts.push(text.text.clone()),
            None => parts.push("[substrat: a non-text content block was not relayed]".into()),
        }
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    parts.join("\n")
}
