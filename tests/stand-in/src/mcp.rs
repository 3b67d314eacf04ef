//! The MCP side: `.cursor/mcp.json`, stdio servers started as child
//! processes through the rmcp client, and cursor-agent's 40-tool cap.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};

/// cursor-agent offers the model at most this many MCP tools.
pub const TOOL_CAP: usize = 40;
/// The limit on one tools/call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The limit on starting a server: spawn, initialize and list its tools.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One stdio server entry of mcp.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

type Client = RunningService<RoleClient, ()>;

/// The running servers and the tools kept from them.
#[derive(Debug, Default)]
pub struct Mcp {
    clients: Vec<Client>,
    /// Kept tool name → index into `clients`.
    tools: Vec<(String, usize)>,
}

fn note(text: &str) {
    eprintln!("stand-in: {text}");
}

/// Reads `<workspace>/.cursor/mcp.json`; missing or malformed means no servers.
pub fn load_config(workspace: &Path) -> Vec<ServerEntry> {
    let path = workspace.join(".cursor").join("mcp.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            note(&format!("{}: {e}; no MCP servers", path.display()));
            return Vec::new();
        }
    };
    parse_config(&text).unwrap_or_else(|e| {
        note(&format!("{}: {e}; no MCP servers", path.display()));
        Vec::new()
    })
}

/// Parses mcp.json text into stdio entries sorted by name; `url` entries
/// and entries without a command are skipped with a note.
pub fn parse_config(text: &str) -> Result<Vec<ServerEntry>, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("malformed: {e}"))?;
    let servers = match root.get("mcpServers") {
        None => return Ok(Vec::new()),
        Some(Value::Object(servers)) => servers,
        Some(_) => return Err("malformed: mcpServers is not an object".into()),
    };
    let sorted: BTreeMap<&String, &Value> = servers.iter().collect();
    let mut entries = Vec::new();
    for (name, entry) in sorted {
        match parse_entry(name, entry) {
            Ok(e) => entries.push(e),
            Err(why) => note(&format!("MCP server {name}: {why}; skipped")),
        }
    }
    Ok(entries)
}

fn parse_entry(name: &str, entry: &Value) -> Result<ServerEntry, String> {
    if entry.get("command").is_none() && entry.get("url").is_some() {
        return Err("url servers are not supported by the stand-in".into());
    }
    let command = entry
        .get("command")
        .and_then(Value::as_str)
        .ok_or("no command")?;
    let args = match entry.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => strings(v).ok_or("args is not a list of strings")?,
    };
    let env = match entry.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => string_map(v).ok_or("env is not an object of strings")?,
    };
    Ok(ServerEntry {
        name: name.to_string(),
        command: command.to_string(),
        args,
        env,
    })
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn string_map(v: &Value) -> Option<BTreeMap<String, String>> {
    v.as_object()?
        .iter()
        .map(|(k, s)| Some((k.clone(), s.as_str()?.to_string())))
        .collect()
}

async fn start_one(entry: &ServerEntry) -> Result<(Client, Vec<Tool>), String> {
    let mut cmd = tokio::process::Command::new(&entry.command);
    cmd.args(&entry.args).envs(&entry.env).kill_on_drop(true);
    let transport = TokioChildProcess::new(cmd).map_err(|e| format!("cannot start: {e}"))?;
    let client = ().serve(transport).await.map_err(|e| format!("initialize failed: {e}"))?;
    match client.peer().list_all_tools().await {
        Ok(tools) => Ok((client, tools)),
        Err(e) => {
            shutdown_one(client).await;
            Err(format!("tools/list failed: {e}"))
        }
    }
}

async fn shutdown_one(client: Client) {
    if let Err(e) = client.cancel().await {
        note(&format!("MCP client shutdown: {e}"));
    }
}

impl Mcp {
    /// Starts every server in order; a failing server is noted and left out.
    pub async fn start(entries: &[ServerEntry]) -> Mcp {
        let mut mcp = Mcp::default();
        let mut offered = 0;
        for entry in entries {
            let started = tokio::time::timeout(START_TIMEOUT, start_one(entry)).await;
            let (client, tools) = match started {
                Ok(Ok(started)) => started,
                Ok(Err(why)) => {
                    note(&format!(
                        "MCP server {}: {why}; continuing without it",
                        entry.name
                    ));
                    continue;
                }
                Err(_) => {
                    note(&format!(
                        "MCP server {}: no answer in {START_TIMEOUT:?}; continuing without it",
                        entry.name
                    ));
                    continue;
                }
            };
            offered += tools.len();
            let index = mcp.clients.len();
            mcp.clients.push(client);
            mcp.keep(tools, index);
        }
        if offered > TOOL_CAP {
            note(&format!("keeping the first {TOOL_CAP} of {offered} tools"));
        }
        mcp
    }

    fn keep(&mut self, tools: Vec<Tool>, index: usize) {
        let room = TOOL_CAP.saturating_sub(self.tools.len());
        let kept = tools.into_iter().take(room);
        self.tools.extend(kept.map(|t| (t.name.to_string(), index)));
    }

    /// Calls a kept tool. `Ok` is the result's text, `Err` the error text.
    pub async fn call(&self, tool: &str, args: &Map<String, Value>) -> Result<String, String> {
        let Some(&(_, index)) = self.tools.iter().find(|(name, _)| name == tool) else {
            return Err(format!("not among the {} tools offered", self.tools.len()));
        };
        let client = self.clients.get(index).ok_or("no client")?;
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.clone());
        match tokio::time::timeout(CALL_TIMEOUT, client.call_tool(params)).await {
            Err(_) => Err(format!("no answer in {CALL_TIMEOUT:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(result)) => as_outcome(&result),
        }
    }

    /// Closes every client; rmcp closes the server's stdin, waits, then kills it.
    pub async fn shutdown(self) {
        for client in self.clients {
            shutdown_one(client).await;
        }
    }
}

fn as_outcome(result: &CallToolResult) -> Result<String, String> {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.as_str())
        .collect();
    let text = text.join("\n");
    if result.is_error == Some(true) {
        Err(text)
    } else {
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stdio_entries_sorted_by_name() {
        let text = r#"{"mcpServers": {
            "zeta": {"command": "z", "args": ["-a"], "env": {"K": "V"}},
            "alpha": {"command": "a"},
            "web": {"url": "http://example.invalid/mcp"},
            "broken": {"args": []}
        }}"#;
        let env = BTreeMap::from([("K".to_string(), "V".to_string())]);
        assert_eq!(
            parse_config(text),
            Ok(vec![
                ServerEntry {
                    name: "alpha".into(),
                    command: "a".into(),
                    args: vec![],
                    env: BTreeMap::new()
                },
                ServerEntry {
                    name: "zeta".into(),
                    command: "z".into(),
                    args: vec!["-a".into()],
                    env
                },
            ])
        );
    }

    #[test]
    fn malformed_config_is_an_error_and_no_servers_key_is_empty() {
        assert!(parse_config("{").unwrap_err().starts_with("malformed: "));
        assert_eq!(
            parse_config(r#"{"mcpServers": []}"#),
            Err("malformed: mcpServers is not an object".into())
        );
        assert_eq!(parse_config("{}"), Ok(vec![]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_unknown_tool_names_the_count() {
        let mcp = Mcp::default();
        assert_eq!(
            mcp.call("echo", &Map::new()).await,
            Err("not among the 0 tools offered".into())
        );
    }
}
