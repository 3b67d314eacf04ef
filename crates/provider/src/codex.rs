//! Codex (`codex`, npm `@openai/codex`): `codex exec --json`, configured
//! by `$CODEX_HOME/config.toml` (bound read-only over the agent's own
//! `~/.codex`): the gateway as its model provider (`wire_api =
//! "responses"`, a placeholder key), the broker as its only MCP server
//! (its `url`, or the relay; `required`, tools approved), its own sandbox
//! off (ours is the boundary: nested user namespaces are refused here),
//! analytics, feedback and update checks off, plugins, its own sub-agents,
//! apps, browser, computer use and image generation disabled. Models Codex
//! runs in code mode reach the broker's tools through its `exec` tool
//! (JavaScript calling `tools.mcp__substrat__...`), reported as MCP calls
//! all the same.
//! Resumed with `exec resume ID`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use substrat_policy::model::HostedTool;

use crate::events::{StreamEvent, misshapen, typed_object};
use crate::{
    AgentSetup, ConfigFile, Line, ModelApi, PROGRAM_DIR, ProgramMount, Provider, RELAY_SERVER,
    TurnRequest, prompt_argument,
};

#[derive(Debug, Clone)]
pub struct Codex {
    /// The native build's directory on the host
    /// (`.../@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl`).
    vendor: PathBuf,
    version: Option<String>,
}

/// The native program inside the vendor directory.
const PROGRAM: &str = "bin/codex";
/// The provider's name in config.toml.
const MODEL_PROVIDER: &str = "substrat";
/// Codex features switched off in config.toml (`codex features list`):
/// built-in tools, and compressed requests (the gateway reads a request
/// before it forwards it, and refuses an encoded one).
const BUILT_IN_TOOLS_OFF: [&str; 5] = [
    "apps",
    "browser_use",
    "computer_use",
    "image_generation",
    "enable_request_compression",
];

impl Codex {
    pub fn new(vendor: &Path, version: Option<String>) -> Self {
        Self {
            vendor: vendor.to_path_buf(),
            version,
        }
    }

    /// The native build beside npm's `codex` launcher script (the
    /// platform package it runs), from the path of the `codex` command.
    pub fn vendor_of(program: &Path) -> Option<PathBuf> {
        let script = program.canonicalize().ok()?;
        let modules = script.parent()?.parent()?.parent()?;
        let vendor = modules.join("codex-linux-x64/vendor/x86_64-unknown-linux-musl");
        vendor.join(PROGRAM).is_file().then_some(vendor)
    }
}

fn codex_home(agent: &AgentSetup<'_>) -> PathBuf {
    agent.home.join(".codex")
}

/// `$CODEX_HOME/config.toml`, written with the toml crate (a persona or
/// a path can hold anything: quotes, newlines, brackets).
fn config_toml(agent: &AgentSetup<'_>) -> String {
    use toml::{Table, Value as Toml};
    let table = |pairs: Vec<(&str, Toml)>| -> Toml {
        Toml::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    };
    let text = |s: &str| Toml::String(s.to_string());
    let mut config = Table::new();
    config.insert("model_provider".into(), text(MODEL_PROVIDER));
    config.insert("approval_policy".into(), text("never"));
    // Ours is the sandbox; Codex's own would need nested user namespaces.
    config.insert("sandbox_mode".into(), text("danger-full-access"));
    config.insert("check_for_update_on_startup".into(), Toml::Boolean(false));
    // Web search runs on the provider's side (refused by the gateway
    // unless the role allows it): on by default in Codex, off here.
    let web_search = agent.model.is_some_and(|m| m.allows(HostedTool::WebSearch));
    if !web_search {
        config.insert("web_search".into(), text("disabled"));
    }
    if let Some(persona) = agent.persona {
        config.insert("developer_instructions".into(), text(persona));
    }
    // Codex's own sub-agents ([agents]) would compete with the team's
    // spawn_agent and send_message under the same names.
    for off in ["analytics", "feedback", "agents"] {
        config.insert(off.into(), table(vec![("enabled", Toml::Boolean(false))]));
    }
    // Built-in tools that reach services of their own or the host's
    // display: nothing an agent in our sandbox may use.
    let features = BUILT_IN_TOOLS_OFF
        .iter()
        .map(|f| (*f, Toml::Boolean(false)))
        .collect();
    config.insert("features".into(), table(features));
    if let Some(model) = agent.model {
        let provider = table(vec![
            ("name", text("substrat gateway")),
            ("base_url", text(&format!("{}/v1", model.base_url))),
            ("env_key", text("OPENAI_API_KEY")),
            ("wire_api", text("responses")),
        ]);
        config.insert(
            "model_providers".into(),
            table(vec![(MODEL_PROVIDER, provider)]),
        );
    }
    // The broker's server: its streamable HTTP URL (`url`, no `command`)
    // or the relay; required (no turn without it), its tools approved
    // (`approval_policy = "never"` alone fails MCP calls).
    let mut server = vec![
        ("required", Toml::Boolean(true)),
        ("default_tools_approval_mode", text("approve")),
    ];
    match agent.mcp_url {
        Some(url) => server.push(("url", text(url))),
        None => {
            let env = agent
                .relay
                .env
                .iter()
                .map(|(k, v)| (k.clone(), text(v)))
                .collect();
            server.extend([
                ("command", text(&agent.relay.command)),
                (
                    "args",
                    Toml::Array(agent.relay.args.iter().map(|a| text(a)).collect()),
                ),
                ("env", Toml::Table(env)),
            ]);
        }
    }
    config.insert(
        "mcp_servers".into(),
        table(vec![(RELAY_SERVER, table(server))]),
    );
    toml::to_string(&config).unwrap_or_default()
}

