//! The MCP side of one agent connection, served with rmcp. One handler per
//! connection, carrying the identity of the socket it came in on; every
//! call goes to the broker's decision path.

use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, InitializeResult, ListPromptsResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptMessage, Role, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::Value;

use crate::broker::{Broker, Session, ToolOutcome};
use crate::locks::LockAnyway;
use crate::tools;

#[derive(Debug)]
pub struct AgentHandler {
    broker: Arc<Broker>,
    agent_id: String,
    session: Mutex<Session>,
}

impl AgentHandler {
    pub fn new(broker: Arc<Broker>, agent_id: String) -> Self {
        let session = Mutex::new(Session::new(agent_id.clone()));
        Self {
            broker,
            agent_id,
            session,
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

/// An upstream tool under its menu name, with its own description, input
/// schema and annotations.
fn upstream_definition(name: &str, tool: crate::upstream::menu::UpstreamTool) -> Tool {
    let schema = match tool.input_schema {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    let mut definition = Tool::new(name.to_string(), tool.description, Arc::new(schema));
    definition.annotations = serde_json::from_value(tool.annotations).ok();
    definition
}

impl ServerHandler for AgentHandler {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .build();
        let mut info = InitializeResult::new(capabilities);
        info.server_info = Implementation::new("substrat-broker", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Tool calls return at once with a status. Replies to sync messages arrive as your next message; do not poll.".into(),
        );
        info
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = request.arguments.unwrap_or_default();
        // A lookup in the fixed list: no definition is built on the call path.
        let outcome = if tools::BUILTIN_TOOLS.contains(&request.name.as_ref()) {
            let mut session = self.session.lock_anyway();
            self.broker
                .call_tool(&mut session, &request.name, Value::Object(arguments))
        } else {
            self.broker
                .call_upstream(&self.session, &request.name, arguments)
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
            .roles()
            .iter()
            .map(|(name, policy)| {
                Prompt::new(
                    name.clone(),
                    policy.policy.persona.description.clone(),
                    None,
                )
            })
            .collect();
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let Some(policy) = self.broker.roles().get(request.name.as_str()) else {
            return Err(McpError::invalid_params(
                format!("unknown prompt: {}", request.name),
                None,
            ));
        };
        let persona = &policy.policy.persona;
        let menu = self.broker.menu_for_role(&request.name);
        let scoped = menu
            .entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "{}\n\nTools in scope for this role: {scoped}.",
            persona.system_prompt.as_deref().unwrap_or("").trim()
        );
        let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
        if let Some(description) = &persona.description {
            result = result.with_description(description.clone());
        }
        Ok(GetPromptResponse::Complete(result))
    }
}
