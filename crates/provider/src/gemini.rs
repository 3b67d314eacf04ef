//! Gemini CLI (`gemini`, npm `@google/gemini-cli`): `-p PROMPT -o
//! stream-json --skip-trust`, configured by `~/.gemini/settings.json`
//! (bound read-only over the agent's own home): the broker as its only MCP
//! server (trusted; its URL as `httpUrl`, or the relay), every tool
//! without a prompt (`--approval-mode yolo`: headless, it would drop its
//! shell and edit tools), API-key auth against the gateway
//! (`GOOGLE_GEMINI_BASE_URL`, a placeholder `GEMINI_API_KEY`), usage
//! statistics and updates off, no extensions. The persona is its
//! `GEMINI.md` context file. Resumed with `--resume ID`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use substrat_policy::model::HostedTool;

use crate::events::{StreamEvent, misshapen, typed_object};
use crate::{
    AgentSetup, ConfigFile, Line, ModelApi, PROGRAM_DIR, ProgramMount, Provider, TurnRequest,
    prompt_argument,
};

#[derive(Debug, Clone)]
pub struct GeminiCli {
    /// The package's directory on the host (`.../@google/gemini-cli`).
    package: PathBuf,
    /// Node, which runs the bundle (bound read-only from the host's /usr).
    node: PathBuf,
    version: Option<String>,
}

/// The bundle inside the package.
const BUNDLE: &str = "bundle/gemini.js";

impl GeminiCli {
    pub fn new(package: &Path, node: &Path, version: Option<String>) -> Self {
        Self {
            package: package.to_path_buf(),
            node: node.to_path_buf(),
            version,
        }
    }

    /// The package directory holding `gemini`, from the path of the
    /// `gemini` command (npm's link to the bundle).
    pub fn package_of(program: &Path) -> Option<PathBuf> {
        let bundle = program.canonicalize().ok()?;
        let package = bundle.parent()?.parent()?.to_path_buf();
        package.join(BUNDLE).is_file().then_some(package)
    }
}

/// Gemini CLI's own tools that are always off: its sub-agents compete
/// with the team's broker tools outside their limits and audit.
const OVERLAPPING_TOOLS: [&str; 1] = ["invoke_agent"];

/// Gemini CLI's web tools (built on Google Search and URL context, run
/// on the provider's side), each on only when the role allows it.
const WEB_TOOLS: [(&str, HostedTool); 2] = [
    ("google_web_search", HostedTool::WebSearch),
    ("web_fetch", HostedTool::WebFetch),
];

/// The tools `tools.exclude` removes for this agent.
fn excluded(agent: &AgentSetup<'_>) -> Vec<&'static str> {
    let allowed = |tool| agent.model.is_some_and(|m| m.allows(tool));
    let web = WEB_TOOLS
        .iter()
        .filter(|(_, tool)| !allowed(*tool))
        .map(|(name, _)| *name);
    OVERLAPPING_TOOLS.iter().copied().chain(web).collect()
}

/// Gemini CLI's streamable HTTP server: `httpUrl` (its `url` is SSE).
fn http_entry(url: &str) -> Value {
    json!({ "httpUrl": url })
}

fn settings(agent: &AgentSetup<'_>) -> String {
    let more = json!({"trust": true});
    let servers: Value = serde_json::from_str(&crate::cursor::mcp_servers_json(
        agent,
        http_entry,
        more.as_object().cloned().unwrap_or_default(),
    ))
    .unwrap_or(Value::Null);
    let config = json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "tools": {"exclude": excluded(agent)},
        "mcpServers": servers["mcpServers"],
    });
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}

impl Provider for GeminiCli {
    fn name(&self) -> &str {
        "gemini"
    }

    fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    fn oldest_version(&self) -> Option<&'static str> {
        Some("0.61.0")
    }

    fn mounts(&self) -> Vec<ProgramMount> {
        vec![ProgramMount {
            source: self.package.clone(),
            target: PathBuf::from(PROGRAM_DIR),
        }]
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi::Gemini)
    }

    fn config_files(&self, agent: &AgentSetup<'_>) -> Vec<ConfigFile> {
        let mut files = vec![ConfigFile {
            inside: agent.home.join(".gemini/settings.json"),
            contents: settings(agent),
        }];
        if let Some(persona) = agent.persona {
            files.push(ConfigFile {
                inside: agent.home.join(".gemini/GEMINI.md"),
                contents: format!("{persona}\n"),
            });
        }
        files
    }

    fn env(&self, agent: &AgentSetup<'_>) -> Vec<(String, String)> {
        match agent.model {
            Some(model) => vec![
                ("GOOGLE_GEMINI_BASE_URL".into(), model.base_url.clone()),
                ("GEMINI_API_KEY".into(), model.placeholder_key.clone()),
            ],
            None => Vec::new(),
        }
    }

    fn argv(&self, turn: &TurnRequest<'_>, _agent: &AgentSetup<'_>) -> Vec<String> {
        let bundle = Path::new(PROGRAM_DIR).join(BUNDLE);
        let mut argv: Vec<String> = vec![
            self.node.display().to_string(),
            bundle.display().to_string(),
        ];
        // Headless, Gemini CLI leaves out every tool that would ask
        // (its shell, file edits) unless approvals are off: ours is the
        // boundary, as for the other CLIs.
        argv.extend(
            [
                "-o",
                "stream-json",
                "--skip-trust",
                "--approval-mode",
                "yolo",
                "--extensions",
                "none",
            ]
            .map(String::from),
        );
        if let Some(model) = turn.model {
            argv.extend(["--model".into(), model.to_string()]);
        }
        if let Some(session) = turn.resume {
            argv.extend(["--resume".into(), session.to_string()]);
        }
        argv.extend(["--prompt".into(), prompt_argument(turn.prompt)]);
        argv
    }

    fn parse_line(&self, line: &str) -> Line {
        parse_line(line)
    }
}

