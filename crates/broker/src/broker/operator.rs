//! The operator's requests: agents created, removed, messaged,
//! suspended, resumed, killed.

use super::*;
use crate::store::{AgentStart, AgentState, MessageKind, StoredState};
use substrat_policy::workspace_risk::workspace_risks_here;

impl Broker {
    pub fn create_agent(&self, mut request: NewAgent) -> Result<Agent, CreateError> {
        if let Some((code, message)) = self.refusal_of(&request)? {
            return Err(CreateError::Refused(code, message));
        }
        // None named: the role's default, if it has one.
        if request.model.is_none() {
            request.model = self
                .roles
                .get(&request.role)
                .and_then(|r| r.policy.model.default.clone());
        }
        // Where it runs (crate::placement): here, or another daemon of
        // the database with a free slot that reaches its workspace.
        // The CLI judged: one naming none runs this daemon's default.
        let provider = request.provider.clone().or_else(|| self.default_provider());
        let plan = self
            .plan_placement(
                request.workspace.as_deref(),
                &request.role,
                provider.as_deref(),
            )
            .map_err(CreateError::Broker)?;
        let stays = plan.as_ref().is_none_or(|p| p.here);
        let (id, reserved_listener) = self.reserve(&request, stays);
        let agent = Agent {
            id,
            name: request.name.clone(),
            role: request.role.clone(),
            parent_id: request.parent.as_ref().map(|p| p.id.clone()),
            workspace: request.workspace.clone(),
            depth: request.parent.as_ref().map_or(0, |p| p.depth + 1),
            created_at: now_ms(),
            model: request.model.clone(),
            // Placed elsewhere, it names the CLI it was judged with:
            // that daemon's default may be another.
            provider: if stays {
                request.provider.clone()
            } else {
                provider
            },
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
        // Bound before it is stored when it stays (its first turn may be
        // claimed at once); a daemon it is placed on binds it there.
        let mut listener = match reserved_listener {
            Some(listener) => {
                if listener.is_some() {
                    self.mark_serving(&agent.id);
                }
                listener
            }
            None if stays => self.bind_socket_if_served(&agent.id)?,
            None => None,
        };
        let runs_on = match self.store_new_agent(&agent, &request, from, plan.as_ref()) {
            Ok(daemon) => daemon,
            Err(e) => {
                if let Some(pool) = self.spawn_pool() {
                    pool.forget(&agent.id);
                }
                self.serving.lock_anyway().remove(&agent.id);
                let _ = std::fs::remove_dir_all(self.state_dir.join("agents").join(&agent.id));
                if let Some(dir) = self.socket_path(&agent.id).parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(e);
            }
        };
        if runs_on != self.daemon_id() {
            tracing::info!(agent = %agent.name, daemon = %runs_on, "agent placed on another daemon");
        } else if !stays {
            // The daemon chosen was full or silent under its lock: it
            // stays here after all.
            listener = self.bind_socket_if_served(&agent.id)?;
        }
        if let Some(pool) = self.spawn_pool() {
            pool.stored(&agent.id);
        }
        if let Some(listener) = listener {
            self.announce(AgentEvent::Created(agent.clone(), listener));
        }
        self.wake.notify_one();
        Ok(agent)
    }

    /// A sandbox built ahead for an agent of this kind, for one that stays
    /// here: the new agent takes its reserved id (and socket), and its
    /// first turn is warm. Else a new id.
    fn reserve(
        &self,
        request: &NewAgent,
        stays: bool,
    ) -> (String, Option<Option<std::os::unix::net::UnixListener>>) {
        let reserved = self.spawn_pool().filter(|_| stays).and_then(|pool| {
            pool.claim(&PoolWanted {
                role: &request.role,
                workspace: request.workspace.as_deref(),
                provider: request.provider.as_deref(),
                model: request.model.as_deref(),
            })
        });
        match reserved {
            Some(Reserved { id, listener }) => (id, Some(listener)),
            None => (uuid::Uuid::new_v4().to_string(), None),
        }
    }

    /// The new agent, its persona, role arguments and first prompt, stored
    /// at once (all or none).
    fn store_new_agent(
        &self,
        agent: &Agent,
        request: &NewAgent,
        from: Sender<'_>,
        placement: Option<&crate::placement::Plan>,
    ) -> Result<String, CreateError> {
        let role_args = (!request.role_args.is_empty())
            .then(|| serde_json::to_string(&request.role_args).unwrap_or_default());
        // The instructions are the first turn's prompt.
        let first = request.instructions.as_deref().map(|text| NewMessage {
            from,
            to_id: &agent.id,
            text,
            sync: false,
            kind: MessageKind::Instructions,
            delivery: Delivery::Turn,
            thread: None,
            dedupe_key: None,
        });
        let start = AgentStart {
            created_by: request.created_by.as_deref(),
            persona: request.persona.as_deref(),
            role_args: role_args.as_deref(),
            first,
            placement,
        };
        self.store()
            .insert_new_agent(agent, &start)
            .map_err(|e| CreateError::Broker(e.into()))
    }

    /// Why `request` may not be made: a bad name, an unknown provider or
    /// role, a workspace the role may not have, a name taken.
    fn refusal_of(
        &self,
        request: &NewAgent,
    ) -> Result<Option<(&'static str, String)>, CreateError> {
        let refuse = |code: &'static str, message: String| Ok(Some((code, message)));
        let uncarried = crate::carried::spawn_refusal(
            request.instructions.as_deref(),
            request.model.as_deref(),
            &request.role_args,
        )
        .or_else(|| {
            let persona = request.persona.as_deref()?;
            crate::carried::refusal("the role's system prompt", persona)
        });
        if let Some(message) = uncarried {
            return refuse(crate::carried::CODE, message);
        }
        if !valid_name(&request.name) {
            return refuse(
                "invalid_name",
                format!(
                    "`{}` is not a valid agent name (1-64 of letters, digits, `-`, `_`, `.`)",
                    request.name
                ),
            );
        }
        if let Some(provider) = &request.provider {
            let known = self
                .providers
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if !known.contains(provider) {
                let known = if known.is_empty() {
                    "none: this daemon runs no turns".to_string()
                } else {
                    known.join(", ")
                };
                return refuse(
                    "unknown_provider",
                    format!("no provider `{provider}` on this daemon (known: {known})"),
                );
            }
        }
        if !self.roles.contains_key(&request.role) {
            let known: Vec<&str> = self.roles.keys().map(String::as_str).collect();
            return refuse(
                "unknown_role",
                format!("no role `{}` (known: {})", request.role, known.join(", ")),
            );
        }
        if let (Some(workspace), Some(role)) = (&request.workspace, self.roles.get(&request.role))
            && let Some(message) = workspace_refusal(Path::new(workspace), role)
        {
            return refuse("workspace_risk", message);
        }
        if let (Some(model), Some(role)) = (&request.model, self.roles.get(&request.role))
            && let Some((code, message)) = model_refusal(model, &request.role, role)
        {
            return refuse(code, message);
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
        Ok(None)
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
        self.release_sandbox(&agent.id);
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
            kind: MessageKind::Operator,
            delivery: Delivery::Turn,
            thread: None,
            dedupe_key: None,
        };
        let id = self.store().send(&[message], depth)?.pop().flatten();
        self.wake.notify_one();
        Ok(id)
    }

    /// No new turns; a running one is stopped and queued again.
    pub fn suspend(&self, agent: &Agent) -> Result<bool, BrokerError> {
        self.store()
            .set_agent_state(&agent.id, StoredState::Suspended, None)?;
        self.release_sandbox(&agent.id);
        Ok(self.stop_turn(&agent.id, StopReason::Suspend))
    }

    /// Back to active; with nothing queued, a turn that continues the
    /// session (`--resume`) is queued. Returns whether that turn was queued.
    pub fn resume(&self, agent: &Agent) -> Result<bool, CreateError> {
        let store = self.store();
        let status = store.agent_status(&agent.id).map_err(BrokerError::from)?;
        if !matches!(status.state, AgentState::Suspended | AgentState::Failed) {
            return Err(CreateError::Refused(
                "not_stopped",
                format!(
                    "`{}` is {}; only a suspended or failed agent can be resumed",
                    agent.name,
                    status.state.as_str()
                ),
            ));
        }
        store
            .set_agent_state(&agent.id, StoredState::Active, None)
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
            .set_agent_state(&agent.id, StoredState::Failed, Some(reason))?;
        self.release_sandbox(&agent.id);
        Ok(self.stop_turn(&agent.id, StopReason::Kill))
    }
}

#[derive(Debug, Default)]
pub struct NewAgent {
    pub name: String,
    pub role: String,
    pub parent: Option<Agent>,
    pub workspace: Option<String>,
    pub model: Option<String>,
    /// The agent CLI its turns run; none: the daemon's default.
    pub provider: Option<String>,
    /// The first turn's prompt; none: registered only, no turn queued.
    pub instructions: Option<String>,
    /// The dedupe key of the spawn_agent call making it.
    pub created_by: Option<String>,
    /// Its role resolved to a system prompt (a script role with the
    /// operator's arguments); none: resolved at its first turn.
    pub persona: Option<String>,
    /// Role arguments for that first-turn resolve (spawn_agent's).
    pub role_args: crate::roles::RoleArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{1}")]
    Refused(&'static str, String),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Why an agent of `role` may not use `model`: not a model name, or a
/// name outside the role's `model.models` (named in the message).
pub(crate) fn model_refusal(
    model: &str,
    role_name: &str,
    role: &LoadedPolicy,
) -> Option<(&'static str, String)> {
    use substrat_policy::model::model_name_problem;
    if let Some(problem) = model_name_problem(model) {
        return Some((
            "invalid_model",
            format!("`{}`: {problem}", model.escape_debug()),
        ));
    }
    let budget = &role.policy.model;
    if budget.allows_model(model) {
        return None;
    }
    let allowed = budget.models.as_deref().unwrap_or_default();
    let allowed: Vec<String> = allowed.iter().map(|p| format!("`{p}`")).collect();
    Some((
        "model_not_allowed",
        format!(
            "the role `{role_name}` does not allow the model `{model}` (its model.models: {})",
            allowed.join(", ")
        ),
    ))
}

/// Why an agent may not work in `workspace`: it exposes more than a
/// project (`/`, a home directory, credentials) and its role does not
/// allow that (`filesystem.allow_workspace_risk`).
pub(crate) fn workspace_refusal(workspace: &Path, role: &LoadedPolicy) -> Option<String> {
    let risks = workspace_risks_here(workspace);
    if risks.is_empty() || role.policy.filesystem.allow_workspace_risk {
        return None;
    }
    let reasons: Vec<String> = risks.iter().map(ToString::to_string).collect();
    Some(format!(
        "workspace {} exposes more than a project ({}); use a project directory, or a role with filesystem.allow_workspace_risk",
        workspace.display(),
        reasons.join("; ")
    ))
}

pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "operator"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.')
}

impl Broker {
    /// A client certificate for `agent`'s relays on other hosts, issued by
    /// the daemon's authority (made on first use) and recorded; with
    /// `replace`, the agent's earlier certificates are revoked.
    pub fn agent_credentials(
        &self,
        agent: &Agent,
        replace: bool,
    ) -> Result<crate::tls::AgentCredentials, BrokerError> {
        let tls = |e: crate::tls::TlsError| BrokerError::Invalid(e.to_string());
        let authority = self.authority().map_err(tls)?;
        let credentials = authority.issue_agent(&agent.id).map_err(tls)?;
        let recorded = self.store().insert_agent_cert(crate::store::NewCert {
            agent_id: &agent.id,
            fingerprint: &credentials.fingerprint,
            authority: authority.issuing_fingerprint(),
            replace,
        })?;
        if !recorded {
            return Err(BrokerError::Invalid(format!(
                "agent `{}` was removed (or the authority retired) meanwhile: no certificate issued",
                agent.name
            )));
        }
        Ok(credentials)
    }

