//! The broker's decisions: team rules, limits on the call path, the tools
//! themselves, and the operator's control operations. Independent of the
//! transport, so it is tested directly.
//!
//! One module per concern, each adding its methods to `Broker`: the call
//! path (`call_path`), the team's tools and rules (`team`), upstream tools
//! (`upstream`), the operator's requests (`operator`), turns in flight
//! (`turn_state`), roles resolved to prompts (`roles`).

mod call_path;
mod daemons;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod model_tests;
mod operator;
#[cfg(test)]
mod placement_attack_tests;
#[cfg(test)]
mod role_tests;
mod roles;
mod scrape;
mod team;
#[cfg(test)]
mod tests;
mod turn_state;
mod upstream;

pub use daemons::Placement;
pub(crate) use operator::workspace_refusal;
pub use operator::{CreateError, NewAgent};
pub use upstream::SwitchError;

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Value, json};
use substrat_policy::LoadedPolicy;

use crate::audit::{Audit, Decision, Entry, Refusal};
use crate::limits::TokenBucket;
use crate::locks::LockAnyway;
use crate::store::{
    Agent, AgentStatus, CallCount, CallLimits, ClaimedTurn, Delivery, NewMessage, Sender, Store,
    StoreError, TurnFinish, TurnRecord, now_ms,
};
use crate::tools::{
    self, BroadcastArgs, InspectAgentArgs, NoArgs, SendMessageArgs, SpawnAgentArgs,
};
use crate::upstream::config::UpstreamConfig;
use crate::upstream::menu::{self, Menu, PinState, UpstreamTool};
use crate::upstream::registry::{self, Upstreams};

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
    /// This daemon could not beat its heart for most of a lease (the state
    /// database unreachable): another daemon may fail the turn and adopt
    /// its agent, so it stops acting for it now.
    LeaseLost,
    /// The daemon stops (its turns' containers are removed): the turn
    /// goes back to the queue, as after a crash.
    Shutdown,
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
    /// When the CLI wrote its first line (the launch's end, as the
    /// metrics' `launch_seconds` measure it).
    pub first_output: Option<Instant>,
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
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

/// The outcome of a tool call as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// A result (possibly an error result the agent can act on).
    Result { body: Value, is_error: bool },
    /// An upstream tool's result as its server gave it, within the role's
    /// limits (crate::output_budget).
    Relayed(Box<rmcp::model::CallToolResult>),
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
#[derive(Debug)]
pub enum AgentEvent {
    /// A new agent and its socket, already bound and listening.
    Created(Agent, std::os::unix::net::UnixListener),
    Removed(String),
    /// An agent another daemon runs now (adopted from this one): its
    /// socket here is closed, if this daemon serves it.
    Released(String),
}

pub struct Broker {
    events: Mutex<Option<tokio::sync::mpsc::UnboundedSender<AgentEvent>>>,
    /// Since when every heartbeat of this daemon succeeded (none: the last
    /// failed): other daemons are judged only after a whole lease of it.
    beating_since: Mutex<Option<Instant>>,
    /// When a heartbeat last succeeded.
    last_beat: Mutex<Instant>,
    /// The certificate authority for relays on other hosts, made once
    /// (under this lock: two first uses at once make one).
    authority: Mutex<Option<Arc<crate::tls::Authority>>>,
    /// The team key (`--team-key`): the authority is then the team's, in
    /// the database (crate::team_ca).
    team_key: Mutex<Option<Arc<crate::team_key::TeamKey>>>,
    /// Agents removed while connections of theirs may still be open.
    removed: std::sync::RwLock<std::collections::HashSet<String>>,
    store: Mutex<Store>,
    roles: Roles,
    /// Roles whose prompt a script or compiled code resolves, by name.
    compiled: BTreeMap<String, Arc<dyn crate::roles::Role>>,
    /// The built-in tools each role sees, worked out once: matching the
    /// policy's globs on every call cost 8% of the daemon under load.
    visible: BTreeMap<String, Vec<&'static str>>,
    state_dir: PathBuf,
    /// Where the sockets live when not in `state_dir` (`--runtime-dir`).
    runtime_dir: Option<PathBuf>,
    audit: Audit,
    /// Counters and histograms for `GET /metrics` (`metrics_text`).
    pub metrics: crate::metrics::Metrics,
    buckets: Mutex<HashMap<(String, Option<String>), TokenBucket>>,
    /// Whether agents' call rates and turns' steps are counted in the
    /// store (`take_tokens`, `admit`) rather than in `buckets` and the
    /// sessions.
    counts_in_store: bool,
    /// Turns running now, by agent id (one per agent at most).
    running: Mutex<HashMap<String, RunningTurn>>,
    /// Wakes the turn scheduler when turns are queued or agents resume.
    pub wake: tokio::sync::Notify,
    upstreams: Upstreams,
    /// Menus by role, with the upstream version they were built for.
    menus: Mutex<HashMap<String, (u64, Arc<Menu>)>>,
    /// The agent CLIs turns can run (set when turns start); an agent
    /// naming another is refused at creation.
    providers: std::sync::RwLock<Vec<String>>,
    /// The paths this daemon declared shared (resolved): a workspace of
    /// an agent placed here by another daemon must be under one.
    shared_paths: std::sync::RwLock<Vec<PathBuf>>,
    /// The CLI an agent naming none runs (set when turns start).
    default_provider: std::sync::RwLock<Option<String>>,
    /// Agents whose warm sandbox is to be released now (suspended, killed,
    /// removed): the turn scheduler takes them.
    released: Mutex<Vec<String>>,
    /// Sandboxes built ahead for agents to come (`daemon --warm-pool`).
    spawn_pool: Mutex<Option<Arc<dyn SpawnPool>>>,
    /// The agents whose sockets this daemon has bound and serves: an
    /// agent is bound once however it came (made, placed, adopted).
    serving: Mutex<std::collections::HashSet<String>>,
}

