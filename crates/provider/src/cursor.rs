//! cursor-agent (seed 002): `--print --output-format stream-json --trust
//! --approve-mcps --model M --workspace W [--resume S] PROMPT`.

use std::path::{Path, PathBuf};

use crate::{
    AgentSetup, ConfigFile, Line, PROGRAM_DIR, ProgramMount, Provider, RELAY_SERVER, TurnRequest,
    events, prompt_argument,
};

#[derive(Debug, Clone)]
pub struct CursorAgent {
    /// Shown in logs: `cursor-agent` or `stand-in`.
    label: String,
    /// The resolved path of the program on the host.
    program: PathBuf,
    /// Bind the program's whole directory (a real cursor-agent brings its
    /// node runtime next to it) or only the file (the stand-in).
    whole_dir: bool,
}

impl CursorAgent {
    /// `program` is the resolved (symlink-free) path of the executable.
    pub fn new(label: &str, program: &Path, whole_dir: bool) -> Option<Self> {
        program.parent()?;
        program.file_name()?.to_str()?;
        Some(Self {
            label: label.to_string(),
            program: program.to_path_buf(),
            whole_dir,
        })
    }

    fn is_stand_in(&self) -> bool {
        self.label == "stand-in"
    }

    fn file_name(&self) -> String {
        self.program
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

impl Provider for CursorAgent {
    fn name(&self) -> &str {
        &self.label
    }

    fn mounts(&self) -> Vec<ProgramMount> {
        let mount = match (self.whole_dir, self.program.parent()) {
            (true, Some(dir)) => ProgramMount {
                source: dir.to_path_buf(),
                target: PathBuf::from(PROGRAM_DIR),
            },
            _ => ProgramMount {
                source: self.program.clone(),
                target: Path::new(PROGRAM_DIR).join(self.file_name()),
            },
        };
        vec![mount]
    }

    /// The stand-in starts stdio servers only: it keeps the relay even
    /// when the broker serves HTTP.
    fn takes_mcp_url(&self) -> bool {
        !self.is_stand_in()
    }

    /// `.cursor/mcp.json` in the workspace (seed 002): the broker only.
    fn config_files(&self, agent: &AgentSetup<'_>) -> Vec<ConfigFile> {
        vec![ConfigFile {
            inside: agent.workspace.join(".cursor/mcp.json"),
            contents: mcp_servers_json(agent, http_entry, serde_json::Map::new()),
        }]
    }

    fn env(&self, _agent: &AgentSetup<'_>) -> Vec<(String, String)> {
        Vec::new()
    }

    fn argv(&self, turn: &TurnRequest<'_>, _agent: &AgentSetup<'_>) -> Vec<String> {
        let program = Path::new(PROGRAM_DIR).join(self.file_name());
        let mut argv: Vec<String> = vec![program.display().to_string()];
        argv.extend(
            [
                "--print",
                "--output-format",
                "stream-json",
                "--trust",
                "--approve-mcps",
            ]
            .map(String::from),
        );
        if let Some(model) = turn.model {
            argv.extend(["--model".into(), model.to_string()]);
        }
        argv.extend(["--workspace".into(), turn.workspace.display().to_string()]);
        if let Some(session) = turn.resume {
            argv.extend(["--resume".into(), session.to_string()]);
        }
        argv.push(prompt_argument(turn.prompt));
        argv
    }

    fn parse_line(&self, line: &str) -> Line {
        events::parse_line(line)
    }

    /// The stand-in runs a plan: its re-run makes the same calls.
    fn replays_exactly(&self) -> bool {
        self.is_stand_in()
    }
}

/// `{"mcpServers": {"substrat": {...}}}`, the broker as the only server
/// in the shape Claude Code, cursor-agent and Gemini CLI read: the relay
/// (`command`, `args`, `env`) or, when the agent has the broker's URL,
/// `http(url)` (each CLI names a streamable HTTP server its own way); with
/// `more` in either.
pub(crate) fn mcp_servers_json(
    agent: &AgentSetup<'_>,
    http: fn(&str) -> serde_json::Value,
    more: serde_json::Map<String, serde_json::Value>,
) -> String {
    let mut entry = match agent.mcp_url {
        Some(url) => http(url),
        None => {
            let env: serde_json::Map<String, serde_json::Value> = agent
                .relay
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into()))
                .collect();
            serde_json::json!({
                "command": agent.relay.command,
                "args": agent.relay.args,
                "env": env,
            })
        }
    };
    if let Some(object) = entry.as_object_mut() {
        object.extend(more);
    }
    let config = serde_json::json!({"mcpServers": {RELAY_SERVER: entry}});
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}

