//! The tool catalog: names, descriptions and input schemas of the broker's
//! built-in tools (the seeds' catalog), their argument types, and which
//! tools an agent sees (scope, then the cap, in a fixed order).

use serde::Deserialize;
use serde_json::{Value, json};
use substrat_policy::model::{MAX_TOOLS, Policy};

/// Built-in tools, in the order they are listed (built-ins come first).
pub const BUILTIN_TOOLS: [&str; 5] = [
    "send_message",
    "broadcast",
    "check_inbox",
    "spawn_agent",
    "inspect_agent",
];

#[derive(Debug)]
pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: Value,
}

pub fn builtin(name: &str) -> Option<ToolDef> {
    let (name, description, schema) = match name {
        "send_message" => (
            "send_message",
            "Send a message to your parent, a child or a sibling. Returns at once. With sync=true the reply arrives as your next message; do not poll.",
            json!({"type": "object", "properties": {
                "recipient": {"type": "string", "description": "Agent name"},
                "text": {"type": "string", "description": "Message body"},
                "sync": {"type": "boolean", "default": true, "description": "Deliver the reply as your next message"}
            }, "required": ["recipient", "text"], "additionalProperties": false}),
        ),
        "broadcast" => (
            "broadcast",
            "Send a message to your team: your siblings (a root agent: its children). Returns at once; each one's reply arrives as a separate message, your next turns.",
            json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}),
        ),
        "check_inbox" => (
            "check_inbox",
            "Return and clear your pending asynchronous messages (sync=false messages, reports of your children's first turns).",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ),
        "spawn_agent" => (
            "spawn_agent",
            "Create a subagent in your team with a role and instructions.",
            json!({"type": "object", "properties": {
                "name": {"type": "string"},
                "instructions": {"type": "string"},
                "role": {"type": "string", "default": "worker"},
                "workspace_subdir": {"type": ["string", "null"], "description": "Subdirectory of your workspace"},
                "provider": {"type": ["string", "null"], "description": "The agent CLI it runs (claude, codex, gemini, cursor-agent); default: yours"},
                "model": {"type": ["string", "null"], "description": "The model it uses, within what its role allows; default: its role's default, else yours"},
                "role_args": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Arguments of the role (prompts/list shows a role's arguments)"}
            }, "required": ["name", "instructions"], "additionalProperties": false}),
        ),
        "inspect_agent" => (
            "inspect_agent",
            "Show a subordinate's state (idle, busy, waiting, suspended, failed), its last turns and recent messages.",
            json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false}),
        ),
        _ => return None,
    };
    Some(ToolDef {
        name,
        description,
        schema,
    })
}

fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| {
        glob::Pattern::new(p)
            .map(|g| g.matches(name))
            .unwrap_or(false)
    })
}

/// Whether the policy lets the agent see and call `name` at all.
pub fn in_scope(policy: &Policy, name: &str) -> bool {
    let allowed = policy
        .tools
        .allow
        .as_ref()
        .is_none_or(|allow| matches(allow, name));
    allowed && !matches(&policy.tools.deny, name)
}

/// The tools an agent sees, in order: in scope, at most the cap (and never
/// more than 40, cursor-agent's limit).
pub fn visible_tools(policy: &Policy) -> Vec<&'static str> {
    let cap = policy.mcp.tool_cap.unwrap_or(MAX_TOOLS).min(MAX_TOOLS) as usize;
    BUILTIN_TOOLS
        .iter()
        .copied()
        .filter(|t| in_scope(policy, t))
        .take(cap)
        .collect()
}

fn default_true() -> bool {
    true
}

fn default_worker() -> String {
    "worker".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessageArgs {
    pub recipient: String,
    pub text: String,
    #[serde(default = "default_true")]
    pub sync: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BroadcastArgs {
    pub text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnAgentArgs {
    pub name: String,
    pub instructions: String,
    #[serde(default = "default_worker")]
    pub role: String,
    #[serde(default)]
    pub workspace_subdir: Option<String>,
    /// The agent CLI the child runs; default: the one its parent runs.
    #[serde(default)]
    pub provider: Option<String>,
    /// The model the child uses (within its role's `model.models`);
    /// default: its role's `model.default`, else its parent's.
    #[serde(default)]
    pub model: Option<String>,
    /// Arguments of a script or compiled role, for its resolve at the
    /// child's first turn.
    #[serde(default)]
    pub role_args: crate::roles::RoleArgs,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectAgentArgs {
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_policy::{LoadOptions, load_builtin, load_str};

    #[test]
    fn scope_and_cap_decide_the_list() {
        let worker = load_builtin("worker", &LoadOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(visible_tools(&worker.policy), BUILTIN_TOOLS);
        let strict = load_builtin("strict", &LoadOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            visible_tools(&strict.policy),
            ["send_message", "check_inbox"]
        );
        let text = "version = 1\n[mcp]\ntool_cap = 2\n[tools]\ndeny = [\"send_*\"]\n";
        let capped = load_str(
            std::path::Path::new("p.toml"),
            text,
            &LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(visible_tools(&capped.policy), ["broadcast", "check_inbox"]);
        assert!(!in_scope(&capped.policy, "send_message"));
        for name in BUILTIN_TOOLS {
            assert!(builtin(name).is_some());
        }
    }
}