/// What a new agent may take over: a sandbox built ahead for an agent of
/// its kind, under an id reserved for it (turns::pool).
pub trait SpawnPool: Send + Sync {
    /// The reserved id and socket of a sandbox built for an agent of this
    /// role, workspace, CLI and model, taken for the agent made now.
    fn claim(&self, wanted: &PoolWanted<'_>) -> Option<Reserved>;
    /// The agent could not be made after all: its sandbox is released.
    fn forget(&self, agent_id: &str);
    /// The agent is stored: its reserved directory is its own now.
    fn stored(&self, agent_id: &str);
}

/// What a new agent's sandbox must have been built for.
#[derive(Debug)]
pub struct PoolWanted<'a> {
    pub role: &'a str,
    pub workspace: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
}

/// An id reserved for an agent to come, and its socket, already bound
/// (or None when no daemon serves the sockets).
#[derive(Debug)]
pub struct Reserved {
    pub id: String,
    pub listener: Option<std::os::unix::net::UnixListener>,
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
fn limited(body: Value, refusal: Refusal) -> (ToolOutcome, Decision, Option<Refusal>) {
    (
        ToolOutcome::Result {
            body,
            is_error: true,
        },
        Decision::Limited,
        Some(refusal),
    )
}

fn ok(body: Value) -> ToolOutcome {
    ToolOutcome::Result {
        body,
        is_error: false,
    }
}

impl Broker {
    /// Each role run here with the hash of its resolved policy.
    fn role_hashes(&self) -> BTreeMap<String, String> {
        self.roles
            .iter()
            .map(|(name, role)| (name.clone(), crate::placement::policy_hash(&role.policy)))
            .collect()
    }

    /// The roles run here, for a daemon without agent CLIs (its agents'
    /// turns stay queued, their tools are served): adoption judges them
    /// (crate::placement::may_adopt); placement needs a CLI too.
    pub fn declare_roles(&self) -> Result<(), BrokerError> {
        self.store().declare_runs(&self.role_hashes(), &[])?;
        Ok(())
    }

    /// The agent CLIs this daemon's turns can run, `default` first. The
    /// daemons table records them with the roles run here (by their
    /// policies' hashes): another daemon places an agent here only when
    /// it runs the same role and CLI (crate::placement).
    pub fn set_providers(&self, mut names: Vec<String>, default: &str) -> Result<(), BrokerError> {
        names.sort_by_key(|n| n != default);
        self.store().declare_runs(&self.role_hashes(), &names)?;
        *self.providers.write().unwrap_or_else(|p| p.into_inner()) = names;
        *self
            .default_provider
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(default.to_string());
        Ok(())
    }

