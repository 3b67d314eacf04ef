//! Roles resolved to prompts: a policy's static persona, or the script or
//! compiled role registered under its name (`crate::roles`). The team
//! functions a role's `resolve` may call see what the calling agent could
//! see with its own tools.

use super::*;
use crate::roles::{
    Role, RoleArgs, RoleError, RoleInfo, RolePrompt, RoleSource, TeamContext, resolve_on_thread,
};

impl Broker {
    /// Registers a role whose prompt `role` resolves (a script, or a type
    /// an embedding program compiles in); its agents' sandboxes come from
    /// the policy of the same name, which must exist. The tools it declares
    /// narrow the policy's scope (never widen it).
    pub fn register_role(&mut self, role: Arc<dyn Role>) -> Result<(), BrokerError> {
        let name = role.name().to_string();
        if !self.roles.contains_key(&name) {
            return Err(BrokerError::Invalid(format!(
                "role `{name}` has no policy of that name (its agents' sandboxes come from one)"
            )));
        }
        // The stricter of the two scopes: the tools the role declares, as
        // far as its policy allows them (`check` reports the rest, ROL002).
        let declared = role.tools();
        if !declared.is_empty()
            && let Some(loaded) = self.roles.get_mut(&name)
        {
            let kept: Vec<String> = declared
                .into_iter()
                .filter(|t| crate::tools::in_scope(&loaded.policy, t))
                .collect();
            loaded.policy.tools.allow = Some(kept);
            self.visible
                .insert(name.clone(), crate::tools::visible_tools(&loaded.policy));
        }
        self.compiled.insert(name, role);
        Ok(())
    }

    /// Every role, by name: what `prompts/list` and `role list` show.
    pub fn role_infos(&self) -> Vec<RoleInfo> {
        self.roles
            .keys()
            .filter_map(|name| self.role_info(name))
            .collect()
    }

    pub fn role_info(&self, name: &str) -> Option<RoleInfo> {
        let loaded = self.roles.get(name)?;
        Some(match self.compiled.get(name) {
            Some(role) => {
                let source = if loaded.policy.persona.script.is_some() {
                    RoleSource::Lua
                } else {
                    RoleSource::Rust
                };
                crate::roles::resolved_info(role.as_ref(), source)
            }
            None => crate::roles::static_info(name, loaded),
        })
    }

    /// Resolves a role's prompt with `args` for `caller` (none: the
    /// operator). Blocks for at most twice the role's time limit and a
    /// second (a script may wait its time limit for an evaluator): call it
    /// off the async runtime.
    pub fn resolve_role(
        self: &Arc<Self>,
        name: &str,
        args: RoleArgs,
        caller: Option<Agent>,
    ) -> Result<RolePrompt, RoleError> {
        let Some(loaded) = self.roles.get(name) else {
            return Err(RoleError::Invalid {
                role: name.to_string(),
                message: "no such role".into(),
            });
        };
        let Some(role) = self.compiled.get(name) else {
            return crate::roles::static_prompt(name, loaded, &args);
        };
        let timeout = crate::roles::script_limits(&loaded.policy).timeout;
        // An agent's evaluation counts as one of its calls, as a tool call.
        if let Some(caller) = &caller
            && let Some(policy) = self.policy_of(caller)
        {
            match self.take_tokens(caller, "prompts/get", policy, None) {
                Ok(CallCount::Admitted | CallCount::StepLimit) => {}
                Ok(CallCount::RateLimited { retry_after_ms }) => {
                    return Err(RoleError::Limited {
                        role: name.to_string(),
                        retry_after_ms,
                    });
                }
                Err(e) => {
                    return Err(RoleError::Invalid {
                        role: name.to_string(),
                        message: format!("its call could not be counted: {e}"),
                    });
                }
            }
        }
        let agent = caller.as_ref().map(|c| c.id.as_str());
        let _admitted = crate::roles::gate::admit(name, agent, timeout)?;
        let context: Arc<dyn TeamContext> = Arc::new(BrokerTeam {
            broker: self.clone(),
            caller,
        });
        resolve_on_thread(role.clone(), args, context, timeout)
    }

    /// Whether the role's prompt is resolved (a script or compiled role)
    /// rather than read from its policy.
    pub fn is_resolved_role(&self, name: &str) -> bool {
        self.compiled.contains_key(name)
    }

    /// The system prompt kept for the agent, if one was resolved.
    pub fn agent_persona(&self, agent_id: &str) -> Option<String> {
        self.store().agent_persona(agent_id).ok().flatten()
    }

    /// The role arguments its parent gave spawn_agent (JSON), if any.
    pub fn agent_role_args(&self, agent_id: &str) -> Option<String> {
        self.store().agent_role_args(agent_id).ok().flatten()
    }

    /// Keeps the agent's resolved system prompt (a failure to write it
    /// only means it is resolved again next turn).
    pub fn keep_agent_persona(&self, agent_id: &str, persona: &str) {
        if let Err(e) = self.store().set_agent_persona(agent_id, persona) {
            tracing::warn!(agent = agent_id, error = %e, "cannot keep the agent's resolved persona");
        }
    }
}

/// The team as a role's `resolve` sees it: for an agent, only what its
/// own tools would show it (the names of the agents it may message; its
/// inbox if it has `check_inbox`; its subordinates if it has
/// `inspect_agent`); for the operator, every agent and no inbox.
struct BrokerTeam {
    broker: Arc<Broker>,
    caller: Option<Agent>,
}

/// The most agents `context.team()` lists.
const TEAM_LIST_MAX: usize = 1000;

impl BrokerTeam {
    /// Whether the caller (an agent) has this tool in its scope; the
    /// operator has every one.
    fn may_use(&self, tool: &str) -> bool {
        match &self.caller {
            None => true,
            Some(caller) => self
                .broker
                .policy_of(caller)
                .is_some_and(|p| crate::tools::in_scope(&p.policy, tool)),
        }
    }
}

impl TeamContext for BrokerTeam {
    fn team(&self) -> Value {
        let agents = self.broker.store().agents().unwrap_or_default();
        let seen = agents
            .iter()
            .filter(|a| match &self.caller {
                Some(caller) => Broker::may_message(caller, a),
                None => true,
            })
            .take(TEAM_LIST_MAX)
            .map(|a| match &self.caller {
                // An agent learns names, as messaging teaches them.
                Some(_) => json!({"name": a.name}),
                None => {
                    let state = self.broker.status(a).ok().map(|s| s.state);
                    json!({"name": a.name, "role": a.role, "state": state})
                }
            })
            .collect();
        Value::Array(seen)
    }

    fn inbox(&self) -> Value {
        let Some(caller) = &self.caller else {
            return json!({"waiting": 0});
        };
        if !self.may_use("check_inbox") {
            return Value::Null;
        }
        let waiting = self.broker.store().queued_count(&caller.id).unwrap_or(0);
        json!({"waiting": waiting})
    }

    fn inspect(&self, name: &str) -> Option<Value> {
        if !self.may_use("inspect_agent") {
            return None;
        }
        let target = self.broker.agent_named(name).ok()??;
        if let Some(caller) = &self.caller
            && !self.broker.is_subordinate(caller, &target).ok()?
        {
            return None;
        }
        self.broker.activity(&target).ok()
    }
}