    /// The authorities relays are trusted by and issued from: the team's
    /// (read from the database each time, so a rotation by any daemon is
    /// seen) with a team key, else the daemon's own, made on first use.
    pub fn authority(&self) -> Result<Arc<crate::tls::Authority>, crate::tls::TlsError> {
        let team_key = self.team_key.lock_anyway().clone();
        if let Some(key) = team_key {
            let loaded = crate::team_ca::load_or_create(&self.store(), &key, &self.state_dir)
                .map_err(|e| crate::tls::TlsError::Invalid(e.to_string()))?;
            let loaded = Arc::new(loaded);
            *self.authority.lock_anyway() = Some(loaded.clone());
            return Ok(loaded);
        }
        let mut slot = self.authority.lock_anyway();
        if let Some(authority) = slot.as_ref() {
            return Ok(authority.clone());
        }
        let authority = Arc::new(crate::tls::Authority::open_or_create(&self.state_dir)?);
        *slot = Some(authority.clone());
        Ok(authority)
    }

    /// Records where relays reach this daemon, for the team.
    pub fn record_tls_address(&self, address: Option<&str>) -> Result<(), BrokerError> {
        Ok(self.store().set_tls_address(address)?)
    }

    /// Makes the team's authority the one relays are trusted by.
    pub fn set_team_key(&self, key: Arc<crate::team_key::TeamKey>) {
        *self.team_key.lock_anyway() = Some(key);
    }

