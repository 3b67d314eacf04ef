//! `substrat-sandbox tools conformance-client URL` (hidden): the broker's
//! own client of remote upstream servers, as the client under test of the
//! MCP conformance suite (`scripts/conformance`). The suite starts a
//! scenario's server, runs this with the server's URL, and names the
//! scenario in MCP_CONFORMANCE_SCENARIO (and gives its data, such as client
//! credentials, in MCP_CONFORMANCE_CONTEXT).
//!
//! Nothing here is a client of its own: the URL becomes a servers-file
//! entry read by the daemon's parser, connected by the daemon's connect
//! path (transport, headers, offered protocol version, the check of the
//! answer), listed and called through `Upstreams` as the daemon calls
//! agents' tools. Prints one JSON line per step on stdout.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};
use substrat_broker::upstream::config::{UpstreamConfig, parse};
use substrat_broker::upstream::registry::Upstreams;
use substrat_broker::upstream_supervisor::connect_remote;

/// The entry's name (what `tools list` would show).
const SERVER: &str = "conformance";

pub fn main(url: &str) -> ExitCode {
    match run(url) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox tools conformance-client: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::FAILURE
        }
    }
}

fn run(url: &str) -> Result<()> {
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
        Ok(text) => Some(
            serde_json::from_str::<Value>(&text).context("MCP_CONFORMANCE_CONTEXT is not JSON")?,
        ),
        Err(_) => None,
    };
    let config = remote_config(url, context.as_ref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(session(Upstreams::new(config), &scenario))
}

/// The servers-file entry for the URL, read by the daemon's own parser.
/// The one place the scenario's context reaches the configuration: OAuth
/// (issue 41's next step) maps its client credentials to the entry's keys
/// here; until then every key is reported unused.
fn remote_config(url: &str, context: Option<&Value>) -> Result<UpstreamConfig> {
    let entry = json!({ "url": url });
    if let Some(Value::Object(context)) = context {
        let unused: Vec<&str> = context.keys().map(String::as_str).collect();
        if !unused.is_empty() {
            eprintln!(
                "conformance context not used (no OAuth yet): {}",
                unused.join(", ")
            );
        }
    }
    let file = json!({ "mcpServers": { SERVER: entry } });
    Ok(parse(&file.to_string())?)
}

/// Connects, lists, calls what the scenario expects, closes.
async fn session(upstreams: Upstreams, scenario: &str) -> Result<()> {
    let service = connect_remote(&upstreams, 0).await?;
    println!("{}", json!({ "servers": upstreams.report() }));
    let tools: Vec<String> = upstreams
        .server_tools()
        .into_iter()
        .flat_map(|s| s.tools.into_iter().map(|(tool, _)| tool.name))
        .collect();
    let mut failed = Vec::new();
    for tool in tools {
        let arguments = arguments(scenario, &tool);
        match upstreams.call(SERVER, &tool, arguments).await {
            Ok(result) => {
                if result.is_error == Some(true) {
                    failed.push(tool.clone());
                }
                println!("{}", json!({ "tool": tool, "result": result }));
            }
            Err(e) => {
                println!("{}", json!({ "tool": tool, "error": e.to_string() }));
                failed.push(tool);
            }
        }
    }
    // Closes the session (a DELETE for streamable HTTP).
    let _ = service.cancel().await;
    if !failed.is_empty() {
        bail!("calls failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The arguments a scenario's tool expects (from the suite's scenario
/// servers); every other tool is called with none.
fn arguments(scenario: &str, tool: &str) -> Map<String, Value> {
    let value = match (scenario, tool) {
        ("tools_call", "add_numbers") => json!({ "a": 5, "b": 3 }),
        _ => json!({}),
    };
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_goes_through_the_daemons_checks() {
        let config = remote_config("http://localhost:3001/mcp", None).unwrap();
        assert_eq!(config.servers.len(), 1);
        let refused = remote_config("http://example.com/mcp", None).unwrap_err();
        assert!(
            refused.to_string().contains("plain http is allowed only"),
            "{refused}"
        );
        let context = json!({"client_id": "x"});
        assert!(remote_config("http://127.0.0.1:1/", Some(&context)).is_ok());
    }

    #[test]
    fn scenarios_get_their_arguments() {
        assert_eq!(arguments("tools_call", "add_numbers")["a"], 5);
        assert!(arguments("sse-retry", "test_reconnection").is_empty());
    }
}