/// cursor-agent's streamable HTTP server: a `url` (with no `command`).
fn http_entry(url: &str) -> serde_json::Value {
    serde_json::json!({ "url": url })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixture;

    #[test]
    fn the_relay_is_the_only_server_in_the_workspaces_mcp_json() {
        let agent = CursorAgent::new("stand-in", Path::new("/b/stand-in"), false).unwrap();
        let relay = fixture::relay();
        let files = agent.config_files(&fixture::setup(&relay, None));
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].inside, Path::new("/srv/ws/.cursor/mcp.json"));
        let config: serde_json::Value = serde_json::from_str(&files[0].contents).unwrap();
        assert_eq!(config, fixture::relay_servers_json());
    }

    #[test]
    fn with_the_brokers_url_cursor_agents_mcp_json_names_it() {
        let agent = CursorAgent::new(
            "cursor-agent",
            Path::new("/opt/cursor/v1/cursor-agent"),
            true,
        )
        .unwrap();
        let relay = fixture::relay();
        let setup = fixture::http_setup(&relay, None);
        let stand_in = CursorAgent::new("stand-in", Path::new("/b/stand-in"), false).unwrap();
        assert!(
            agent.takes_mcp_url() && !stand_in.takes_mcp_url(),
            "the stand-in starts stdio servers only"
        );
        assert_eq!(
            agent.config_files(&setup),
            [ConfigFile {
                inside: "/srv/ws/.cursor/mcp.json".into(),
                contents: r#"{
  "mcpServers": {
    "substrat": {
      "url": "http://127.0.0.1:3130/mcp"
    }
  }
}
"#
                .into(),
            }]
        );
    }

    #[test]
    fn seed_invocation_with_and_without_resume() {
        let relay = fixture::relay();
        let setup = fixture::setup(&relay, None);
        let agent = CursorAgent::new(
            "cursor-agent",
            Path::new("/opt/cursor/v1/cursor-agent"),
            true,
        )
        .unwrap();
        let turn = TurnRequest {
            model: Some("sonnet-4.6"),
            workspace: Path::new("/srv/ws"),
            resume: None,
            prompt: "do it",
        };
        assert_eq!(
            agent.argv(&turn, &setup),
            [
                "/run/substrat/provider/cursor-agent",
                "--print",
                "--output-format",
                "stream-json",
                "--trust",
                "--approve-mcps",
                "--model",
                "sonnet-4.6",
                "--workspace",
                "/srv/ws",
                "do it"
            ]
        );
        let resumed = TurnRequest {
            model: None,
            resume: Some("s-1"),
            prompt: "--force",
            ..turn
        };
        assert_eq!(
            agent.argv(&resumed, &setup),
            [
                "/run/substrat/provider/cursor-agent",
                "--print",
                "--output-format",
                "stream-json",
                "--trust",
                "--approve-mcps",
                "--workspace",
                "/srv/ws",
                "--resume",
                "s-1",
                " --force"
            ]
        );
        assert_eq!(
            agent.mounts(),
            [ProgramMount {
                source: "/opt/cursor/v1".into(),
                target: "/run/substrat/provider".into()
            }]
        );
        let stand_in = CursorAgent::new("stand-in", Path::new("/b/stand-in"), false).unwrap();
        assert_eq!(
            stand_in.mounts(),
            [ProgramMount {
                source: "/b/stand-in".into(),
                target: "/run/substrat/provider/stand-in".into()
            }]
        );
    }
}
