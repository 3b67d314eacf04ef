//! The OAuth steps the broker takes, each one rmcp's: discovery (RFC 9728
//! protected-resource metadata from a 401's `resource_metadata` or the
//! well-known URLs, then RFC 8414 / OIDC metadata, then the 2025-03-26
//! fallbacks), client registration (pre-registered, CIMD, RFC 7591),
//! PKCE S256, the code exchange with RFC 8707 `resource`, the client
//! credentials grant (secret or private_key_jwt). What is ours: which
//! secrets come from where, the loopback redirect and the approval
//! without a browser (`auto_approve`).

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::transport::auth::{
    AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationRequest,
    AuthorizationSession, ClientCredentialsConfig, JwtSigningAlgorithm, ScopeUpgradeConfig,
    WWWAuthenticateParams,
};

use super::store::FileStore;
use crate::upstream::oauth::{OAuthConfig, SigningAlgorithm};

/// Step-up re-authorizations after a 403 `insufficient_scope`, beyond the
/// first authorization: three authorizations in all, then the error.
pub const MAX_SCOPE_UPGRADES: u32 = 2;
/// The name the broker registers under (RFC 7591 `client_name`).
const CLIENT_NAME: &str = "substrat-sandbox broker";
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("OAuth: {0}")]
    Auth(#[from] AuthError),
    #[error("variable `{0}` is not set in the daemon's environment")]
    MissingVariable(String),
    #[error("not authorized: run `substrat-sandbox tools login {0}`")]
    LoginNeeded(String),
    #[error("the authorization request was not approved: {0}")]
    NotApproved(String),
    #[error("OAuth: {0}")]
    Other(String),
}

/// Where secrets named in the servers file are read: the caller's own
/// values first (the conformance client's), then the daemon's environment.
#[derive(Clone, Default)]
pub struct Variables(pub BTreeMap<String, String>);

/// Names only: the values are secrets.
impl std::fmt::Debug for Variables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Variables {
    pub fn get(&self, name: &str) -> Result<String, OAuthError> {
        if let Some(value) = self.0.get(name) {
            return Ok(value.clone());
        }
        match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(value),
            _ => Err(OAuthError::MissingVariable(name.to_string())),
        }
    }
}

/// rmcp's manager for the server at `url`, its tokens in `store` (or in
/// memory), with the step-up limit.
pub async fn manager(
    url: &str,
    store: Option<FileStore>,
) -> Result<AuthorizationManager, AuthError> {
    let mut manager = AuthorizationManager::new(url).await?;
    let mut upgrades = ScopeUpgradeConfig::default();
    upgrades.max_upgrade_attempts = MAX_SCOPE_UPGRADES;
    manager.set_scope_upgrade_config(upgrades);
    if let Some(store) = store {
        manager.set_credential_store(store);
    }
    Ok(manager)
}

/// Discovery, registration and the authorization URL: the session to
/// approve (in a browser, or by `auto_approve`). The manager comes back
/// with the error so the caller keeps it.
pub async fn begin_code(
    mut manager: AuthorizationManager,
    config: &OAuthConfig,
    variables: &Variables,
    challenge: Option<&str>,
    redirect_uri: &str,
) -> Result<AuthorizationSession, (AuthorizationManager, OAuthError)> {
    let metadata = match manager.resolve_metadata_from_challenge(challenge).await {
        Ok(resolution) => resolution.metadata,
        Err(e) => return Err((manager, e.into())),
    };
    manager.set_metadata(metadata);
    let mut request = AuthorizationRequest::new(redirect_uri)
        .with_client_name(CLIENT_NAME)
        .with_initial_scope_selection();
    if !config.scopes.is_empty() {
        request = request.with_scopes(config.scopes.clone());
    }
    if let Some(id) = &config.client_id {
        request = request.with_preregistered_client(id.clone());
    }
    if let Some(var) = &config.client_secret_env {
        match variables.get(var) {
            Ok(secret) => request = request.with_client_secret(secret),
            Err(e) => return Err((manager, e)),
        }
    }
    if let Some(url) = &config.client_metadata_url {
        request = request.with_client_metadata_url(url.clone());
    }
    AuthorizationSession::new(manager, request)
        .await
        .map_err(|(manager, e)| (manager, e.into()))
}

/// The code of the redirect to the loopback exchanged for tokens (rmcp
/// checks `state` against the session's and `iss` against the issuer).
pub async fn finish_code(
    session: AuthorizationSession,
    callback_url: &str,
) -> Result<AuthorizationManager, (AuthorizationManager, OAuthError)> {
    match session.handle_callback_url(callback_url).await {
        Ok(_) => Ok(session.auth_manager),
        Err(e) => Err((session.auth_manager, e.into())),
    }
}

/// A step-up's code exchanged by the manager that made its URL.
pub async fn finish_upgrade(
    manager: &AuthorizationManager,
    callback_url: &str,
) -> Result<(), OAuthError> {
    let callback = AuthorizationCallback::from_redirect_url(callback_url)?;
    manager
        .exchange_code_for_token_with_issuer(
            &callback.code,
            &callback.csrf_token,
            callback.issuer.as_deref(),
        )
        .await?;
    Ok(())
}

