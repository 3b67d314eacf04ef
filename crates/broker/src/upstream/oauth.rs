//! A remote server's `oauth` entry (issue 41): how the broker obtains an
//! access token for it by OAuth 2.1 as the MCP authorization specification
//! describes (the flows themselves are rmcp's, run by the supervisor).
//! Secrets are named by environment variable only, as `bearer_token_env`:
//! the servers file holds no credential.
//!
//! ```json
//! "oauth": {"client_id": "app", "client_secret_env": "APP_SECRET",
//!           "scopes": ["files:read"], "grant": "authorization_code"}
//! ```
//!
//! Pure: what the entry says and whether it is acceptable.

use serde::Deserialize;

/// How a token is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OAuthGrant {
    /// A person approves once (`tools login SERVER`); the daemon keeps the
    /// tokens and refreshes them.
    #[default]
    AuthorizationCode,
    /// The daemon is the client itself (machine to machine): a client
    /// secret or a signed JWT (private_key_jwt) buys each token.
    ClientCredentials,
}

/// The JWT algorithms of `private_key_jwt` (those rmcp signs with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SigningAlgorithm {
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
}

impl SigningAlgorithm {
    /// The name in a JWT header (and MCP_CONFORMANCE_CONTEXT).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Self::RS256,
            "RS384" => Self::RS384,
            "RS512" => Self::RS512,
            "ES256" => Self::ES256,
            "ES384" => Self::ES384,
            _ => return None,
        })
    }
}

/// The `oauth` object of a remote server.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// A client id registered with the authorization server beforehand.
    /// Without it: a client ID metadata document (`client_metadata_url`)
    /// where the server supports them, else dynamic registration (RFC 7591).
    pub client_id: Option<String>,
    /// The variable holding the pre-registered client's secret.
    pub client_secret_env: Option<String>,
    /// An https URL of this client's metadata document (CIMD), used as its
    /// client id by servers that advertise support.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for; empty: those the server's challenge or metadata
    /// name (none when it names none).
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub grant: OAuthGrant,
    /// The variable holding a PEM private key: `client_credentials` with
    /// `private_key_jwt` client authentication (RFC 7523).
    pub private_key_env: Option<String>,
    /// The key's algorithm (default RS256).
    pub signing_algorithm: Option<SigningAlgorithm>,
}

impl OAuthConfig {
    /// The variables holding this entry's secrets.
    pub fn secret_env(&self) -> impl Iterator<Item = &String> {
        self.client_secret_env
            .iter()
            .chain(self.private_key_env.iter())
    }
}

/// Checks an entry; the error says what to change.
pub fn check(oauth: &OAuthConfig, valid_env_name: fn(&str) -> bool) -> Result<(), String> {
    if let Some(bad) = oauth.secret_env().find(|v| !valid_env_name(v)) {
        return Err(format!(
            "oauth: `{bad}` is not an environment variable name"
        ));
    }
    if oauth.client_id.as_deref() == Some("") {
        return Err("oauth: `client_id` is empty".into());
    }
    if oauth.client_secret_env.is_some() && oauth.client_id.is_none() {
        return Err("oauth: `client_secret_env` needs the `client_id` it belongs to".into());
    }
    if oauth.client_secret_env.is_some() && oauth.private_key_env.is_some() {
        return Err("oauth: give `client_secret_env` or `private_key_env`, not both".into());
    }
    if oauth.signing_algorithm.is_some() && oauth.private_key_env.is_none() {
        return Err("oauth: `signing_algorithm` is for `private_key_env`".into());
    }
    if let Some(bad) = oauth.scopes.iter().find(|s| {
        s.is_empty()
            || !s
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    }) {
        return Err(format!(
            "oauth: scope `{bad}` is not a scope token (RFC 6749 3.3)"
        ));
    }
    if let Some(url) = &oauth.client_metadata_url {
        let parsed =
            url::Url::parse(url).map_err(|e| format!("oauth: client_metadata_url: {e}"))?;
        if parsed.scheme() != "https" || parsed.path() == "/" {
            return Err(
                "oauth: client_metadata_url must be an https URL with a path (a client ID metadata document)".into(),
            );
        }
    }
    match oauth.grant {
        OAuthGrant::AuthorizationCode => {
            if oauth.private_key_env.is_some() {
                return Err("oauth: `private_key_env` is for grant `client_credentials`".into());
            }
        }
        OAuthGrant::ClientCredentials => {
            if oauth.client_id.is_none() {
                return Err("oauth: grant `client_credentials` needs `client_id`".into());
            }
            if oauth.client_secret_env.is_none() && oauth.private_key_env.is_none() {
                return Err(
                    "oauth: grant `client_credentials` needs `client_secret_env` or `private_key_env`".into(),
                );
            }
            if oauth.client_metadata_url.is_some() {
                return Err(
                    "oauth: `client_metadata_url` is for grant `authorization_code`".into(),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_name(n: &str) -> bool {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    }

    fn parse(text: &str) -> Result<(), String> {
        let oauth: OAuthConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        check(&oauth, env_name)
    }

    #[test]
    fn entries_are_checked() {
        for ok in [
            r#"{}"#,
            r#"{"client_id": "a", "client_secret_env": "S", "scopes": ["x:y"]}"#,
            r#"{"client_metadata_url": "https://example.com/client.json"}"#,
            r#"{"grant": "client_credentials", "client_id": "a", "client_secret_env": "S"}"#,
            r#"{"grant": "client_credentials", "client_id": "a", "private_key_env": "K",
                "signing_algorithm": "ES256"}"#,
        ] {
            assert_eq!(parse(ok), Ok(()), "{ok}");
        }
        let cases = [
            (r#"{"client_secret": "x"}"#, "unknown field"),
            (r#"{"client_secret_env": "S"}"#, "needs the `client_id`"),
            (
                r#"{"client_id": "a", "client_secret_env": "no-dash"}"#,
                "not an environment",
            ),
            (
                r#"{"grant": "client_credentials", "client_id": "a"}"#,
                "needs `client_secret_env`",
            ),
            (
                r#"{"grant": "client_credentials", "client_secret_env": "S"}"#,
                "needs the `client_id`",
            ),
            (
                r#"{"private_key_env": "K"}"#,
                "is for grant `client_credentials`",
            ),
            (
                r#"{"signing_algorithm": "RS256"}"#,
                "is for `private_key_env`",
            ),
            (r#"{"signing_algorithm": "HS256"}"#, "unknown variant"),
            (
                r#"{"client_metadata_url": "http://example.com/c.json"}"#,
                "https URL",
            ),
            (r#"{"scopes": ["a b"]}"#, "not a scope token"),
            (r#"{"grant": "password"}"#, "unknown variant"),
        ];
        for (text, wanted) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
