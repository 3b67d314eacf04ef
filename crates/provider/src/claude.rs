//! Claude Code (`claude`, npm `@anthropic-ai/claude-code`): `-p` with
//! `--output-format stream-json --verbose`, the broker (its URL, or the
//! relay) from `--mcp-config FILE --strict-mcp-config` (no other server),
//! the persona appended to its
//! system prompt, the model reached through the gateway
//! (`ANTHROPIC_BASE_URL`, a placeholder `ANTHROPIC_API_KEY`), sessions
//! under the agent's home (`~/.claude`), resumed with `--resume ID`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use substrat_policy::model::HostedTool;

use crate::events::{StreamEvent, misshapen, typed_object};
use crate::{
    AgentSetup, CONFIG_DIR, ConfigFile, Line, ModelApi, PROGRAM_DIR, ProgramMount, Provider,
    RELAY_SERVER, TurnRequest, prompt_argument,
};

#[derive(Debug, Clone)]
pub struct ClaudeCode {
    /// The package's directory on the host (`.../@anthropic-ai/claude-code`).
    package: PathBuf,
    version: Option<String>,
}

/// The program inside the package: a native executable.
const PROGRAM: &str = "bin/claude.exe";

impl ClaudeCode {
    /// `package`: the resolved directory of the npm package.
    pub fn new(package: &Path, version: Option<String>) -> Self {
        Self {
            package: package.to_path_buf(),
            version,
        }
    }

    /// The package directory holding `claude` on the host, from the path
    /// of the `claude` command (npm's link into the package).
    pub fn package_of(program: &Path) -> Option<PathBuf> {
        let resolved = program.canonicalize().ok()?;
        let package = resolved.parent()?.parent()?.to_path_buf();
        package.join(PROGRAM).is_file().then_some(package)
    }
}

/// The relay's MCP configuration file inside the sandbox.
fn mcp_config_path() -> PathBuf {
    Path::new(CONFIG_DIR).join("claude-mcp.json")
}

/// Claude Code's streamable HTTP server: `type` `http` and its `url`.
fn http_entry(url: &str) -> Value {
    serde_json::json!({"type": "http", "url": url})
}

/// Claude Code's own tools that are always off: its sub-agents, agent
/// messaging and scheduling would compete with the team's broker tools
/// (spawn_agent, send_message) outside their limits and audit.
const OVERLAPPING_TOOLS: [&str; 10] = [
    "Agent",
    "Task",
    "SendMessage",
    "ListAgents",
    "TaskStop",
    "Workflow",
    "CronCreate",
    "CronDelete",
    "CronList",
    "ScheduleWakeup",
];

/// Claude Code's web tools, each on only when the role allows the
/// provider-side tool it is built on.
const WEB_TOOLS: [(&str, HostedTool); 2] = [
    ("WebSearch", HostedTool::WebSearch),
    ("WebFetch", HostedTool::WebFetch),
];

/// The tools `--disallowedTools` removes for this agent.
fn disallowed(agent: &AgentSetup<'_>) -> String {
    let allowed = |tool| agent.model.is_some_and(|m| m.allows(tool));
    let web = WEB_TOOLS
        .iter()
        .filter(|(_, tool)| !allowed(*tool))
        .map(|(name, _)| *name);
    OVERLAPPING_TOOLS
        .iter()
        .copied()
        .chain(web)
        .collect::<Vec<_>>()
        .join(",")
}

/// `mcp__substrat__TOOL`: how Claude Code names the relay's tools.
fn tool_names(tools: &[String]) -> String {
    let names: Vec<String> = tools
        .iter()
        .map(|t| format!("mcp__{RELAY_SERVER}__{t}"))
        .collect();
    names.join(",")
}

impl Provider for ClaudeCode {
    fn name(&self) -> &str {
        "claude"
    }

    fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    fn oldest_version(&self) -> Option<&'static str> {
        Some("2.1.330")
    }

    fn mounts(&self) -> Vec<ProgramMount> {
        vec![ProgramMount {
            source: self.package.clone(),
            target: PathBuf::from(PROGRAM_DIR),
        }]
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi::Anthropic)
    }

    fn config_files(&self, agent: &AgentSetup<'_>) -> Vec<ConfigFile> {
        vec![ConfigFile {
            inside: mcp_config_path(),
            contents: crate::cursor::mcp_servers_json(agent, http_entry, serde_json::Map::new()),
        }]
    }

    fn env(&self, agent: &AgentSetup<'_>) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            // Tools offered directly, not behind a search step.
            ("ENABLE_TOOL_SEARCH", "false"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
            // The sandbox is ours: its root is a mapped id, permissions are
            // skipped (nobody can answer a prompt headless).
            ("IS_SANDBOX", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        if let Some(model) = agent.model {
            env.push(("ANTHROPIC_BASE_URL".into(), model.base_url.clone()));
            env.push(("ANTHROPIC_API_KEY".into(), model.placeholder_key.clone()));
            // Its side requests (titles, summaries) ask for the small/fast
            // model: the agent's own, so they stay within its allowance.
            if let Some(chosen) = &model.chosen {
                for name in [
                    "ANTHROPIC_SMALL_FAST_MODEL",
                    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                ] {
                    env.push((name.into(), chosen.clone()));
                }
            }
        }
        env
    }

    fn argv(&self, turn: &TurnRequest<'_>, agent: &AgentSetup<'_>) -> Vec<String> {
        let program = Path::new(PROGRAM_DIR).join(PROGRAM);
        let mut argv: Vec<String> = vec![program.display().to_string()];
        argv.extend(
            [
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--strict-mcp-config",
                "--dangerously-skip-permissions",
            ]
            .map(String::from),
        );
        argv.extend([
            "--mcp-config".into(),
            mcp_config_path().display().to_string(),
        ]);
        if !agent.tools.is_empty() {
            argv.extend(["--allowedTools".into(), tool_names(agent.tools)]);
        }
        argv.extend(["--disallowedTools".into(), disallowed(agent)]);
        if let Some(persona) = agent.persona {
            argv.extend(["--append-system-prompt".into(), persona.to_string()]);
        }
        if let Some(model) = turn.model {
            argv.extend(["--model".into(), model.to_string()]);
        }
        if let Some(session) = turn.resume {
            argv.extend(["--resume".into(), session.to_string()]);
        }
        // After `--`: `--allowedTools` takes several values and would
        // swallow the prompt.
        argv.push("--".into());
        argv.push(prompt_argument(turn.prompt));
        argv
    }

    fn parse_line(&self, line: &str) -> Line {
        parse_line(line)
    }
}

/// One line of Claude Code's stream-json.
pub fn parse_line(line: &str) -> Line {
    let (kind, object) = match typed_object(line) {
        Ok(typed) => typed,
        Err(line) => return line,
    };
    let subtype = object.get("subtype").and_then(Value::as_str);
    match (kind.as_str(), subtype) {
        ("system", Some("init")) => match object.get("session_id").and_then(Value::as_str) {
            Some(session) => Line::Event(StreamEvent::SystemInit {
                session_id: session.to_string(),
                model: text(&object, "model"),
                cwd: text(&object, "cwd"),
                extra: Default::default(),
            }),
            None => misshapen(line, "system", "no session_id"),
        },
        ("system", Some("api_retry")) => Line::Event(api_retry(&object)),
        ("assistant", _) => Line::Events(message_events(&object, true)),
        ("user", _) => Line::Events(message_events(&object, false)),
        ("result", _) => result_events(line, &object),
        _ => {
            let kind = match subtype {
                Some(sub) => format!("{kind}/{sub}"),
                None => kind,
            };
            Line::Event(StreamEvent::Unknown {
                kind,
                raw: Value::Object(object),
            })
        }
    }
}

/// `{"subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":
/// 500,"error_status":529,"error":"overloaded"}`: a model request failed
/// and is tried again.
fn api_retry(object: &serde_json::Map<String, Value>) -> StreamEvent {
    let number = |key: &str| object.get(key).and_then(Value::as_u64);
    let status = number("error_status").map_or_else(|| "no status".into(), |s| s.to_string());
    let error = object
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let message = format!(
        "model request failed ({status}, {error}); retry {} of {} in {} ms",
        number("attempt").unwrap_or(0),
        number("max_retries").unwrap_or(0),
        number("retry_delay_ms").unwrap_or(0),
    );
    StreamEvent::Problem {
        retry: true,
        message,
    }
}

fn text(object: &serde_json::Map<String, Value>, key: &str) -> Option<String> {
    object.get(key).and_then(Value::as_str).map(str::to_string)
}

/// An assistant message's text and tool calls; a user message's tool
/// results (its prompt echo carries nothing new).
fn message_events(object: &serde_json::Map<String, Value>, assistant: bool) -> Vec<StreamEvent> {
    let empty = Vec::new();
    let blocks = object
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut events = Vec::new();
    for block in blocks {
        let id = block.get("id").and_then(Value::as_str).map(str::to_string);
        match (assistant, block.get("type").and_then(Value::as_str)) {
            (true, Some("text")) => events.push(StreamEvent::AssistantFinal {
                text: block["text"].as_str().unwrap_or_default().to_string(),
                extra: Default::default(),
            }),
            (true, Some("tool_use")) => {
                let name = block["name"].as_str().unwrap_or("(unnamed)");
                events.push(StreamEvent::tool_started(id, name, block["input"].clone()));
            }
            (false, Some("tool_result")) => {
                let call = block["tool_use_id"].as_str().map(str::to_string);
                let is_error = block["is_error"].as_bool().unwrap_or(false);
                events.push(StreamEvent::tool_completed(
                    call,
                    is_error,
                    &result_text(&block["content"]),
                ));
            }
            _ => {}
        }
    }
    events
}

/// A tool result's content: a string, or text blocks.
fn result_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn result_events(line: &str, object: &serde_json::Map<String, Value>) -> Line {
    let Some(is_error) = object.get("is_error").and_then(Value::as_bool) else {
        return misshapen(line, "result", "no boolean is_error");
    };
    let mut events = Vec::new();
    let usage = &object.get("usage").cloned().unwrap_or(Value::Null);
    if usage.is_object() {
        let count = |k: &str| usage[k].as_u64().unwrap_or(0);
        events.push(StreamEvent::Usage {
            input_tokens: count("input_tokens")
                + count("cache_read_input_tokens")
                + count("cache_creation_input_tokens"),
            output_tokens: count("output_tokens"),
        });
    }
    // An error result may carry its reasons in `errors` only.
    let mut result = text(object, "result").unwrap_or_default();
    if is_error && result.is_empty() {
        let errors: Vec<&str> = object
            .get("errors")
            .and_then(Value::as_array)
            .map(|e| e.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        result = if errors.is_empty() {
            text(object, "subtype").unwrap_or_default()
        } else {
            errors.join("; ")
        };
    }
    events.push(StreamEvent::Result {
        is_error,
        result,
        subtype: text(object, "subtype"),
        duration_ms: object.get("duration_ms").and_then(Value::as_u64),
        session_id: text(object, "session_id"),
        extra: Default::default(),
    });
    Line::Events(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    #[test]
    fn a_web_tool_stays_on_only_when_the_role_allows_its_provider_tool() {
        let relay = fixture::relay();
        let mut access = fixture::access();
        let off = disallowed(&fixture::setup(&relay, Some(&access)));
        assert!(off.ends_with(",WebSearch,WebFetch"), "{off}");
        access.hosted_tools = vec![HostedTool::WebSearch];
        let off = disallowed(&fixture::setup(&relay, Some(&access)));
        assert!(off.ends_with(",ScheduleWakeup,WebFetch"), "{off}");
        assert!(
            off.starts_with("Agent,Task,SendMessage"),
            "sub-agents stay off: {off}"
        );
    }
    use crate::transcript::{ReportedCall, Tokens, Transcript, TurnEnd};

    #[test]
    fn invocation_holds_the_relay_the_persona_and_the_gateway() {
        let claude = ClaudeCode::new(Path::new("/opt/npm/@anthropic-ai/claude-code"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let tools = ["send_message".to_string(), "check_inbox".to_string()];
        let setup = AgentSetup {
            tools: &tools,
            ..fixture::setup(&relay, Some(&access))
        };
        let turn = TurnRequest {
            model: None,
            workspace: Path::new("/srv/ws"),
            resume: Some("s-1"),
            prompt: "-rf",
        };
        assert_eq!(
            claude.argv(&turn, &setup),
            [
                "/run/substrat/provider/bin/claude.exe",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--strict-mcp-config",
                "--dangerously-skip-permissions",
                "--mcp-config",
                "/run/substrat/provider-config/claude-mcp.json",
                "--allowedTools",
                "mcp__substrat__send_message,mcp__substrat__check_inbox",
                "--disallowedTools",
                "Agent,Task,SendMessage,ListAgents,TaskStop,Workflow,CronCreate,CronDelete,\
                 CronList,ScheduleWakeup,WebSearch,WebFetch",
                "--append-system-prompt",
                "You review code.",
                "--resume",
                "s-1",
                "--",
                " -rf"
            ]
        );
        let env: std::collections::BTreeMap<_, _> = claude.env(&setup).into_iter().collect();
        assert_eq!(env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:3129");
        assert_eq!(env["ANTHROPIC_API_KEY"], "substrat-a1-00ff");
        assert_eq!(env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"], "1");
        assert!(
            !env.contains_key("ANTHROPIC_SMALL_FAST_MODEL"),
            "none chosen"
        );
        // A model chosen: its side requests ask for it too.
        let chosen = crate::ModelAccess {
            chosen: Some("claude-sonnet-5".into()),
            ..access.clone()
        };
        let with = claude.env(&fixture::setup(&relay, Some(&chosen)));
        let with: std::collections::BTreeMap<_, _> = with.into_iter().collect();
        assert_eq!(with["ANTHROPIC_SMALL_FAST_MODEL"], "claude-sonnet-5");
        assert_eq!(with["ANTHROPIC_DEFAULT_HAIKU_MODEL"], "claude-sonnet-5");
        let files = claude.config_files(&setup);
        let config: Value = serde_json::from_str(&files[0].contents).unwrap();
        assert_eq!(config, fixture::relay_servers_json());
        assert_eq!(
            claude.mounts(),
            [ProgramMount {
                source: "/opt/npm/@anthropic-ai/claude-code".into(),
                target: "/run/substrat/provider".into()
            }]
        );
    }

    #[test]
    fn with_the_brokers_url_the_mcp_config_names_it() {
        let claude = ClaudeCode::new(Path::new("/opt/npm/@anthropic-ai/claude-code"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let setup = fixture::http_setup(&relay, Some(&access));
        assert_eq!(
            claude.config_files(&setup),
            [ConfigFile {
                inside: "/run/substrat/provider-config/claude-mcp.json".into(),
                contents: r#"{
  "mcpServers": {
    "substrat": {
      "type": "http",
      "url": "http://127.0.0.1:3130/mcp"
    }
  }
}
"#
                .into(),
            }]
        );
    }

    /// A turn recorded from claude 2.1.330 against the scripted model:
    /// one MCP call, then the answer.
    #[test]
    fn a_recorded_turn_folds_into_its_transcript() {
        let mut t = Transcript::default();
        for line in include_str!("../tests/streams/claude_tool_call.jsonl").lines() {
            t.push(parse_line(line));
        }
        assert_eq!(
            t.session_id.as_deref(),
            Some("077a8f87-244b-4a59-87aa-d5b39ea52e04")
        );
        assert_eq!(
            t.tool_calls,
            [ReportedCall {
                name: "mcp__ev__echo".into(),
                id: Some("toolu_02ad4a118d41".into()),
                arguments: r#"{"message":"hi"}"#.into(),
                output: Some("Echo: hi".into()),
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
        assert_eq!(t.notes, Vec::<String>::new());
    }

    #[test]
    fn an_error_result_says_why_from_its_errors() {
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"session_id":"s","errors":["No conversation found with session ID: s"]}"#;
        let mut t = Transcript::default();
        t.push(parse_line(line));
        assert_eq!(
            t.end(),
            TurnEnd::Error {
                message: "No conversation found with session ID: s".into()
            }
        );
    }

    #[test]
    fn odd_lines_are_reported_not_fatal() {
        assert!(matches!(
            parse_line("{\"type\":\"result\"}"),
            Line::Malformed { .. }
        ));
        assert!(matches!(
            parse_line("{\"type\":\"system\",\"subtype\":\"hook\"}"),
            Line::Event(StreamEvent::Unknown { .. })
        ));
        assert_eq!(parse_line(""), Line::Blank);
    }
}
