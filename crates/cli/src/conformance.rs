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
use substrat_broker::upstream_supervisor::oauth::{OAuthContext, Variables};

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
    let (config, variables) = remote_config(url, &scenario, context.as_ref())?;
    // Tokens in memory; approval without a browser (the suite's
    // authorization servers approve at once): the daemon's code path with
    // `flow::auto_approve` in the browser's place.
    let oauth = OAuthContext {
        server: SERVER.into(),
        token_dir: None,
        variables,
        auto_approve: true,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(session(Upstreams::new(config), &scenario, &oauth))
}

/// The client metadata document the suite's CIMD scenarios expect as the
/// client id (the suite serves none: the authorization server only checks
/// the id).
const CONFORMANCE_CIMD: &str = "https://conformance-test.local/client-metadata.json";
/// The variables the context's secrets are given as (never the process's
/// environment: they reach the entry as names, as in a servers file).
const SECRET_VAR: &str = "MCP_CONFORMANCE_CLIENT_SECRET";
const KEY_VAR: &str = "MCP_CONFORMANCE_PRIVATE_KEY";

/// The servers-file entry for the URL, read by the daemon's own parser,
/// and the secrets its names stand for. The one place the scenario's
/// context reaches the configuration: an `auth/` scenario gets an `oauth`
/// entry, its client credentials mapped to the entry's keys (a
/// `client-credentials` scenario's to grant client_credentials).
fn remote_config(
    url: &str,
    scenario: &str,
    context: Option<&Value>,
) -> Result<(UpstreamConfig, Variables)> {
    let mut entry = json!({ "url": url });
    let mut variables = Variables::default();
    let empty = Map::new();
    let context = match context {
        Some(Value::Object(map)) => map,
        _ => &empty,
    };
    if scenario.starts_with("auth/") || !context.is_empty() {
        let mut oauth = Map::new();
        let mut unused = Vec::new();
        for (key, value) in context {
            let Some(text) = value.as_str() else {
                unused.push(key.as_str());
                continue;
            };
            match key.as_str() {
                "client_id" => {
                    oauth.insert("client_id".into(), json!(text));
                }
                "client_secret" => {
                    variables.0.insert(SECRET_VAR.into(), text.into());
                    oauth.insert("client_secret_env".into(), json!(SECRET_VAR));
                }
                "private_key_pem" => {
                    variables.0.insert(KEY_VAR.into(), text.into());
                    oauth.insert("private_key_env".into(), json!(KEY_VAR));
                }
                "signing_algorithm" => {
                    oauth.insert("signing_algorithm".into(), json!(text));
                }
                _ => unused.push(key.as_str()),
            }
        }
        if scenario.starts_with("auth/client-credentials") {
            oauth.insert("grant".into(), json!("client_credentials"));
        } else {
            oauth.insert("client_metadata_url".into(), json!(CONFORMANCE_CIMD));
        }
        if !unused.is_empty() {
            eprintln!("conformance context not used: {}", unused.join(", "));
        }
        entry["oauth"] = Value::Object(oauth);
    }
    let file = json!({ "mcpServers": { SERVER: entry } });
    Ok((parse(&file.to_string())?, variables))
}

/// Connects, lists, calls what the scenario expects, closes.
async fn session(upstreams: Upstreams, scenario: &str, oauth: &OAuthContext) -> Result<()> {
    let service = connect_remote(&upstreams, 0, oauth).await?;
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
        let (config, _) = remote_config("http://localhost:3001/mcp", "initialize", None).unwrap();
        assert_eq!(config.servers.len(), 1);
        let refused = remote_config("http://example.com/mcp", "initialize", None).unwrap_err();
        assert!(
            refused.to_string().contains("plain http is allowed only"),
            "{refused}"
        );
    }

    #[test]
    fn the_context_becomes_an_oauth_entry_with_secrets_by_name() {
        use substrat_broker::upstream::config::{ServerSource, UpstreamConfig};
        use substrat_broker::upstream::oauth::{OAuthGrant, SigningAlgorithm};
        let oauth_of = |config: &UpstreamConfig| match &config.servers[0].source {
            ServerSource::Remote(remote) => remote.oauth.clone().unwrap(),
            ServerSource::Local(_) => panic!("remote expected"),
        };
        let context = json!({"client_id": "x", "client_secret": "s3cret", "name": "n"});
        let (config, variables) = remote_config(
            "http://127.0.0.1:1/",
            "auth/pre-registration",
            Some(&context),
        )
        .unwrap();
        let oauth = oauth_of(&config);
        assert_eq!(oauth.client_id.as_deref(), Some("x"));
        assert_eq!(oauth.client_secret_env.as_deref(), Some(SECRET_VAR));
        assert_eq!(oauth.grant, OAuthGrant::AuthorizationCode);
        assert_eq!(variables.get(SECRET_VAR).unwrap(), "s3cret");
        assert!(!format!("{config:?}{variables:?}").contains("s3cret"));
        let context =
            json!({"client_id": "x", "private_key_pem": "PEM", "signing_algorithm": "ES256"});
        let (config, _) = remote_config(
            "http://127.0.0.1:1/",
            "auth/client-credentials-jwt",
            Some(&context),
        )
        .unwrap();
        let oauth = oauth_of(&config);
        assert_eq!(oauth.grant, OAuthGrant::ClientCredentials);
        assert_eq!(oauth.signing_algorithm, Some(SigningAlgorithm::ES256));
        let (config, _) = remote_config("http://127.0.0.1:1/", "auth/basic-cimd", None).unwrap();
        assert_eq!(
            oauth_of(&config).client_metadata_url.as_deref(),
            Some(CONFORMANCE_CIMD)
        );
    }

    #[test]
    fn scenarios_get_their_arguments() {
        assert_eq!(arguments("tools_call", "add_numbers")["a"], 5);
        assert!(arguments("sse-retry", "test_reconnection").is_empty());
    }
}
