//! OAuth 2.1 for remote servers (issue 41), done by the broker (never a
//! sandbox): rmcp's `auth` feature (its AuthorizationManager, the
//! `oauth2` crate below it) for every protocol step; ours are the token
//! file (`store`), the reactions to 401 and 403 (`reactive`), the loopback
//! redirect and approval (`flow`, `login`).
//!
//! Split: the daemon holds the servers file and the secrets, so it does
//! every step; `tools login SERVER` only asks it to begin (it answers the
//! URL to open and listens on 127.0.0.1 for the redirect) and waits for
//! the end. Tokens go to STATE/oauth/SERVER.json (0600 in 0700) and
//! nowhere else: not in replies, logs or errors.

use rmcp::transport::auth::{AuthClient, OAuthClientConfig};
use std::path::PathBuf;
pub mod flow;
pub mod login;
mod reactive;
pub mod store;

pub use flow::{OAuthError, Variables};
pub use reactive::OAuthHttp;

use crate::upstream::oauth::{OAuthConfig, OAuthGrant};
use reactive::Authorizer;

/// Where a connection's OAuth state lives and who approves.
#[derive(Debug, Clone, Default)]
pub struct OAuthContext {
    /// The server's name (its token file's).
    pub server: String,
    /// STATE/oauth, or none: tokens in memory only.
    pub token_dir: Option<PathBuf>,
    /// Secrets given by the caller before the daemon's environment.
    pub variables: Variables,
    /// Approve the code flow without a person (`flow::auto_approve`).
    pub auto_approve: bool,
}

impl OAuthContext {
    /// The daemon's: tokens from `tools login` in STATE/oauth.
    pub fn daemon(state_dir: &std::path::Path, server: &str) -> Self {
        Self {
            server: server.to_string(),
            token_dir: Some(store::token_dir(state_dir)),
            variables: Variables::default(),
            auto_approve: false,
        }
    }
}

/// The HTTP client of a connection to `url`: the daemon's stored tokens
/// loaded (and refreshed, written back) by rmcp's manager.
pub async fn http_client(
    url: &str,
    config: &OAuthConfig,
    context: &OAuthContext,
    http: reqwest::Client,
) -> Result<OAuthHttp, OAuthError> {
    // Client credentials buy a token at each start: nothing on disk.
    let store = match config.grant {
        OAuthGrant::AuthorizationCode => context
            .token_dir
            .as_ref()
            .map(|dir| store::FileStore::new(dir, &context.server)),
        OAuthGrant::ClientCredentials => None,
    };
    let stored = store.as_ref().map(|s| s.read()).transpose()?.flatten();
    let mut manager = flow::manager(url, store).await?;
    // An approval without a person still names a port of ours.
    let loopback = match context.auto_approve {
        true => std::net::TcpListener::bind(("127.0.0.1", 0)).ok(),
        false => None,
    };
    let port = loopback
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map_or(0, |a| a.port());
    let redirect_uri = login::loopback_redirect_uri(port);
    if stored.is_some() && manager.initialize_from_store().await? {
        // rmcp configures a stored client by id alone: a confidential
        // client's refresh needs its secret too.
        if let (Some(id), Some(var)) = (&config.client_id, &config.client_secret_env) {
            let client = OAuthClientConfig::new(id.clone(), redirect_uri.clone())
                .with_client_secret(context.variables.get(var)?);
            manager.configure_client(client)?;
        }
    }
    let authorizer = Authorizer {
        server: context.server.clone(),
        url: url.to_string(),
        config: config.clone(),
        variables: context.variables.clone(),
        auto_approve: context.auto_approve,
        redirect_uri,
        _loopback: loopback,
    };
    Ok(OAuthHttp::new(AuthClient::new(http, manager), authorizer))
}
