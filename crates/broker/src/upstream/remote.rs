//! Remote upstream servers (`url`, seed 003's External category): the
//! broker itself is their MCP client, over streamable HTTP or the older
//! HTTP+SSE transport. Their credentials (a bearer token from a variable of
//! the daemon's environment, fixed headers) stay in the daemon: no sandbox
//! is built for a remote server, and no agent's sandbox is given them.
//!
//! Pure: what a configuration entry says and whether it is acceptable. The
//! connection is made by the supervisor.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The MCP transport a remote server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteTransport {
    /// MCP streamable HTTP (protocol 2025-03-26 and later): one endpoint,
    /// POST for messages, answers as JSON or an SSE stream.
    #[default]
    StreamableHttp,
    /// The older HTTP+SSE transport (protocol 2024-11-05): a GET opens an
    /// event stream whose first `endpoint` event names where to POST.
    Sse,
}

/// A remote server's connection settings.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteServer {
    /// http(s)://host[:port]/path; plain http only to a loopback address.
    pub url: String,
    pub transport: RemoteTransport,
    /// Sent as `Authorization: Bearer <value of this variable>`.
    pub bearer_token_env: Option<String>,
    /// Sent with every request as they are.
    pub headers: BTreeMap<String, String>,
    /// Header name -> variable of the daemon's environment holding its value.
    pub header_env: BTreeMap<String, String>,
    /// Tokens by OAuth 2.1 (issue 41) instead of a fixed bearer token.
    pub oauth: Option<super::oauth::OAuthConfig>,
}

/// Header values can be credentials: never printed.
impl std::fmt::Debug for RemoteServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteServer")
            .field("url", &self.url)
            .field("transport", &self.transport)
            .field("bearer_token_env", &self.bearer_token_env)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("header_env", &self.header_env)
            .field("oauth", &self.oauth)
            .finish()
    }
}

/// Headers the transport sets itself; an entry may not replace them.
const RESERVED_HEADERS: [&str; 7] = [
    "host",
    "content-type",
    "content-length",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// Checks a remote entry and puts its URL in normal form (what the daemon
/// connects to, as `tools list` shows it); the error says what to change.
pub fn check(remote: &mut RemoteServer, valid_env_name: fn(&str) -> bool) -> Result<(), String> {
    remote.url = check_url(&remote.url)?;
    let mut names: Vec<String> = Vec::new();
    for name in remote.headers.keys().chain(remote.header_env.keys()) {
        let lower = name.to_ascii_lowercase();
        if !valid_header_name(name) {
            return Err(format!("`{name}` is not an HTTP header name"));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(format!("header `{name}` is set by the transport itself"));
        }
        if lower == "authorization" && remote.bearer_token_env.is_some() {
            return Err("`Authorization` and `bearer_token_env` both set the same header".into());
        }
        if lower == "authorization" && remote.oauth.is_some() {
            return Err("`Authorization` and `oauth` both set the same header".into());
        }
        if names.contains(&lower) {
            return Err(format!("header `{name}` is given twice"));
        }
        names.push(lower);
    }
    if let Some(bad) = remote.headers.values().find(|v| !valid_header_value(v)) {
        let shown: String = bad.chars().take(8).collect();
        return Err(format!(
            "a header value ({shown}...) holds a control character"
        ));
    }
    if let Some(oauth) = &remote.oauth {
        if remote.bearer_token_env.is_some() {
            return Err("give `oauth` or `bearer_token_env`, not both".into());
        }
        if remote.transport == RemoteTransport::Sse {
            return Err(
                "`oauth` needs transport streamable_http (the older SSE transport predates MCP authorization)"
                    .into(),
            );
        }
        super::oauth::check(oauth, valid_env_name)?;
    }
    let variables = remote
        .bearer_token_env
        .iter()
        .chain(remote.header_env.values());
    if let Some(bad) = variables.into_iter().find(|v| !valid_env_name(v)) {
        return Err(format!("`{bad}` is not an environment variable name"));
    }
    Ok(())
}

/// http(s) only, no credentials in the URL (they would be logged), and
/// plain http only to this host: a token must not cross a network in clear.
fn check_url(url: &str) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url `{url}`: {e}"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "url: credentials in the URL are refused (they end up in logs); use bearer_token_env or header_env".into(),
        );
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(format!("url `{url}` has no host")),
    };
    match parsed.scheme() {
        "https" => Ok(parsed.into()),
        "http" if loopback => Ok(parsed.into()),
        "http" => Err(format!(
            "url `{url}`: plain http is allowed only to a loopback address (use https)"
        )),
        other => Err(format!(
            "url `{url}`: scheme `{other}` is not http or https"
        )),
    }
}