    /// The CLI an agent naming none runs here (none: no turns here).
    pub(super) fn default_provider(&self) -> Option<String> {
        let default = self.default_provider.read();
        default.unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The paths this daemon declared shared (`daemon --shared-path`),
    /// resolved.
    pub fn set_shared_paths(&self, paths: Vec<PathBuf>) {
        *self.shared_paths.write().unwrap_or_else(|p| p.into_inner()) = paths;
    }

    /// The CLI the agent's turns run: its own, else the daemon's default
    /// (None before turns start on a daemon without providers).
    pub fn provider_of(&self, agent: &Agent) -> Option<String> {
        agent.provider.clone().or_else(|| self.default_provider())
    }

    pub fn new(store: Store, roles: Roles, state_dir: PathBuf, audit: Audit) -> Self {
        Self {
            // Where other daemons may run the agents. One daemon alone
            // uses a SQLite database: counting there would cost every
            // call a write (docs/broker.md) and gain nothing.
            counts_in_store: store.engine() == crate::store::Engine::Postgres,
            events: Mutex::new(None),
            beating_since: Mutex::new(None),
            last_beat: Mutex::new(Instant::now()),
            authority: Mutex::new(None),
            team_key: Mutex::new(None),
            removed: Default::default(),
            providers: Default::default(),
            shared_paths: Default::default(),
            default_provider: Default::default(),
            store: Mutex::new(store),
            visible: roles
                .iter()
                .map(|(name, role)| (name.clone(), tools::visible_tools(&role.policy)))
                .collect(),
            roles,
            state_dir,
            runtime_dir: None,
            audit,
            metrics: crate::metrics::Metrics::new(),
            buckets: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            upstreams: Upstreams::default(),
            menus: Mutex::new(HashMap::new()),
            released: Mutex::new(Vec::new()),
            spawn_pool: Mutex::new(None),
            serving: Mutex::new(Default::default()),
            compiled: BTreeMap::new(),
        }
    }

    /// Asks the scheduler to release the agent's warm sandbox, if any.
    pub(super) fn release_sandbox(&self, agent_id: &str) {
        self.released.lock_anyway().push(agent_id.to_string());
        self.wake.notify_one();
    }

    /// The agents whose warm sandboxes are to be released.
    pub fn take_released(&self) -> Vec<String> {
        std::mem::take(&mut *self.released.lock_anyway())
    }

    /// Where new agents find sandboxes built ahead for them.
    pub fn set_spawn_pool(&self, pool: Arc<dyn SpawnPool>) {
        *self.spawn_pool.lock_anyway() = Some(pool);
    }

    pub(super) fn spawn_pool(&self) -> Option<Arc<dyn SpawnPool>> {
        self.spawn_pool.lock_anyway().clone()
    }

    /// Where to announce agents made or removed (the daemon's socket manager).
    pub fn set_events(&self, tx: tokio::sync::mpsc::UnboundedSender<AgentEvent>) {
        *self.events.lock_anyway() = Some(tx);
    }

    /// An agent's socket bound now, when a daemon serves the sockets
    /// (crate::sockets: bound before the agent is announced), unless this
    /// daemon serves it already (none then: a live socket is never
    /// replaced).
    pub(crate) fn bind_socket_if_served(
        &self,
        agent_id: &str,
    ) -> Result<Option<std::os::unix::net::UnixListener>, BrokerError> {
        if self.events.lock_anyway().is_none() {
            return Ok(None);
        }
        if !self.serving.lock_anyway().insert(agent_id.to_owned()) {
            return Ok(None);
        }
        let path = self.socket_path(agent_id);
        crate::sockets::bind_agent_socket(&path)
            .map(Some)
            .map_err(|e| {
                self.serving.lock_anyway().remove(agent_id);
                BrokerError::Io(format!("bind {}", path.display()), e)
            })
    }

    /// Records that this daemon serves the agent's socket, bound apart
    /// (at start, or ahead by the warm pool).
    pub fn mark_serving(&self, agent_id: &str) {
        self.serving.lock_anyway().insert(agent_id.to_owned());
    }

    pub(super) fn announce(&self, event: AgentEvent) {
        if let AgentEvent::Removed(id) | AgentEvent::Released(id) = &event {
            self.serving.lock_anyway().remove(id);
        }
        if let Some(tx) = self.events.lock_anyway().as_ref() {
            let _ = tx.send(event);
        }
    }

    pub fn roles(&self) -> &Roles {
        &self.roles
    }

    pub(super) fn store(&self) -> MutexGuard<'_, Store> {
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

    /// Whether `name` is a built-in tool the agent's role sees.
    pub(crate) fn sees_builtin(&self, agent: &Agent, name: &str) -> bool {
        self.visible
            .get(&agent.role)
            .is_some_and(|tools| tools.contains(&name))
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Where the daemon's sockets live: the runtime directory, else the
    /// state directory.
    pub fn runtime_dir(&self) -> &Path {
        self.runtime_dir.as_deref().unwrap_or(&self.state_dir)
    }

    /// Puts the control socket and the agents' sockets in `dir`.
    pub fn set_runtime_dir(&mut self, dir: PathBuf) {
        self.runtime_dir = Some(dir);
    }

    /// Where an agent's socket lives.
    pub fn socket_path(&self, id: &str) -> PathBuf {
        self.runtime_dir()
            .join("agents")
            .join(id)
            .join("broker.sock")
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
