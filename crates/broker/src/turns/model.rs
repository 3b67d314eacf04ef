//! The model gateway as turns use it: each agent whose CLI talks to a
//! model gets its own gateway socket (served from its first such turn on)
//! and placeholder key; the real keys stay in the daemon. The tokens each
//! agent used are kept in the store.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use substrat_gateway::{Api, Budget, Gateway, Refusal, Scope, TeamMeter, Usage, UsageSink};
use substrat_provider::ModelApi;

use crate::broker::Broker;

/// The gateway's port inside every sandbox; must be the sandbox's
/// (`substrat_sandbox::plan::GATEWAY_PORT`, checked by a test of the CLI).
pub const GATEWAY_PORT: u16 = 3129;
/// Where an agent's gateway socket is bound inside its sandbox.
pub const GATEWAY_SOCKET_INSIDE: &str = "/run/substrat/gateway.sock";

/// An agent's way to its model: the socket to bind in, the key its CLI
/// presents.
#[derive(Debug, Clone)]
pub struct AgentAccess {
    pub socket: PathBuf,
    pub placeholder: String,
}

/// Where the agents' gateway sockets are, in the state directory.
pub(super) fn gateway_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("gateway")
}

/// An agent's gateway socket in `dir` (`gateway_dir`).
pub(super) fn gateway_socket(dir: &Path, agent_id: &str) -> PathBuf {
    dir.join(format!("{agent_id}.sock"))
}

#[derive(Debug)]
pub struct ModelAccessPoints {
    gateway: Arc<Gateway>,
    /// STATE/gateway: one socket per agent, mode 0600 in a 0700 directory.
    dir: PathBuf,
    served: Mutex<HashMap<String, AgentAccess>>,
    /// Each served socket's task, to end it when the agent is forgotten.
    serving: Mutex<HashMap<String, tokio::task::AbortHandle>>,
}

impl ModelAccessPoints {
    pub fn new(gateway: Arc<Gateway>, dir: PathBuf) -> Self {
        Self {
            gateway,
            dir,
            served: Mutex::new(HashMap::new()),
            serving: Mutex::new(HashMap::new()),
        }
    }

    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// The agent's socket and placeholder; the socket is made and served
    /// on first use, from within the daemon's runtime, with its role's
    /// budget.
    pub fn for_agent(
        &self,
        agent_id: &str,
        api: ModelApi,
        budget: &substrat_policy::model::ModelBudget,
    ) -> std::io::Result<AgentAccess> {
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(access) = served.get(agent_id) {
            return Ok(access.clone());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let socket = gateway_socket(&self.dir, agent_id);
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        let access = substrat_gateway::ModelAccess {
            api: api_of(api),
            budget: substrat_gateway::Budget {
                requests_per_minute: budget.requests_per_minute,
                tokens_per_turn: budget.tokens_per_turn,
                tokens_per_day: budget.tokens_per_day,
                tokens_per_request: budget.tokens_per_request,
                concurrent_requests: budget.concurrent_requests,
            },
            hosted_tools: budget.hosted_tools.iter().copied().collect(),
            models: budget.models.clone(),
        };
        let placeholder = self.gateway.register(agent_id, access);
        let task = tokio::spawn(
            self.gateway
                .clone()
                .serve_agent(listener, agent_id.to_string()),
        );
        self.serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent_id.to_string(), task.abort_handle());
        let access = AgentAccess {
            socket,
            placeholder,
        };
        served.insert(agent_id.to_string(), access.clone());
        Ok(access)
    }

    /// An id that will never be an agent's (a warm pool's reservation
    /// nobody took): its socket no longer served, and removed.
    pub fn forget(&self, agent_id: &str) {
        let access = self
            .served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent_id);
        let task = self
            .serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent_id);
        if let Some(task) = task {
            task.abort();
        }
        self.gateway.forget(agent_id);
        if let Some(access) = access {
            let _ = std::fs::remove_file(access.socket);
        }
    }
}

/// The gateway's API for a provider's.
pub fn api_of(api: ModelApi) -> Api {
    match api {
        ModelApi::Anthropic => Api::Anthropic,
        ModelApi::OpenAi => Api::OpenAi,
        ModelApi::Gemini => Api::Gemini,
    }
}

/// Usage goes to the store, per agent, day and API.
#[derive(Debug)]
pub struct StoreUsage(pub Arc<Broker>);

impl UsageSink for StoreUsage {
    fn record(&self, agent_id: &str, api: Api, usage: &Usage) {
        let result = self.0.store().add_model_usage(
            agent_id,
            api.as_str(),
            usage.input_tokens,
            usage.output_tokens,
        );
        if let Err(e) = result {
            tracing::error!(agent = agent_id, error = %e, "cannot record model usage");
        }
    }

    fn budget_refused(&self, _agent_id: &str, refusal: &Refusal) {
        let (scope, limit) = substrat_gateway::problems::refusal_labels(refusal);
        self.0.metrics.budget_refusal(scope, limit);
    }

    fn model_refused(&self, _agent_id: &str) {
        self.0.metrics.budget_refusal("agent", "model");
    }
}

/// How long a request's reservation of the team's day holds at most (a
/// daemon that stops without releasing it holds the room no longer).
const TEAM_HOLD_MS: i64 = 30 * 60 * 1000;

/// The team's budget counted in the state database, which every daemon of
/// the team shares (installed when it is PostgreSQL: several daemons).
#[derive(Debug)]
pub struct StoreTeamMeter(pub Arc<Broker>);

impl TeamMeter for StoreTeamMeter {
    fn admit(&self, team: &Budget) -> Result<(), Refusal> {
        use crate::store::TeamAdmission;
        let admission = self
            .0
            .store()
            .team_admit(team.requests_per_minute, team.tokens_per_day);
        match admission {
            Ok(TeamAdmission::Admitted) => Ok(()),
            Ok(TeamAdmission::MinuteSpent { retry_after_s }) => Err(Refusal::RequestsPerMinute {
                scope: Scope::Team,
                limit: team.requests_per_minute.unwrap_or(0),
                retry_after_s,
            }),
            Ok(TeamAdmission::DaySpent) => Err(Refusal::TokensPerDay {
                scope: Scope::Team,
                limit: team.tokens_per_day.unwrap_or(0),
            }),
            // The agent is told no more than that (not the database's
            // address or error); the daemon's log has the error.
            Err(e) => {
                tracing::error!(error = %e, "cannot check the team's model budget");
                Err(Refusal::Unchecked(
                    "the state database is unavailable".into(),
                ))
            }
        }
    }

    fn reserve(&self, team: &Budget, id: &str, tokens: u64) -> Result<(), Refusal> {
        use crate::store::TeamAdmission;
        let Some(limit) = team.tokens_per_day else {
            return Ok(());
        };
        match self.0.store().team_reserve(limit, id, tokens, TEAM_HOLD_MS) {
            Ok(TeamAdmission::DaySpent) => Err(Refusal::TokensPerDay {
                scope: Scope::Team,
                limit,
            }),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::error!(error = %e, "cannot reserve from the team's model budget");
                Err(Refusal::Unchecked(
                    "the state database is unavailable".into(),
                ))
            }
        }
    }

    fn release(&self, id: &str) {
        // Not released (the database is away): it lapses at its time.
        if let Err(e) = self.0.store().team_release(id) {
            tracing::warn!(error = %e, "cannot release a team model reservation");
        }
    }
}
