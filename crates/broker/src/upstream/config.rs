//! The upstream servers file: cursor's `mcp.json` format (seed 002) with
//! seed 003's fields added per server. Servers keep the file's order (the
//! menu's order); a duplicate name is an error, as is anything unknown.
//!
//! ```json
//! {"mcpServers": {
//!   "everything": {"command": "mcp-server-everything", "args": [],
//!                  "env": {"LOG": "1"}, "category": "system", "enabled": true,
//!                  "env_allow": ["LANG"], "policy": "upstream", "timeout_ms": 30000}
//! }}
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};

/// Longest server name; with `_` and the tool's name it makes the
/// namespaced name (at most 60 characters).
pub const MAX_SERVER_NAME: usize = 24;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 600_000;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("upstream servers file: {0}")]
    Json(String),
    #[error("upstream server `{0}` appears twice")]
    Duplicate(String),
    #[error(
        "upstream server name `{0}`: 1-{MAX_SERVER_NAME} of lowercase letters, digits and `-`, starting with a letter or digit"
    )]
    Name(String),
    #[error("upstream server `{0}`: {1}")]
    Server(String, String),
}

/// Seed 003's categories. `network` servers get network access only through
/// their policy; `external` servers are remote (`url`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Core,
    System,
    Network,
    External,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    category: Option<Category>,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    env_allow: Vec<String>,
    policy: Option<String>,
    workspace: Option<PathBuf>,
    timeout_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Set inside the server's sandbox.
    pub env: BTreeMap<String, String>,
    pub category: Category,
    pub enabled: bool,
    /// Passed from the daemon's environment when set there; nothing else is.
    pub env_allow: Vec<String>,
    /// The role policy its sandbox is built from (default `upstream`).
    pub policy: String,
    /// Its workspace (default: STATE/upstreams/NAME).
    pub workspace: Option<PathBuf>,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// In the file's order.
    pub servers: Vec<UpstreamServer>,
}

/// `mcpServers` as an ordered list of entries.
struct Ordered(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of servers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    entries.push((k, v));
                }
                Ok(Ordered(entries))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(rename = "mcpServers")]
    servers: Ordered,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= MAX_SERVER_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub fn parse(text: &str) -> Result<UpstreamConfig, ConfigError> {
    let file: File = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
    let mut servers: Vec<UpstreamServer> = Vec::new();
    for (name, value) in file.servers.0 {
        if servers.iter().any(|s| s.name == name) {
            return Err(ConfigError::Duplicate(name));
        }
        if !valid_name(&name) {
            return Err(ConfigError::Name(name));
        }
        let raw: RawServer = serde_json::from_value(value)
            .map_err(|e| ConfigError::Server(name.clone(), e.to_string()))?;
        servers.push(server(name, raw)?);
    }
    Ok(UpstreamConfig { servers })
}

fn server(name: String, raw: RawServer) -> Result<UpstreamServer, ConfigError> {
    let fail = |why: String| Err(ConfigError::Server(name.clone(), why));
    if raw.url.is_some() || raw.category == Some(Category::External) {
        return fail(
            "remote servers (`url`, category external) are not supported yet; run the server with `command`".into(),
        );
    }
    let Some(command) = raw.command.filter(|c| !c.is_empty()) else {
        return fail("`command` is missing".into());
    };
    if let Some(bad) = raw
        .env
        .keys()
        .chain(raw.env_allow.iter())
        .find(|k| !valid_env_name(k))
    {
        return fail(format!("`{bad}` is not an environment variable name"));
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
        return fail(format!("timeout_ms must be 1-{MAX_TIMEOUT_MS}"));
    }
    if let Some(ws) = &raw.workspace
        && !ws.is_absolute()
    {
        return fail(format!("workspace {} must be absolute", ws.display()));
    }
    let category = raw.category.unwrap_or(Category::System);
    if category == Category::Core && !raw.enabled {
        return fail("a core server is always loaded and cannot be disabled (seed 003)".into());
    }
    if category == Category::Network && raw.policy.is_none() {
        return fail(
            "category network needs a `policy` that allows network (the default `upstream` has none)".into(),
        );
    }
    Ok(UpstreamServer {
        name,
        command,
        args: raw.args,
        env: raw.env,
        category,
        enabled: raw.enabled,
        env_allow: raw.env_allow,
        policy: raw.policy.unwrap_or_else(|| "upstream".into()),
        workspace: raw.workspace,
        timeout: Duration::from_millis(timeout_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_keep_the_files_order_and_defaults() {
        let text = r#"{"mcpServers": {
            "zeta": {"command": "z", "args": ["--x"], "env": {"K": "v"}, "env_allow": ["LANG"]},
            "alpha": {"command": "a", "category": "system", "enabled": false, "timeout_ms": 500}
        }}"#;
        let config = parse(text).unwrap();
        assert_eq!(
            config.servers,
            [
                UpstreamServer {
                    name: "zeta".into(),
                    command: "z".into(),
                    args: vec!["--x".into()],
                    env: [("K".to_string(), "v".to_string())].into(),
                    category: Category::System,
                    enabled: true,
                    env_allow: vec!["LANG".into()],
                    policy: "upstream".into(),
                    workspace: None,
                    timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
                },
                UpstreamServer {
                    name: "alpha".into(),
                    command: "a".into(),
                    args: vec![],
                    env: BTreeMap::new(),
                    category: Category::System,
                    enabled: false,
                    env_allow: vec![],
                    policy: "upstream".into(),
                    workspace: None,
                    timeout: Duration::from_millis(500),
                },
            ]
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            ("{}", "missing field `mcpServers`"),
            (r#"{"mcpServers": {}, "x": 1}"#, "unknown field `x`"),
            (
                r#"{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}"#,
                "appears twice",
            ),
            (
                r#"{"mcpServers": {"A_b": {"command": "x"}}}"#,
                "upstream server name `A_b`",
            ),
            (
                r#"{"mcpServers": {"a": {"args": []}}}"#,
                "`command` is missing",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "https://x"}}}"#,
                "not supported yet",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "colour": 1}}}"#,
                "unknown field `colour`",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "env": {"A B": "1"}}}}"#,
                "not an environment variable name",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "timeout_ms": 0}}}"#,
                "timeout_ms must be",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "category": "network"}}}"#,
                "needs a `policy`",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "workspace": "rel"}}}"#,
                "must be absolute",
            ),
            ("{\"mcpServers\": [", "line 1"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "category": "core", "enabled": false}}}"#,
                "cannot be disabled",
            ),
        ];
        for (text, wanted) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
