//! What a provider writes for one turn, as JSON: its configuration files,
//! environment and command line (paths as inside the sandbox), for
//! running a real CLI by hand with exactly that configuration
//! (`scripts/check_cli_mcp_http.py`).
//!
//! Usage: turn_setup claude|codex|gemini|cursor-agent HOME WORKSPACE
//! MODEL_BASE_URL MCP_URL|relay TOOL,... PROMPT

use std::path::Path;

use serde_json::json;
use substrat_provider::{
    AgentSetup, ClaudeCode, Codex, CursorAgent, GeminiCli, ModelAccess, Provider, RelayEntry,
    TurnRequest,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cli, home, workspace, base_url, mcp, tools, prompt] = &args[..] else {
        eprintln!(
            "usage: turn_setup claude|codex|gemini|cursor-agent HOME WORKSPACE \
             MODEL_BASE_URL MCP_URL|relay TOOL,... PROMPT"
        );
        std::process::exit(2);
    };
    let provider: Box<dyn Provider> = match cli.as_str() {
        "claude" => Box::new(ClaudeCode::new(Path::new("/"), None)),
        "codex" => Box::new(Codex::new(Path::new("/"), None)),
        "gemini" => Box::new(GeminiCli::new(Path::new("/"), Path::new("node"), None)),
        "cursor-agent" => {
            match CursorAgent::new("cursor-agent", Path::new("/cursor-agent"), true) {
                Some(agent) => Box::new(agent),
                None => std::process::exit(2),
            }
        }
        other => {
            eprintln!("turn_setup: unknown CLI {other}");
            std::process::exit(2);
        }
    };
    let relay = RelayEntry {
        command: "/run/substrat/substrat-mcp-server".into(),
        args: vec!["--agent-id".into(), "a1".into()],
        env: vec![("SUBSTRAT_SOCKET".into(), "/run/substrat/broker.sock".into())],
    };
    let model = ModelAccess {
        base_url: base_url.clone(),
        placeholder_key: "substrat-a1-check".into(),
        hosted_tools: Vec::new(),
        chosen: None,
    };
    let tools: Vec<String> = tools.split(',').map(str::to_string).collect();
    let setup = AgentSetup {
        agent_id: "a1",
        home: Path::new(home),
        workspace: Path::new(workspace),
        relay: &relay,
        mcp_url: (mcp != "relay").then_some(mcp.as_str()),
        persona: None,
        tools: &tools,
        model: Some(&model),
    };
    let turn = TurnRequest {
        model: None,
        workspace: Path::new(workspace),
        resume: None,
        prompt,
    };
    let files: Vec<_> = provider
        .config_files(&setup)
        .into_iter()
        .map(|f| json!({"inside": f.inside, "contents": f.contents}))
        .collect();
    let out = json!({
        "files": files,
        "env": provider.env(&setup),
        "argv": provider.argv(&turn, &setup),
    });
    println!("{out}");
}