/// The client credentials grant: discovery, then a token for the scopes
/// configured (else the challenge's) and `extra` (a step-up's).
pub async fn client_credentials(
    manager: &mut AuthorizationManager,
    config: &OAuthConfig,
    variables: &Variables,
    resource: &str,
    challenge: Option<&str>,
    extra: &[String],
) -> Result<(), OAuthError> {
    let resolution = manager.resolve_metadata_from_challenge(challenge).await?;
    manager.set_metadata(resolution.metadata);
    let mut scopes = config.scopes.clone();
    if scopes.is_empty()
        && let Some(challenge) = challenge
        && let Ok(base) = url::Url::parse(resource)
        && let Some(scope) = WWWAuthenticateParams::parse(challenge, &base).scope
    {
        scopes = scope.split_whitespace().map(String::from).collect();
    }
    for scope in extra {
        if !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    let client_id = config
        .client_id
        .clone()
        .ok_or_else(|| OAuthError::Other("client_credentials needs a client_id".into()))?;
    let credentials = match (&config.client_secret_env, &config.private_key_env) {
        (Some(var), _) => ClientCredentialsConfig::ClientSecret {
            client_id,
            client_secret: variables.get(var)?,
            scopes,
            resource: Some(resource.to_string()),
        },
        (None, Some(var)) => ClientCredentialsConfig::PrivateKeyJwt {
            client_id,
            signing_key: variables.get(var)?.into_bytes(),
            signing_algorithm: algorithm(config.signing_algorithm),
            token_endpoint_audience: None,
            scopes,
            resource: Some(resource.to_string()),
        },
        (None, None) => {
            return Err(OAuthError::Other(
                "client_credentials needs client_secret_env or private_key_env".into(),
            ));
        }
    };
    manager.validate_client_credentials_metadata(&credentials)?;
    manager.configure_client_credentials(&credentials)?;
    manager.exchange_client_credentials(&credentials).await?;
    Ok(())
}

/// `client_credentials` with the manager moved in and out: rmcp 3.9's
/// exchange with private_key_jwt is not `Send` (it holds a
/// form_urlencoded::Serializer across an await), so it runs to its end on
/// a blocking thread of the runtime instead of in the connection's task.
pub async fn client_credentials_apart(
    mut manager: AuthorizationManager,
    config: OAuthConfig,
    variables: Variables,
    resource: String,
    challenge: Option<String>,
    extra: Vec<String>,
) -> Result<(AuthorizationManager, Result<(), OAuthError>), OAuthError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        runtime.block_on(async move {
            let result = client_credentials(
                &mut manager,
                &config,
                &variables,
                &resource,
                challenge.as_deref(),
                &extra,
            )
            .await;
            (manager, result)
        })
    })
    .await
    .map_err(|e| OAuthError::Other(format!("the client credentials grant failed: {e}")))
}

fn algorithm(configured: Option<SigningAlgorithm>) -> JwtSigningAlgorithm {
    match configured.unwrap_or(SigningAlgorithm::RS256) {
        SigningAlgorithm::RS256 => JwtSigningAlgorithm::RS256,
        SigningAlgorithm::RS384 => JwtSigningAlgorithm::RS384,
        SigningAlgorithm::RS512 => JwtSigningAlgorithm::RS512,
        SigningAlgorithm::ES256 => JwtSigningAlgorithm::ES256,
        SigningAlgorithm::ES384 => JwtSigningAlgorithm::ES384,
    }
}

/// Approves without a browser, where the authorization server approves
/// at once (the conformance suite's do): one GET of the authorization URL,
/// its redirect not followed; the `Location` must lead to `redirect_uri`
/// and is the callback URL, as a browser would have brought it to the
/// loopback listener.
pub async fn auto_approve(auth_url: &str, redirect_uri: &str) -> Result<String, OAuthError> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(HTTP_TIMEOUT)
        .build()
        .map_err(|e| OAuthError::Other(format!("cannot make an HTTP client: {e}")))?;
    let response = client
        .get(auth_url)
        .send()
        .await
        .map_err(|e| OAuthError::NotApproved(format!("GET of the authorization URL: {e}")))?;
    let status = response.status();
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .filter(|_| status.is_redirection())
        .ok_or_else(|| {
            OAuthError::NotApproved(format!(
                "the authorization server answered {status}, not a redirect"
            ))
        })?;
    let base = url::Url::parse(auth_url).map_err(AuthError::from)?;
    let callback = base.join(location).map_err(AuthError::from)?;
    if !same_endpoint(&callback, redirect_uri) {
        return Err(OAuthError::NotApproved(
            "the authorization server redirected elsewhere than the redirect URI".into(),
        ));
    }
    Ok(callback.into())
}

/// Scheme, host, port and path of `url` are the redirect URI's.
pub fn same_endpoint(url: &url::Url, redirect_uri: &str) -> bool {
    let Ok(redirect) = url::Url::parse(redirect_uri) else {
        return false;
    };
    url.scheme() == redirect.scheme()
        && url.host() == redirect.host()
        && url.port_or_known_default() == redirect.port_or_known_default()
        && url.path() == redirect.path()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callback_must_come_back_to_the_loopback() {
        let uri = "http://127.0.0.1:4321/callback";
        let ok = url::Url::parse("http://127.0.0.1:4321/callback?code=x&state=y").unwrap();
        assert!(same_endpoint(&ok, uri));
        for bad in [
            "http://127.0.0.1:4322/callback?code=x",
            "http://evil.example/callback?code=x",
            "http://127.0.0.1:4321/other?code=x",
            "https://127.0.0.1:4321/callback?code=x",
        ] {
            assert!(!same_endpoint(&url::Url::parse(bad).unwrap(), uri), "{bad}");
        }
    }

    #[test]
    fn variables_given_come_before_the_environment() {
        let given = Variables([("A_SECRET".to_string(), "v".to_string())].into());
        assert_eq!(given.get("A_SECRET").unwrap(), "v");
        assert!(matches!(
            given.get("SURELY_NOT_SET_41"),
            Err(OAuthError::MissingVariable(_))
        ));
    }
}
