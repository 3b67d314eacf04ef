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

pub use super::remote::{RemoteServer, RemoteTransport};

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
    transport: Option<RemoteTransport>,
    bearer_token_env: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    header_env: BTreeMap<String, String>,
    oauth: Option<super::oauth::OAuthConfig>,
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
    pub source: ServerSource,
    pub category: Category,
    pub enabled: bool,
    pub timeout: Duration,
}

/// Where a server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSource {
    /// A command the daemon starts in a sandbox of its own, spoken to over
    /// its stdio.
    Local(LocalServer),
    /// A server elsewhere, reached over HTTP by the broker.
    Remote(RemoteServer),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalServer {
    pub command: String,
    pub args: Vec<String>,
    /// Set inside the server's sandbox.
    pub env: BTreeMap<String, String>,
    /// Passed from the daemon's environment when set there; nothing else is.
    pub env_allow: Vec<String>,
    /// The role policy its sandbox is built from (default `upstream`).
    pub policy: String,
    /// Its workspace (default: STATE/upstreams/NAME).
    pub workspace: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// In the file's order.
    pub servers: Vec<UpstreamServer>,
}

impl UpstreamConfig {
    /// The variables remote servers' credentials are read from
    /// (`bearer_token_env`, `header_env`): the daemon's secrets.
    pub fn credential_env(&self) -> Vec<String> {
        let mut names = Vec::new();
        for server in &self.servers {
            if let ServerSource::Remote(remote) = &server.source {
                names.extend(remote.bearer_token_env.iter().cloned());
                names.extend(remote.header_env.values().cloned());
                if let Some(oauth) = &remote.oauth {
                    names.extend(oauth.secret_env().cloned());
                }
            }
        }
        names
    }
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
    let fail = |why: String| ConfigError::Server(name.clone(), why);
    let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
        return Err(fail(format!("timeout_ms must be 1-{MAX_TIMEOUT_MS}")));
    }
    let remote = raw.url.is_some();
    let category = raw.category.unwrap_or(if remote {
        Category::External
    } else {
        Category::System
    });
    if category == Category::Core && !raw.enabled {
        return Err(fail(
            "a core server is always loaded and cannot be disabled (seed 003)".into(),
        ));
    }
    let enabled = raw.enabled;
    let source = if remote {
        ServerSource::Remote(remote_source(raw, category).map_err(fail)?)
    } else {
        ServerSource::Local(local_source(raw, category).map_err(fail)?)
    };
    Ok(UpstreamServer {
        name,
        source,
        category,
        enabled,
        timeout: Duration::from_millis(timeout_ms),
    })
}

fn local_source(raw: RawServer, category: Category) -> Result<LocalServer, String> {
    if category == Category::External {
        return Err("category external is for remote servers: give a `url`".into());
    }
    let remote_only = [
        ("transport", raw.transport.is_some()),
        ("bearer_token_env", raw.bearer_token_env.is_some()),
        ("headers", !raw.headers.is_empty()),
        ("header_env", !raw.header_env.is_empty()),
        ("oauth", raw.oauth.is_some()),
    ];
    if let Some((field, _)) = remote_only.iter().find(|(_, given)| *given) {
        return Err(format!("`{field}` is for remote servers (`url`)"));
    }
    let Some(command) = raw.command.filter(|c| !c.is_empty()) else {
        return Err("`command` is missing".into());
    };
    if let Some(bad) = raw
        .env
        .keys()
        .chain(raw.env_allow.iter())
        .find(|k| !valid_env_name(k))
    {
        return Err(format!("`{bad}` is not an environment variable name"));
    }
    if let Some(ws) = &raw.workspace
        && !ws.is_absolute()
    {
        return Err(format!("workspace {} must be absolute", ws.display()));
    }
    if category == Category::Network && raw.policy.is_none() {
        return Err(
            "category network needs a `policy` that allows network (the default `upstream` has none)".into(),
        );
    }
    Ok(LocalServer {
        command,
        args: raw.args,
        env: raw.env,
        env_allow: raw.env_allow,
        policy: raw.policy.unwrap_or_else(|| "upstream".into()),
        workspace: raw.workspace,
    })
}