impl Provider for Codex {
    fn name(&self) -> &str {
        "codex"
    }

    fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    fn oldest_version(&self) -> Option<&'static str> {
        Some("0.169.0")
    }

    fn mounts(&self) -> Vec<ProgramMount> {
        vec![ProgramMount {
            source: self.vendor.clone(),
            target: PathBuf::from(PROGRAM_DIR),
        }]
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi::OpenAi)
    }

    fn config_files(&self, agent: &AgentSetup<'_>) -> Vec<ConfigFile> {
        vec![ConfigFile {
            inside: codex_home(agent).join("config.toml"),
            contents: config_toml(agent),
        }]
    }

    fn env(&self, agent: &AgentSetup<'_>) -> Vec<(String, String)> {
        let mut env = vec![(
            "CODEX_HOME".to_string(),
            codex_home(agent).display().to_string(),
        )];
        if let Some(model) = agent.model {
            env.push(("OPENAI_API_KEY".into(), model.placeholder_key.clone()));
        }
        env
    }

    fn argv(&self, turn: &TurnRequest<'_>, _agent: &AgentSetup<'_>) -> Vec<String> {
        let program = Path::new(PROGRAM_DIR).join(PROGRAM);
        let mut argv: Vec<String> = vec![program.display().to_string(), "exec".into()];
        if let Some(session) = turn.resume {
            argv.extend(["resume".into(), session.to_string()]);
        }
        argv.extend(
            [
                "--json",
                "--skip-git-repo-check",
                "--strict-config",
                "--disable",
                "plugins",
            ]
            .map(String::from),
        );
        if let Some(model) = turn.model {
            argv.extend(["--model".into(), model.to_string()]);
        }
        argv.push("--".into());
        argv.push(prompt_argument(turn.prompt));
        argv
    }

    fn parse_line(&self, line: &str) -> Line {
        parse_line(line)
    }
}

