#![forbid(unsafe_code)]
//! Agent CLI providers: how a turn is invoked and how its output is read.
//! The broker drives turns through [`Provider`] only, so another agent CLI
//! is one more implementation here, not a change to the broker.
//!
//! - `cursor`: cursor-agent (and the stand-in, which speaks its protocol);
//!   `claude`, `codex`, `gemini`: Claude Code, Codex, Gemini CLI. Each
//!   writes the CLI's own configuration (the broker its only MCP server:
//!   its streamable HTTP URL, or the stdio relay),
//!   its command line and environment, and parses its event stream;
//! - `events`: the events every stream is read into; `transcript`: one
//!   turn's events folded into what the broker keeps;
//! - `version`: the oldest version of each CLI a provider is written for.

pub mod claude;
pub mod codex;
pub mod cursor;
pub mod events;
pub mod gemini;
pub mod transcript;
pub mod version;

use std::path::{Path, PathBuf};

pub use claude::ClaudeCode;
pub use codex::Codex;
pub use cursor::CursorAgent;
pub use events::{Line, StreamEvent, parse_line};
pub use gemini::GeminiCli;
pub use transcript::{Transcript, TurnEnd};

/// One turn as the provider is asked to run it.
#[derive(Debug, Clone)]
pub struct TurnRequest<'a> {
    pub model: Option<&'a str>,
    /// The workspace path inside the sandbox (the same as on the host).
    pub workspace: &'a Path,
    /// The session to continue (`--resume`), if the agent has one.
    pub resume: Option<&'a str>,
    pub prompt: &'a str,
}

/// A host path the provider's program needs inside the sandbox, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramMount {
    pub source: PathBuf,
    pub target: PathBuf,
}

/// The model API a provider's CLI speaks (through the daemon's gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelApi {
    Anthropic,
    OpenAi,
    Gemini,
}

/// The relay's entry in a CLI's MCP configuration: the only server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayEntry {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How the sandbox reaches the model: the gateway's URL inside and the
/// agent's placeholder key (never the real one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAccess {
    /// `http://127.0.0.1:PORT`, the gateway's bridged port.
    pub base_url: String,
    pub placeholder_key: String,
    /// The provider-side tools the role allows (`model.hosted_tools`):
    /// the CLI's own tools built on them stay on, the others are off.
    pub hosted_tools: Vec<substrat_policy::model::HostedTool>,
    /// The model the agent was given (`spawn_agent`'s `model`, its role's
    /// default), if any: its CLI's side requests use it too, where the CLI
    /// can be told (Claude Code's small/fast model).
    pub chosen: Option<String>,
}

impl ModelAccess {
    pub fn allows(&self, tool: substrat_policy::model::HostedTool) -> bool {
        self.hosted_tools.contains(&tool)
    }
}

/// What stays the same across an agent's turns.
#[derive(Debug, Clone)]
pub struct AgentSetup<'a> {
    pub agent_id: &'a str,
    /// The agent's own home inside (persistent, writable): the CLI's
    /// sessions and state live there, no other agent sees them.
    pub home: &'a Path,
    pub workspace: &'a Path,
    pub relay: &'a RelayEntry,
    /// The broker's MCP streamable HTTP endpoint inside the sandbox
    /// (`http://127.0.0.1:PORT/mcp`), when the sandbox has a loopback of
    /// its own: when set, every CLI is configured with it instead of the
    /// relay.
    pub mcp_url: Option<&'a str>,
    /// The role's persona (its system prompt), if it has one.
    pub persona: Option<&'a str>,
    /// The broker's tools the role may call (`send_message`...).
    pub tools: &'a [String],
    pub model: Option<&'a ModelAccess>,
}

/// A configuration file the CLI reads, written by the daemon for each
/// turn and bound read-only at `inside`: the agent cannot change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    pub inside: PathBuf,
    pub contents: String,
}

/// The name the broker's server (the relay or the URL) has in every
/// CLI's configuration.
pub const RELAY_SERVER: &str = "substrat";

