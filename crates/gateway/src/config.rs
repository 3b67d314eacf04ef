//! What the gateway is told by the daemon: the real upstream of each API
//! with its key, and each agent's placeholder and budget.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use crate::api::Api;

/// A key that never prints: `Debug` and `Display` show its length only.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Where one API's requests go, with the real key.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Scheme, host and port, and a path prefix if any
    /// (`https://api.anthropic.com`); the request's path is appended.
    pub base_url: String,
    pub key: Secret,
}

/// Why an upstream is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("`{0}` is not an http(s) URL with a host")]
    NotHttp(String),
    #[error(
        "`{0}` is plain http to a host that is not this machine's loopback: the key would cross \
         the network in the clear; use https, or name the endpoint in [gateway.destinations]"
    )]
    Cleartext(String),
    #[error("`{0}` carries a user name or password: give the key as the API's key instead")]
    Credentials(String),
    #[error("`{0}` has a query or fragment: give a base URL the request's path is added to")]
    Query(String),
    #[error("the {0} key is empty")]
    EmptyKey(&'static str),
}

impl Upstream {
    /// An upstream over https, or over http to loopback or to an endpoint
    /// the operator named (`named`: host names or addresses): a model
    /// server on this machine or on a private network the operator vouches
    /// for. The host is the one the HTTP client will connect to, as the
    /// client's own URL parser reads it (never text before an `@`, which a
    /// URL may not carry here at all).
    pub fn new(
        api: Api,
        base_url: &str,
        key: Secret,
        named: &[String],
    ) -> Result<Self, UpstreamError> {
        let text = base_url.trim_end_matches('/').to_string();
        let url = url::Url::parse(&text).map_err(|_| UpstreamError::NotHttp(text.clone()))?;
        let cleartext = match url.scheme() {
            "https" => false,
            "http" => true,
            _ => return Err(UpstreamError::NotHttp(text)),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UpstreamError::Credentials(text));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(UpstreamError::Query(text));
        }
        let Some(host) = url.host() else {
            return Err(UpstreamError::NotHttp(text));
        };
        if cleartext && !is_loopback(&host) && !is_named(&host, named) {
            return Err(UpstreamError::Cleartext(text));
        }
        if key.expose().is_empty() {
            return Err(UpstreamError::EmptyKey(api.as_str()));
        }
        let base_url = url.as_str().trim_end_matches('/').to_string();
        Ok(Self { base_url, key })
    }
}

fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
    }
}

/// Whether the operator named this host: a name compared without case, an
/// address compared as an address (`[::1]`, `::1` and `0:0::1` are one).
fn is_named(host: &url::Host<&str>, named: &[String]) -> bool {
    named.iter().any(|given| {
        let given = given.trim();
        let bare = given
            .strip_prefix('[')
            .and_then(|g| g.strip_suffix(']'))
            .unwrap_or(given);
        match host {
            url::Host::Domain(name) => name.eq_ignore_ascii_case(given),
            url::Host::Ipv4(ip) => bare.parse::<std::net::Ipv4Addr>().is_ok_and(|g| g == *ip),
            url::Host::Ipv6(ip) => bare.parse::<std::net::Ipv6Addr>().is_ok_and(|g| g == *ip),
        }
    })
}

/// Limits on one agent's model use (from its role), or the team's (from
/// the daemon); none: unlimited, but for the requests at once (see
/// `ledger`'s defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_turn: Option<u64>,
    pub tokens_per_day: Option<u64>,
    /// The most output tokens one request may ask for.
    pub tokens_per_request: Option<u64>,
    pub concurrent_requests: Option<u32>,
}

/// The gateway's configuration.
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    pub upstreams: HashMap<Api, Upstream>,
    /// Limits for the whole team (every agent of the daemon together).
    pub team: Budget,
    /// Where request bodies are spooled, and their bounds.
    pub spool: crate::body::SpoolConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Secret {
        Secret::new("sk-real".into())
    }

    fn upstream(url: &str, named: &[&str]) -> Result<Upstream, UpstreamError> {
        let named: Vec<String> = named.iter().map(|n| n.to_string()).collect();
        Upstream::new(Api::OpenAi, url, key(), &named)
    }

    #[test]
    fn keys_never_print_and_cleartext_goes_only_to_loopback_or_named_endpoints() {
        assert_eq!(format!("{:?}", key()), "Secret(7 bytes)");
        assert!(upstream("https://api.anthropic.com/", &[]).is_ok());
        for loopback in [
            "http://127.0.0.1:8080",
            "http://localhost/v1",
            "http://[::1]:9",
            "http://127.0.0.2",
            "http://2130706433",
        ] {
            assert!(upstream(loopback, &[]).is_ok(), "{loopback}");
        }
        assert!(matches!(
            upstream("http://models.internal:8000/v1", &[]),
            Err(UpstreamError::Cleartext(_))
        ));
        assert!(upstream("http://models.internal:8000/v1", &["models.internal"]).is_ok());
        assert!(upstream("http://10.0.0.5:8000", &["10.0.0.5"]).is_ok());
        assert!(upstream("http://[fd00::0:5]", &["[fd00::5]"]).is_ok());
        assert!(matches!(
            upstream("ftp://x", &["x"]),
            Err(UpstreamError::NotHttp(_))
        ));
        assert!(matches!(
            Upstream::new(Api::OpenAi, "https://x", Secret::new(String::new()), &[]),
            Err(UpstreamError::EmptyKey("openai"))
        ));
    }

    /// The host is the one the client connects to, whatever text comes
    /// before it: a loopback or named host written before an `@`, in the
    /// user part, or spelled to fool a text split, is not the host.
    #[test]
    fn the_cleartext_exception_is_decided_on_the_real_host() {
        for sly in [
            "http://localhost:80@evil.example/v1",
            "http://127.0.0.1@evil.example",
            "http://models.internal:x@evil.example",
            "http://evil.example\\@localhost",
            "http://evil.example#@localhost",
        ] {
            let result = upstream(sly, &["models.internal"]);
            assert!(
                matches!(
                    result,
                    Err(UpstreamError::Cleartext(_)
                        | UpstreamError::Credentials(_)
                        | UpstreamError::Query(_))
                ),
                "{sly}: {result:?}"
            );
        }
        assert!(matches!(
            upstream("http://models.internal.evil.example", &["models.internal"]),
            Err(UpstreamError::Cleartext(_))
        ));
        assert!(matches!(
            upstream("https://user:pw@api.openai.com", &[]),
            Err(UpstreamError::Credentials(_))
        ));
    }
}