/// One line of `codex exec --json`.
pub fn parse_line(line: &str) -> Line {
    let (kind, object) = match typed_object(line) {
        Ok(typed) => typed,
        Err(line) => return line,
    };
    match kind.as_str() {
        "thread.started" => match object.get("thread_id").and_then(Value::as_str) {
            Some(id) => Line::Event(StreamEvent::SystemInit {
                session_id: id.to_string(),
                model: None,
                cwd: None,
                extra: Default::default(),
            }),
            None => misshapen(line, &kind, "no thread_id"),
        },
        "turn.started" => Line::Events(Vec::new()),
        "item.started" | "item.updated" | "item.completed" => {
            let done = kind == "item.completed";
            match object.get("item") {
                Some(item) => item_events(item, done),
                None => misshapen(line, &kind, "no item"),
            }
        }
        "turn.completed" => {
            let usage = object.get("usage").cloned().unwrap_or(Value::Null);
            let count = |k: &str| usage[k].as_u64().unwrap_or(0);
            Line::Events(vec![
                StreamEvent::Usage {
                    input_tokens: count("input_tokens"),
                    output_tokens: count("output_tokens") + count("reasoning_output_tokens"),
                },
                finished(false, String::new()),
            ])
        }
        "turn.failed" => {
            let message = object
                .get("error")
                .and_then(|e| e.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("the turn failed");
            Line::Event(finished(true, message.to_string()))
        }
        // A stream error the CLI retries ("Reconnecting... 2/5") or one it
        // gives up on (a `turn.failed` follows).
        "error" => Line::Event(problem(
            object.get("message").and_then(Value::as_str).unwrap_or("?"),
        )),
        _ => Line::Event(StreamEvent::Unknown {
            kind,
            raw: Value::Object(object),
        }),
    }
}

fn problem(message: &str) -> StreamEvent {
    StreamEvent::Problem {
        retry: message.starts_with("Reconnecting"),
        message: crate::events::cut(message, crate::events::MALFORMED_KEEP),
    }
}

fn finished(is_error: bool, result: String) -> StreamEvent {
    StreamEvent::Result {
        is_error,
        result,
        subtype: None,
        duration_ms: None,
        session_id: None,
        extra: Default::default(),
    }
}

/// An item's events: its message when complete, a tool call when it
/// starts and when it completes; errors and other kinds noted.
fn item_events(item: &Value, done: bool) -> Line {
    let id = item["id"].as_str().map(str::to_string);
    let events = match item["type"].as_str().unwrap_or("") {
        "agent_message" if done => vec![StreamEvent::AssistantFinal {
            text: item["text"].as_str().unwrap_or_default().to_string(),
            extra: Default::default(),
        }],
        "mcp_tool_call" if done => {
            let failed = item["status"] == "failed" || !item["error"].is_null();
            let output = if failed {
                item["error"].to_string()
            } else {
                item["result"].to_string()
            };
            vec![StreamEvent::tool_completed(id, failed, &output)]
        }
        "mcp_tool_call" => {
            let name = format!(
                "mcp__{}__{}",
                item["server"].as_str().unwrap_or("?"),
                item["tool"].as_str().unwrap_or("?")
            );
            vec![StreamEvent::tool_started(
                id,
                &name,
                item["arguments"].clone(),
            )]
        }
        "command_execution" if done => {
            let failed = item["exit_code"].as_i64().is_some_and(|c| c != 0);
            let output = item["aggregated_output"].as_str().unwrap_or_default();
            vec![StreamEvent::tool_completed(id, failed, output)]
        }
        "command_execution" => vec![StreamEvent::tool_started(
            id,
            "shell",
            serde_json::json!({"command": item["command"]}),
        )],
        "error" if done => vec![problem(item["message"].as_str().unwrap_or("?"))],
        "error" => Vec::new(),
        "reasoning" | "agent_message" | "todo_list" => Vec::new(),
        other => vec![StreamEvent::Unknown {
            kind: format!("item/{other}"),
            raw: item.clone(),
        }],
    };
    Line::Events(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;
    use crate::transcript::{ReportedCall, Tokens, Transcript, TurnEnd};

    #[test]
    fn config_and_invocation() {
        let codex = Codex::new(Path::new("/opt/codex/vendor"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let setup = fixture::setup(&relay, Some(&access));
        let files = codex.config_files(&setup);
        assert_eq!(files[0].inside, Path::new("/home/agent/.codex/config.toml"));
        let config: toml::Table = toml::from_str(&files[0].contents).unwrap();
        assert_eq!(config["model_provider"].as_str(), Some("substrat"));
        assert_eq!(config["sandbox_mode"].as_str(), Some("danger-full-access"));
        assert_eq!(
            config["developer_instructions"].as_str(),
            Some("You review code.")
        );
        let provider = &config["model_providers"]["substrat"];
        assert_eq!(
            provider["base_url"].as_str(),
            Some("http://127.0.0.1:3129/v1")
        );
        assert_eq!(provider["wire_api"].as_str(), Some("responses"));
        let relay_entry = &config["mcp_servers"]["substrat"];
        assert_eq!(relay_entry["required"].as_bool(), Some(true));
        assert_eq!(
            relay_entry["env"]["SUBSTRAT_SOCKET"].as_str(),
            Some("/run/substrat/broker.sock")
        );
        assert_eq!(config["analytics"]["enabled"].as_bool(), Some(false));
        assert_eq!(config["agents"]["enabled"].as_bool(), Some(false));
        assert_eq!(config["features"]["apps"].as_bool(), Some(false));
        let env: std::collections::BTreeMap<_, _> = codex.env(&setup).into_iter().collect();
        assert_eq!(env["OPENAI_API_KEY"], "substrat-a1-00ff");
        assert_eq!(env["CODEX_HOME"], "/home/agent/.codex");
        let turn = TurnRequest {
            model: Some("gpt-x"),
            workspace: Path::new("/srv/ws"),
            resume: Some("t-1"),
            prompt: "go",
        };
        assert_eq!(
            codex.argv(&turn, &setup),
            [
                "/run/substrat/provider/bin/codex",
                "exec",
                "resume",
                "t-1",
                "--json",
                "--skip-git-repo-check",
                "--strict-config",
                "--disable",
                "plugins",
                "--model",
                "gpt-x",
                "--",
                "go"
            ]
        );
    }

    #[test]
    fn a_persona_with_quotes_and_newlines_stays_one_toml_string() {
        let relay = fixture::relay();
        let persona = "say \"hi\"\n\\ then ]]\n[mcp_servers.evil]\ncommand = \"x\"";
        let setup = AgentSetup {
            persona: Some(persona),
            ..fixture::setup(&relay, None)
        };
        let config: toml::Table = toml::from_str(&config_toml(&setup)).unwrap();
        assert_eq!(config["developer_instructions"].as_str(), Some(persona));
        let servers = config["mcp_servers"].as_table().unwrap();
        assert_eq!(servers.keys().collect::<Vec<_>>(), ["substrat"]);
    }

    #[test]
    fn with_the_brokers_url_the_config_names_it() {
        let codex = Codex::new(Path::new("/opt/codex/vendor"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let files = codex.config_files(&fixture::http_setup(&relay, Some(&access)));
        assert_eq!(
            files,
            [ConfigFile {
                inside: "/home/agent/.codex/config.toml".into(),
                contents: r#"approval_policy = "never"
check_for_update_on_startup = false
developer_instructions = "You review code."
model_provider = "substrat"
sandbox_mode = "danger-full-access"
web_search = "disabled"

[agents]
enabled = false

[analytics]
enabled = false

[features]
apps = false
browser_use = false
computer_use = false
enable_request_compression = false
image_generation = false

[feedback]
enabled = false

[mcp_servers.substrat]
default_tools_approval_mode = "approve"
required = true
url = "http://127.0.0.1:3130/mcp"

[model_providers.substrat]
base_url = "http://127.0.0.1:3129/v1"
env_key = "OPENAI_API_KEY"
name = "substrat gateway"
wire_api = "responses"
"#
                .into(),
            }]
        );
    }

    /// A turn recorded from codex 0.169.0 against the scripted model.
    #[test]
    fn a_recorded_turn_folds_into_its_transcript() {
        let mut t = Transcript::default();
        for line in include_str!("../tests/streams/codex_tool_call.jsonl").lines() {
            t.push(parse_line(line));
        }
        assert_eq!(
            t.session_id.as_deref(),
            Some("01a20af8-cc89-7421-9aae-891da1962db1")
        );
        assert_eq!(
            t.tool_calls,
            [ReportedCall {
                name: "mcp__ev__echo".into(),
                id: Some("item_1".into()),
                arguments: r#"{"message":"hi"}"#.into(),
                output: Some(
                    r#"{"content":[{"text":"Echo: hi","type":"text"}],"structured_content":null}"#
                        .into()
                ),
                is_error: Some(false),
            }]
        );
        assert_eq!(
            t.tokens,
            Some(Tokens {
                input: 24,
                output: 14
            })
        );
        assert_eq!(
            t.end(),
            TurnEnd::Success {
                text: "all done".into()
            }
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        // The model-metadata warning is kept as the CLI's error, whole.
        assert_eq!(t.problems_total, 1);
        assert!(!t.problems[0].retry);
        assert!(
            t.problems[0].message.starts_with("Model metadata"),
            "{:?}",
            t.problems
        );
    }

    #[test]
    fn stream_errors_are_kept_with_their_messages() {
        let stream = [
            r#"{"type":"thread.started","thread_id":"th"}"#,
            r#"{"type":"error","message":"Reconnecting... 1/5 (stream disconnected before completion: 500 Internal Server Error)"}"#,
            r#"{"type":"error","message":"stream disconnected before completion: 500 Internal Server Error"}"#,
            r#"{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}"#,
        ];
        let mut t = Transcript::default();
        for line in stream {
            t.push(parse_line(line));
        }
        let problems: Vec<(bool, &str)> = t
            .problems
            .iter()
            .map(|p| (p.retry, p.message.as_str()))
            .collect();
        assert_eq!(
            problems,
            [
                (
                    true,
                    "Reconnecting... 1/5 (stream disconnected before completion: 500 Internal Server Error)"
                ),
                (
                    false,
                    "stream disconnected before completion: 500 Internal Server Error"
                ),
            ]
        );
        assert_eq!(
            t.end(),
            TurnEnd::Error {
                message: "stream disconnected before completion".into()
            }
        );
    }

    #[test]
    fn a_failed_turn_is_an_error() {
        let line = r#"{"type":"turn.failed","error":{"message":"quota exceeded"}}"#;
        let mut t = Transcript::default();
        t.push(parse_line(line));
        assert_eq!(
            t.end(),
            TurnEnd::Error {
                message: "quota exceeded".into()
            }
        );
    }
}