pub trait Provider: std::fmt::Debug + Send + Sync {
    /// A short name for logs and `agent inspect`.
    fn name(&self) -> &str;
    /// The CLI's version, when it was read at start (`--version`).
    fn version(&self) -> Option<&str> {
        None
    }
    /// The oldest version this provider is written for (see `version`);
    /// none for a CLI whose version is not checked.
    fn oldest_version(&self) -> Option<&'static str> {
        None
    }
    /// What to bind read-only so `argv` can run inside the sandbox.
    fn mounts(&self) -> Vec<ProgramMount>;
    /// The model API it reaches through the gateway; none for a CLI that
    /// brings its own way (cursor-agent, the stand-in).
    fn model_api(&self) -> Option<ModelApi> {
        None
    }
    /// Whether the CLI is given the broker's MCP URL when the sandbox has
    /// one (`AgentSetup::mcp_url`); else it keeps the stdio relay.
    fn takes_mcp_url(&self) -> bool {
        true
    }
    /// The CLI's configuration: the broker as its only MCP server (its
    /// URL when the agent has one, else the relay), the
    /// persona, its non-essential traffic off.
    fn config_files(&self, agent: &AgentSetup<'_>) -> Vec<ConfigFile>;
    /// Variables the CLI needs (its model endpoint and placeholder key,
    /// switches for telemetry and updates).
    fn env(&self, agent: &AgentSetup<'_>) -> Vec<(String, String)>;
    /// The command line of one turn, as run inside the sandbox.
    fn argv(&self, turn: &TurnRequest<'_>, agent: &AgentSetup<'_>) -> Vec<String>;
    /// One line of the turn's standard output.
    fn parse_line(&self, line: &str) -> Line;
    /// Whether a re-run of a turn makes the very same calls in the same
    /// order (the stand-in's scripted plans). A model does not: a re-run
    /// is told what the interrupted run already did.
    fn replays_exactly(&self) -> bool {
        false
    }
}

/// The prompt as a last argument: one that starts with `-` (another
/// agent's message can say anything) would be read as an option, e.g.
/// `--force`. A leading space keeps it a prompt and changes nothing a
/// model reads.
pub fn prompt_argument(prompt: &str) -> String {
    if prompt.starts_with('-') {
        format!(" {prompt}")
    } else {
        prompt.to_string()
    }
}

/// Where the provider's program is bound inside every sandbox.
pub const PROGRAM_DIR: &str = "/run/substrat/provider";
/// Where configuration files outside the home and workspace are bound.
pub const CONFIG_DIR: &str = "/run/substrat/provider-config";

#[cfg(test)]
pub(crate) mod fixture {
    //! One agent's setup as the daemon would give it, for the providers' tests.
    use std::path::Path;

    use super::{AgentSetup, ModelAccess, RelayEntry};

    pub fn relay() -> RelayEntry {
        RelayEntry {
            command: "/run/substrat/substrat-mcp-server".into(),
            args: vec!["--agent-id".into(), "a1".into()],
            env: vec![("SUBSTRAT_SOCKET".into(), "/run/substrat/broker.sock".into())],
        }
    }

    pub fn access() -> ModelAccess {
        ModelAccess {
            base_url: "http://127.0.0.1:3129".into(),
            placeholder_key: "substrat-a1-00ff".into(),
            hosted_tools: Vec::new(),
            chosen: None,
        }
    }

    pub static TOOLS: [String; 0] = [];

    /// The broker's endpoint as the sandbox's loopback serves it.
    pub const MCP_URL: &str = "http://127.0.0.1:3130/mcp";

    pub fn setup<'a>(relay: &'a RelayEntry, model: Option<&'a ModelAccess>) -> AgentSetup<'a> {
        AgentSetup {
            agent_id: "a1",
            home: Path::new("/home/agent"),
            workspace: Path::new("/srv/ws"),
            relay,
            mcp_url: None,
            persona: Some("You review code."),
            tools: &TOOLS,
            model,
        }
    }

    /// The same agent in a sandbox where the broker serves MCP over HTTP.
    pub fn http_setup<'a>(relay: &'a RelayEntry, model: Option<&'a ModelAccess>) -> AgentSetup<'a> {
        AgentSetup {
            mcp_url: Some(MCP_URL),
            ..setup(relay, model)
        }
    }

    /// The relay's entry as cursor-agent's and Gemini CLI's files hold it.
    pub fn relay_servers_json() -> serde_json::Value {
        serde_json::json!({"mcpServers": {"substrat": {
            "command": "/run/substrat/substrat-mcp-server",
            "args": ["--agent-id", "a1"],
            "env": {"SUBSTRAT_SOCKET": "/run/substrat/broker.sock"},
        }}})
    }
}