/// A remote server has no sandbox: the fields that shape one are refused
/// rather than ignored.
fn remote_source(raw: RawServer, category: Category) -> Result<RemoteServer, String> {
    if !matches!(category, Category::External | Category::Core) {
        return Err("a remote server (`url`) is of category external or core".into());
    }
    let local_only = [
        ("command", raw.command.is_some()),
        ("args", !raw.args.is_empty()),
        ("env", !raw.env.is_empty()),
        ("env_allow", !raw.env_allow.is_empty()),
        ("policy", raw.policy.is_some()),
        ("workspace", raw.workspace.is_some()),
    ];
    if let Some((field, _)) = local_only.iter().find(|(_, given)| *given) {
        return Err(format!(
            "`{field}` is for servers the daemon runs; a remote server (`url`) runs elsewhere"
        ));
    }
    let mut remote = RemoteServer {
        url: raw.url.unwrap_or_default(),
        transport: raw.transport.unwrap_or_default(),
        bearer_token_env: raw.bearer_token_env,
        headers: raw.headers,
        header_env: raw.header_env,
        oauth: raw.oauth,
    };
    super::remote::check(&mut remote, valid_env_name)?;
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_keep_the_files_order_and_defaults() {
        let text = r#"{"mcpServers": {
            "zeta": {"command": "z", "args": ["--x"], "env": {"K": "v"}, "env_allow": ["LANG"]},
            "alpha": {"command": "a", "category": "system", "enabled": false, "timeout_ms": 500},
            "docs": {"url": "https://mcp.example.com/mcp", "transport": "sse",
                     "bearer_token_env": "DOCS_TOKEN", "headers": {"X-Org": "acme"}}
        }}"#;
        let config = parse(text).unwrap();
        assert_eq!(
            config.servers,
            [
                UpstreamServer {
                    name: "zeta".into(),
                    source: ServerSource::Local(LocalServer {
                        command: "z".into(),
                        args: vec!["--x".into()],
                        env: [("K".to_string(), "v".to_string())].into(),
                        env_allow: vec!["LANG".into()],
                        policy: "upstream".into(),
                        workspace: None,
                    }),
                    category: Category::System,
                    enabled: true,
                    timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
                },
                UpstreamServer {
                    name: "alpha".into(),
                    source: ServerSource::Local(LocalServer {
                        command: "a".into(),
                        args: vec![],
                        env: BTreeMap::new(),
                        env_allow: vec![],
                        policy: "upstream".into(),
                        workspace: None,
                    }),
                    category: Category::System,
                    enabled: false,
                    timeout: Duration::from_millis(500),
                },
                UpstreamServer {
                    name: "docs".into(),
                    source: ServerSource::Remote(RemoteServer {
                        url: "https://mcp.example.com/mcp".into(),
                        transport: RemoteTransport::Sse,
                        bearer_token_env: Some("DOCS_TOKEN".into()),
                        headers: [("X-Org".to_string(), "acme".to_string())].into(),
                        header_env: BTreeMap::new(),
                        oauth: None,
                    }),
                    category: Category::External,
                    enabled: true,
                    timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
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
                r#"{"mcpServers": {"a": {"url": "https://x", "command": "y"}}}"#,
                "`command` is for servers the daemon runs",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "https://x", "category": "system"}}}"#,
                "external or core",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://example.com/mcp"}}}"#,
                "plain http is allowed only to a loopback",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "https://x", "transport": "websocket"}}}"#,
                "unknown variant `websocket`",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "bearer_token_env": "T"}}}"#,
                "`bearer_token_env` is for remote servers",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "category": "external"}}}"#,
                "give a `url`",
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
