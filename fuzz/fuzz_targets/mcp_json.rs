//! Arbitrary bytes as the upstream servers file (cursor's mcp.json format
//! with seed 003's fields), then the menu a permissive role gets when each
//! server offers its `args` as tool names. Invariants: parsing never
//! panics; accepted servers have valid, unique names and bounded
//! timeouts; a local server has a command, a remote one an http(s) URL
//! (plain http only to a loopback host) and no header the transport sets; the menu holds at most 40 tools, built-ins first, every name
//! unique, at most 60 characters of MCP's name characters.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use substrat_broker::upstream::config::{MAX_SERVER_NAME, MAX_TIMEOUT_MS, ServerSource, parse};
use substrat_broker::upstream::menu::{self, PinState, ServerTools, UpstreamTool};
use substrat_policy::{LoadOptions, LoadedPolicy, load_str};

fn everything_role() -> &'static LoadedPolicy {
    static ROLE: OnceLock<LoadedPolicy> = OnceLock::new();
    ROLE.get_or_init(|| {
        let text = "version = 1\nextends = \"worker\"\n[tools]\nallow = [\"*\"]\n";
        load_str(std::path::Path::new("all.toml"), text, &LoadOptions::default()).expect("the role loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = parse(text) else { return };
    let mut seen = std::collections::HashSet::new();
    for server in &config.servers {
        assert!(seen.insert(server.name.clone()), "duplicate {}", server.name);
        assert!(!server.name.is_empty() && server.name.len() <= MAX_SERVER_NAME && !server.name.contains('_'));
        match &server.source {
            ServerSource::Local(local) => assert!(!local.command.is_empty()),
            ServerSource::Remote(remote) => {
                let plain = remote.url.starts_with("http://");
                assert!(plain || remote.url.starts_with("https://"), "{}", remote.url);
                if plain {
                    let loopback = ["http://127.", "http://localhost", "http://[::1]"];
                    assert!(loopback.iter().any(|p| remote.url.to_ascii_lowercase().starts_with(p)), "{}", remote.url);
                }
                for name in remote.headers.keys().chain(remote.header_env.keys()) {
                    assert!(!["accept", "content-type", "mcp-session-id"].contains(&name.to_ascii_lowercase().as_str()));
                }
            }
        }
        let ms = server.timeout.as_millis();
        assert!(ms >= 1 && ms <= u128::from(MAX_TIMEOUT_MS));
    }
    let servers: Vec<ServerTools> = config
        .servers
        .iter()
        .map(|s| ServerTools {
            server: s.name.clone(),
            tools: match &s.source {
                ServerSource::Local(local) => local.args.as_slice(),
                ServerSource::Remote(_) => &[],
            }
                .iter()
                .map(|name| {
                    let tool = UpstreamTool {
                        name: name.clone(),
                        description: String::new(),
                        input_schema: Value::Null,
                        annotations: Value::Null,
                        ..UpstreamTool::default()
                    };
                    (tool, PinState::Approved)
                })
                .collect(),
        })
        .collect();
    let built = menu::build(&everything_role().policy, &servers);
    assert!(built.entries.len() <= 40);
    let mut names = std::collections::HashSet::new();
    for (i, entry) in built.entries.iter().enumerate() {
        assert!(names.insert(entry.name.clone()), "{} twice", entry.name);
        assert!(entry.name.len() <= menu::MAX_TOOL_NAME);
        assert!(entry.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)), "{}", entry.name);
        if entry.server.is_none() {
            assert!(built.entries[..i].iter().all(|e| e.server.is_none()), "built-ins come first");
        }
    }
});
