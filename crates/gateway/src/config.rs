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
    #[error("`{0}` is not an http(s) URL")]
    NotHttp(String),
    #[error(
        "`{0}` is plain http to a host that is not this machine's loopback: the key would cross \
         the network in the clear; use https, or name the endpoint in [gateway.destinations]"
    )]
    Cleartext(String),
    #[error("the {0} key is empty")]
    EmptyKey(&'static str),
}

impl Upstream {
    /// An upstream over https, or over http to loopback or to an endpoint
    /// the operator named (`cleartext_allowed`): a model server on this
    /// machine or on a private network the operator vouches for.
    pub fn new(
        api: Api,
        base_url: &str,
        key: Secret,
        cleartext_allowed: bool,
    ) -> Result<Self, UpstreamError> {
        let base_url = base_url.trim_end_matches('/').to_string();
        let (cleartext, rest) = if let Some(rest) = base_url.strip_prefix("https://") {
            (false, rest)
        } else if let Some(rest) = base_url.strip_prefix("http://") {
            (true, rest)
        } else {
            return Err(UpstreamError::NotHttp(base_url));
        };
        let host = match rest.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => rest.split(['/', ':']).next().unwrap_or(""),
        };
        if host.is_empty() {
            return Err(UpstreamError::NotHttp(base_url));
        }
        let loopback = matches!(host, "127.0.0.1" | "localhost" | "::1");
        if cleartext && !loopback && !cleartext_allowed {
            return Err(UpstreamError::Cleartext(base_url));
        }
        if key.expose().is_empty() {
            return Err(UpstreamError::EmptyKey(api.as_str()));
        }
        Ok(Self { base_url, key })
    }
}

/// Limits on one agent's model use (from its role); none: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_turn: Option<u64>,
    pub tokens_per_day: Option<u64>,
}

/// The gateway's configuration.
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    pub upstreams: HashMap<Api, Upstream>,
    /// Limits for the whole team (every agent of the daemon together).
    pub team: Budget,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Secret {
        Secret::new("sk-real".into())
    }

    #[test]
    fn keys_never_print_and_cleartext_goes_only_to_loopback_or_named_endpoints() {
        assert_eq!(format!("{:?}", key()), "Secret(7 bytes)");
        assert!(Upstream::new(Api::Anthropic, "https://api.anthropic.com/", key(), false).is_ok());
        assert!(Upstream::new(Api::Gemini, "http://127.0.0.1:8080", key(), false).is_ok());
        assert!(matches!(
            Upstream::new(Api::OpenAi, "http://models.internal:8000/v1", key(), false),
            Err(UpstreamError::Cleartext(_))
        ));
        assert!(Upstream::new(Api::OpenAi, "http://models.internal:8000/v1", key(), true).is_ok());
        assert!(matches!(
            Upstream::new(Api::OpenAi, "ftp://x", key(), true),
            Err(UpstreamError::NotHttp(_))
        ));
        assert!(matches!(
            Upstream::new(Api::OpenAi, "https://x", Secret::new(String::new()), true),
            Err(UpstreamError::EmptyKey("openai"))
        ));
    }
}
