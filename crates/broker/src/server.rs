//! The MCP side of one agent connection, served with rmcp. One handler per
//! connection, carrying the identity of the socket it came in on; every
//! call goes to the broker's decision path.

use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, InitializeResult, ListPromptsResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage, Role,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use serde_json::Value;

use crate::broker::{Broker, Session, ToolOutcome};
use crate::locks::LockAnyway;
use crate::tools;
use crate::upstream::registry::CallLink;
use crate::upstream::relay::{ListenerId, ProgressTarget};

#[derive(Debug)]
pub struct AgentHandler {
    broker: Arc<Broker>,
    agent_id: String,
    session: Mutex<Session>,
    /// Its place among the agents that hear upstream notifications.
    listener: ListenerId,
}

impl Drop for AgentHandler {
    fn drop(&mut self) {
        self.broker.upstreams().relay.leave(&self.listener);
    }
}

impl AgentHandler {
    pub fn new(broker: Arc<Broker>, agent_id: String) -> Self {
        let session = Mutex::new(Session::new(agent_id.clone()));
        Self {
            broker,
            agent_id,
            session,
            listener: ListenerId::default(),
        }
    }

    fn agent(&self) -> Result<crate::store::Agent, McpError> {
        match self.broker.agent(&self.agent_id) {
            Ok(Some(agent)) => Ok(agent),
            Ok(None) => Err(McpError::invalid_request(
                "this agent has been removed",
                None,
            )),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }
}

fn tool_definition(name: &str) -> Option<Tool> {
    let def = tools::builtin(name)?;
    let schema = match def.schema {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    Some(Tool::new(def.name, def.description, Arc::new(schema)))
}

/// An upstream tool under its menu name, with everything else its server
/// listed: title, description, input and output schemas, annotations,
/// icons, `_meta`.
fn upstream_definition(name: &str, tool: crate::upstream::menu::UpstreamTool) -> Tool {
    let schema = match tool.input_schema {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    let mut definition = Tool::new(name.to_string(), tool.description, Arc::new(schema));
    // A tool listed without a description is relayed without one.
    if definition.description.as_deref() == Some("") {
        definition.description = None;
    }
    definition.annotations = serde_json::from_value(tool.annotations).ok();
    definition.title = tool.title;
    definition.output_schema = tool.output_schema.map(Arc::new);
    definition.icons = tool.icons;
    definition.meta = tool.meta;
    definition
}

impl ServerHandler for AgentHandler {
    #[allow(deprecated)] // rmcp marks MCP logging deprecated (SEP-2577).
    fn get_info(&self) -> ServerConfig {
        // Tools change with the upstream servers' (list_changed); their
        // log messages are relayed (logging).
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .build();
        let mut info = InitializeResult::new(capabilities);
        info.server_info = Implementation::new("substrat-broker", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Tool calls return at once with a status. Replies to sync messages arrive as your next message; do not poll.".into(),
        );
        info
    }

    /// From now on the agent hears its menu's changes and the log
    /// messages of the servers it sees.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok(agent) = self.agent() {
            let relay = &self.broker.upstreams().relay;
            relay.listen(&self.listener, agent.role, context.peer);
        }
    }

    #[allow(deprecated)] // rmcp marks MCP logging deprecated (SEP-2577).
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let relay = &self.broker.upstreams().relay;
        relay.set_level(&self.listener, request.level);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let agent = self.agent()?;
        let mut upstream: std::collections::HashMap<String, crate::upstream::menu::UpstreamTool> =
            self.broker
                .upstream_definitions(&agent)
                .into_iter()
                .collect();
        // The menu's order: built-ins, then upstream tools (namespaced).
        let tools = self
            .broker
            .menu(&agent)
            .entries
            .iter()
            .filter_map(|entry| match &entry.server {
                None => tool_definition(&entry.name),
                Some(_) => upstream
                    .remove(&entry.name)
                    .map(|t| upstream_definition(&entry.name, t)),
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = request.arguments.unwrap_or_default();
        // A lookup in the fixed list: no definition is built on the call path.
        let outcome = if tools::BUILTIN_TOOLS.contains(&request.name.as_ref()) {
            let mut session = self.session.lock_anyway();
            self.broker
                .call_tool(&mut session, &request.name, Value::Object(arguments))
        } else {
            // The agent's cancellation and progress token go upstream.
            let link = CallLink {
                cancelled: context.ct.cancelled(),
                progress: context
                    .meta
                    .get_progress_token()
                    .map(|token| ProgressTarget {
                        peer: context.peer.clone(),
                        token,
                    }),
            };
            self.broker
                .call_upstream(&self.session, &request.name, arguments, link)
                .await
        };
        match outcome {
            ToolOutcome::Result { body, is_error } => {
                let text = match body {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                let content = vec![ContentBlock::text(text)];
                let result = if is_error {
                    CallToolResult::error(content)
                } else {
                    CallToolResult::success(content)
                };
                Ok(result.into())
            }
            ToolOutcome::Relayed(result) => Ok((*result).into()),
            // The same answer for a tool that does not exist and one out of scope.
            ToolOutcome::UnknownTool => Err(McpError::invalid_params(
                format!("unknown tool: {}", request.name),
                None,
            )),
            ToolOutcome::InvalidArguments(message) => Err(McpError::invalid_params(message, None)),
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let prompts = self
            .broker
            .role_infos()
            .into_iter()
            .map(|info| {
                let arguments = (!info.arguments.is_empty()).then(|| {
                    info.arguments
                        .iter()
                        .map(|a| {
                            PromptArgument::new(a.name.clone())
                                .with_description(a.description.clone())
                                .with_required(a.required)
                        })
                        .collect()
                });
                // A role without a description of its own still says what
                // the prompt is (clients list prompts by it).
                let description = if info.description.is_empty() {
                    format!(
                        "The persona and opening messages of the role `{}`.",
                        info.name
                    )
                } else {
                    info.description
                };
                Prompt::new(info.name, Some(description), arguments)
            })
            .collect();
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    /// The role resolved with the request's arguments (off this runtime; a
    /// script's in an evaluator process killed at its time limit):
    /// its system prompt and the tools in scope as one user message, then
    /// its opening messages. What goes wrong is an invalid-params error
    /// saying why.
    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let name = request.name.clone();
        let Some(info) = self.broker.role_info(&name) else {
            return Err(McpError::invalid_params(
                format!("unknown prompt: {name}"),
                None,
            ));
        };
        let args = prompt_args(request.arguments)?;
        let caller = self.agent()?;
        let broker = self.broker.clone();
        let role = name.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            broker.resolve_role(&role, args, Some(caller))
        })
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?
        .map_err(|e| {
            // Over the agent's evaluations: the broker's limited shape.
            let data = match &e {
                crate::roles::RoleError::Limited { retry_after_ms, .. } => Some(
                    serde_json::json!({"status": "rate_limited", "retry_after_ms": retry_after_ms}),
                ),
                _ => None,
            };
            McpError::invalid_params(e.to_string(), data)
        })?;
        let menu = self.broker.menu_for_role(&name);
        let scoped = menu
            .entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "{}\n\nTools in scope for this role: {scoped}.",
            resolved.system.trim()
        );
        let mut messages = vec![PromptMessage::new_text(Role::User, text)];
        for m in resolved.messages {
            // MCP prompts carry user and assistant messages only.
            let (role, content) = match m.role {
                crate::roles::MessageRole::Assistant => (Role::Assistant, m.content),
                crate::roles::MessageRole::User => (Role::User, m.content),
                crate::roles::MessageRole::System => {
                    (Role::User, format!("[system] {}", m.content))
                }
            };
            messages.push(PromptMessage::new_text(role, content));
        }
        let mut result = GetPromptResult::new(messages);
        if !info.description.is_empty() {
            result = result.with_description(info.description);
        }
        Ok(GetPromptResponse::Complete(result))
    }
}

/// A prompt's arguments: MCP gives strings; anything else is refused.
fn prompt_args(
    given: Option<serde_json::Map<String, Value>>,
) -> Result<crate::roles::RoleArgs, McpError> {
    let mut args = crate::roles::RoleArgs::new();
    for (name, value) in given.unwrap_or_default() {
        let Value::String(text) = value else {
            return Err(McpError::invalid_params(
                format!("prompt argument `{name}` must be a string"),
                None,
            ));
        };
        args.insert(name, text);
    }
    Ok(args)
}