/// One line of `gemini -o stream-json`.
pub fn parse_line(line: &str) -> Line {
    let (kind, object) = match typed_object(line) {
        Ok(typed) => typed,
        Err(line) => return line,
    };
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_string);
    match kind.as_str() {
        "init" => match text("session_id") {
            Some(session_id) => Line::Event(StreamEvent::SystemInit {
                session_id,
                model: text("model"),
                cwd: None,
                extra: Default::default(),
            }),
            None => misshapen(line, &kind, "no session_id"),
        },
        "message" => {
            let content = text("content").unwrap_or_default();
            match object.get("role").and_then(Value::as_str) {
                Some("assistant") => Line::Event(StreamEvent::AssistantDelta {
                    text: content,
                    timestamp_ms: 0,
                    extra: Default::default(),
                }),
                _ => Line::Event(StreamEvent::User {
                    text: content,
                    extra: Default::default(),
                }),
            }
        }
        "tool_use" => Line::Event(StreamEvent::tool_started(
            text("tool_id"),
            &text("tool_name").unwrap_or_else(|| "(unnamed)".into()),
            object.get("parameters").cloned().unwrap_or(Value::Null),
        )),
        "tool_result" => {
            let failed = object.get("status").and_then(Value::as_str) != Some("success");
            let output = match object.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => object
                    .get("error")
                    .map(Value::to_string)
                    .unwrap_or_default(),
            };
            Line::Event(StreamEvent::tool_completed(
                text("tool_id"),
                failed,
                &output,
            ))
        }
        "result" => {
            let stats = object.get("stats").cloned().unwrap_or(Value::Null);
            let failed = object.get("status").and_then(Value::as_str) != Some("success");
            let message = object
                .get("error")
                .and_then(|e| e.get("message").and_then(Value::as_str).or(e.as_str()))
                .unwrap_or(if failed { "the turn failed" } else { "" });
            let mut events = Vec::new();
            if stats.is_object() {
                events.push(StreamEvent::Usage {
                    input_tokens: stats["input_tokens"].as_u64().unwrap_or(0),
                    output_tokens: stats["output_tokens"].as_u64().unwrap_or(0),
                });
            }
            events.push(StreamEvent::Result {
                is_error: failed,
                result: message.to_string(),
                subtype: text("status"),
                duration_ms: stats["duration_ms"].as_u64(),
                session_id: None,
                extra: Default::default(),
            });
            Line::Events(events)
        }
        // `{"type":"error","severity":"warning"|"error","message":...}`:
        // a warning is one the CLI goes on after.
        "error" => Line::Event(StreamEvent::Problem {
            retry: object.get("severity").and_then(Value::as_str) == Some("warning"),
            message: crate::events::cut(
                &text("message").unwrap_or_else(|| "?".into()),
                crate::events::MALFORMED_KEEP,
            ),
        }),
        _ => Line::Event(StreamEvent::Unknown {
            kind,
            raw: Value::Object(object),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;
    use crate::transcript::{ReportedCall, Tokens, Transcript, TurnEnd};

    #[test]
    fn settings_and_invocation() {
        let gemini = GeminiCli::new(Path::new("/opt/g"), Path::new("/usr/bin/node"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let setup = fixture::setup(&relay, Some(&access));
        let files = gemini.config_files(&setup);
        assert_eq!(
            files[0].inside,
            Path::new("/home/agent/.gemini/settings.json")
        );
        let settings: Value = serde_json::from_str(&files[0].contents).unwrap();
        let mut servers = fixture::relay_servers_json()["mcpServers"].clone();
        servers["substrat"]["trust"] = true.into();
        assert_eq!(settings["mcpServers"], servers);
        assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
        assert_eq!(
            settings["security"]["auth"]["selectedType"],
            "gemini-api-key"
        );
        assert_eq!(files[1].inside, Path::new("/home/agent/.gemini/GEMINI.md"));
        let env: std::collections::BTreeMap<_, _> = gemini.env(&setup).into_iter().collect();
        assert_eq!(env["GEMINI_API_KEY"], "substrat-a1-00ff");
        let turn = TurnRequest {
            model: None,
            workspace: Path::new("/srv/ws"),
            resume: Some("u-1"),
            prompt: "--yolo",
        };
        assert_eq!(
            gemini.argv(&turn, &setup),
            [
                "/usr/bin/node",
                "/run/substrat/provider/bundle/gemini.js",
                "-o",
                "stream-json",
                "--skip-trust",
                "--approval-mode",
                "yolo",
                "--extensions",
                "none",
                "--resume",
                "u-1",
                "--prompt",
                " --yolo"
            ]
        );
    }

    #[test]
    fn with_the_brokers_url_the_settings_name_it() {
        let gemini = GeminiCli::new(Path::new("/opt/g"), Path::new("/usr/bin/node"), None);
        let relay = fixture::relay();
        let access = fixture::access();
        let files = gemini.config_files(&fixture::http_setup(&relay, Some(&access)));
        assert_eq!(
            files[0],
            ConfigFile {
                inside: "/home/agent/.gemini/settings.json".into(),
                contents: r#"{
  "general": {
    "enableAutoUpdate": false,
    "enableAutoUpdateNotification": false
  },
  "mcpServers": {
    "substrat": {
      "httpUrl": "http://127.0.0.1:3130/mcp",
      "trust": true
    }
  },
  "privacy": {
    "usageStatisticsEnabled": false
  },
  "security": {
    "auth": {
      "selectedType": "gemini-api-key"
    }
  },
  "tools": {
    "exclude": [
      "invoke_agent",
      "google_web_search",
      "web_fetch"
    ]
  }
}
"#
                .into(),
            }
        );
        assert_eq!(files.len(), 2, "and the persona: {files:?}");
    }

    /// A turn recorded from gemini 0.61.0 against the scripted model.
    #[test]
    fn a_recorded_turn_folds_into_its_transcript() {
        let mut t = Transcript::default();
        for line in include_str!("../tests/streams/gemini_tool_call.jsonl").lines() {
            t.push(parse_line(line));
        }
        assert_eq!(
            t.session_id.as_deref(),
            Some("5090c525-92d8-410f-aea3-eea1e4bf8670")
        );
        assert_eq!(
            t.tool_calls,
            [ReportedCall {
                name: "mcp_ev_echo".into(),
                id: Some("mcp_ev_echo__mcp_ev_echo_1795480519077_0".into()),
                arguments: r#"{"message":"hi"}"#.into(),
                output: Some("Echo: hi".into()),
                is_error: Some(false),
            }]
        );
        assert_eq!(
            t.tokens,
            Some(Tokens {
                input: 36,
                output: 21
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
    fn an_error_result_is_an_error() {
        let mut t = Transcript::default();
        t.push(parse_line(
            r#"{"type":"result","status":"error","error":{"type":"x","message":"quota"}}"#,
        ));
        assert_eq!(
            t.end(),
            TurnEnd::Error {
                message: "quota".into()
            }
        );
    }

    #[test]
    fn error_events_are_kept_with_their_severity() {
        let mut t = crate::Transcript::default();
        t.push(parse_line(
            r#"{"type":"error","timestamp":"2026-11-28T10:00:00Z","severity":"warning","message":"Retrying after 429"}"#,
        ));
        t.push(parse_line(
            r#"{"type":"error","timestamp":"2026-11-28T10:00:01Z","severity":"error","message":"Quota exceeded"}"#,
        ));
        let kept: Vec<(bool, &str)> = t
            .problems
            .iter()
            .map(|p| (p.retry, p.message.as_str()))
            .collect();
        assert_eq!(
            kept,
            [(true, "Retrying after 429"), (false, "Quota exceeded")]
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
    }
}
