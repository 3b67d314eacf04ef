//! Upstream tools: the menu each role sees, calls to upstream servers,
//! pinned definitions.

use super::*;
use crate::upstream::registry::CallLink;

impl Broker {
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
        link: CallLink<impl std::future::Future<Output = ()>>,
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
                                Some(Refusal::OutOfScope),
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
        let (outcome, decision, reason) =
            match self.upstreams.call_linked(&server, &tool, args, link).await {
                Ok(mut result) => {
                    crate::limits::cut_result_lists(&mut result, policy.policy.mcp.list_entries());
                    let structured = result.structured_content.is_some();
                    let outcome = self.limit_output(ToolOutcome::Relayed(Box::new(result)), policy);
                    (
                        self.schema_kept(outcome, structured, &server, &tool),
                        Decision::Allowed,
                        None,
                    )
                }
                Err(e) => {
                    let text = self.upstreams.redact(&server, e.to_string());
                    (
                        error("upstream", text.clone()),
                        Decision::Denied,
                        Some(Refusal::Upstream(text)),
                    )
                }
            };
        self.record(&agent, name, start, outcome, decision, reason)
    }

    /// A result whose structured content the output limit left out, of a
    /// tool with an output schema, is an error result: a client that
    /// checks results against the schema would otherwise refuse it.
    fn schema_kept(
        &self,
        outcome: ToolOutcome,
        structured: bool,
        server: &str,
        tool: &str,
    ) -> ToolOutcome {
        match outcome {
            ToolOutcome::Relayed(mut result)
                if structured
                    && result.structured_content.is_none()
                    && result.is_error != Some(true)
                    && self.upstreams.has_output_schema(server, tool) =>
            {
                result.is_error = Some(true);
                ToolOutcome::Relayed(result)
            }
            outcome => outcome,
        }
    }

    /// Checks a tool's definition against its pin; a quarantine is audited.
    pub fn check_pin(
        &self,
        server: &str,
        position: usize,
        tool: &UpstreamTool,
    ) -> Result<PinState, BrokerError> {
        let (hash, definition, flagged) = registry::pin_inputs(tool);
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

    /// `tools enable|disable SERVER`: switched at once and remembered
    /// across restarts of the daemon; false when it was so already.
    pub fn switch_server(&self, server: &str, on: bool) -> Result<bool, SwitchError> {
        let changed = self.upstreams.switch(server, on)?;
        self.store()
            .set_server_enabled(server, on)
            .map_err(BrokerError::from)?;
        let verb = if on { "enabled" } else { "disabled" };
        self.audit.record(&Entry {
            ts_ms: now_ms(),
            agent_id: "",
            agent: "(operator)",
            tool: server,
            decision: Decision::Allowed,
            reason: &format!("server {verb}"),
            latency_us: 0,
        });
        Ok(changed)
    }

    /// The switches an operator made in earlier runs, over the servers
    /// file's `enabled` (before the servers start). A switch of a server no
    /// longer in the file, or one that would disable a core server, is
    /// left alone with a warning.
    pub fn apply_server_switches(&self) -> Result<(), BrokerError> {
        for (server, on) in self.store().server_switches()? {
            if let Err(e) = self.upstreams.switch(&server, on) {
                tracing::warn!(%server, error = %e, "a remembered `tools enable|disable` is not applied");
            }
        }
        Ok(())
    }

    pub fn pins(&self) -> Result<Vec<crate::store::PinRow>, BrokerError> {
        Ok(self.store().pins()?)
    }
}

/// Why a server was not switched.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error(transparent)]
    Upstream(#[from] crate::upstream::error::UpstreamError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}