    /// What the team's authorities are now (generation, fingerprint and
    /// state of each), without opening them: cheap enough to poll. None
    /// without a team key.
    pub fn team_authorities(
        &self,
    ) -> Result<Option<Vec<crate::store::StoredAuthority>>, BrokerError> {
        if self.team_key.lock_anyway().is_none() {
            return Ok(None);
        }
        Ok(Some(self.store().team_authorities()?))
    }

    /// `team ca rotate`: a new current authority; the others stay trusted.
    pub fn rotate_team_authority(&self) -> Result<i64, BrokerError> {
        let key = self
            .team_key
            .lock_anyway()
            .clone()
            .ok_or_else(no_team_key)?;
        crate::team_ca::rotate(&self.store(), &key).map_err(|e| BrokerError::Invalid(e.to_string()))
    }

    /// `team ca retire`: every authority but the current one refused from
    /// now on, the certificates they issued revoked.
    pub fn retire_team_authorities(&self) -> Result<(usize, usize), BrokerError> {
        let key = self
            .team_key
            .lock_anyway()
            .clone()
            .ok_or_else(no_team_key)?;
        crate::team_ca::retire(&self.store(), &key, &self.state_dir)
            .map_err(|e| BrokerError::Invalid(e.to_string()))
    }

    /// The agent a relay's certificate speaks for (None: revoked, or never
    /// issued here; an agent removed a moment ago is refused too).
    pub fn agent_of_certificate(&self, fingerprint: &str) -> Option<String> {
        let id = self.store().agent_of_cert(fingerprint).ok().flatten()?;
        let removed = self.removed.read().map_or(true, |r| r.contains(&id));
        (!removed).then_some(id)
    }
}

fn no_team_key() -> BrokerError {
    BrokerError::Invalid("this daemon has no team authority: start it with --team-key FILE".into())
}