/// RFC 9110 token characters.
fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(url: &str) -> RemoteServer {
        RemoteServer {
            url: url.into(),
            transport: RemoteTransport::StreamableHttp,
            bearer_token_env: None,
            headers: BTreeMap::new(),
            header_env: BTreeMap::new(),
            oauth: None,
        }
    }

    fn env_name(n: &str) -> bool {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    }

    #[test]
    fn urls_are_https_or_loopback_http_without_credentials() {
        for ok in [
            "https://mcp.example.com/mcp",
            "http://127.0.0.1:3001/mcp",
            "http://localhost/mcp",
            "http://[::1]:80/sse",
        ] {
            assert_eq!(check(&mut remote(ok), env_name), Ok(()), "{ok}");
        }
        let mut odd = remote("HTTP://127.1:80/a/../mcp");
        assert_eq!(check(&mut odd, env_name), Ok(()));
        assert_eq!(odd.url, "http://127.0.0.1/mcp");
        let cases = [
            ("http://mcp.example.com/mcp", "plain http is allowed only"),
            ("http://10.0.0.1/mcp", "plain http is allowed only"),
            ("ftp://127.0.0.1/x", "scheme `ftp`"),
            ("https://user:pw@example.com/", "credentials in the URL"),
            ("not a url", "url `not a url`"),
            ("file:///etc/passwd", "has no host"),
        ];
        for (url, wanted) in cases {
            let err = check(&mut remote(url), env_name).unwrap_err();
            assert!(err.contains(wanted), "{url}: {err}");
        }
    }

    #[test]
    fn headers_are_checked() {
        let with = |headers: &[(&str, &str)], env: &[(&str, &str)], bearer: Option<&str>| {
            let mut r = remote("https://example.com/mcp");
            r.headers = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r.header_env = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r.bearer_token_env = bearer.map(String::from);
            check(&mut r, env_name)
        };
        assert_eq!(
            with(&[("X-Org", "acme")], &[("X-Api-Key", "KEY")], Some("TOKEN")),
            Ok(())
        );
        let cases = [
            (with(&[("Bad Name", "x")], &[], None), "not an HTTP header"),
            (with(&[("Accept", "x")], &[], None), "set by the transport"),
            (
                with(&[("authorization", "Bearer x")], &[], Some("T")),
                "both set",
            ),
            (with(&[("X-A", "1")], &[("x-a", "V")], None), "given twice"),
            (
                with(&[("X-A", "a\r\nX-B: 1")], &[], None),
                "control character",
            ),
            (with(&[], &[("X-A", "no-dash")], None), "not an environment"),
            (with(&[], &[], Some("")), "not an environment"),
        ];
        for (outcome, wanted) in cases {
            let err = outcome.unwrap_err();
            assert!(err.contains(wanted), "{err}");
        }
    }

    #[test]
    fn debug_never_shows_header_values() {
        let mut r = remote("https://example.com/mcp");
        r.headers.insert("X-Api-Key".into(), "s3cret-value".into());
        assert!(!format!("{r:?}").contains("s3cret"));
    }
}
