//! The streamable HTTP client with OAuth: rmcp's `AuthClient` (the token
//! on each request, refreshed before expiry and once after a 401) inside a
//! layer of ours that reacts to what rmcp leaves to its caller: a 401 with
//! no usable token (authorize: the client credentials grant, or the code
//! flow where approval needs no person) and a 403 `insufficient_scope`
//! (step-up: authorize again for the union of scopes, at most
//! `MAX_SCOPE_UPGRADES` times), then the request once more. The MCP
//! session above never sees it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::auth::{AuthClient, AuthError, AuthorizationManager};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use tokio::sync::Mutex;

use super::flow::{self, OAuthError, Variables};
use crate::upstream::oauth::{OAuthConfig, OAuthGrant};

type HttpError = StreamableHttpError<reqwest::Error>;

/// What a server's authorization needs, shared by its connection's requests.
#[derive(Debug)]
pub struct Authorizer {
    pub server: String,
    pub url: String,
    pub config: OAuthConfig,
    pub variables: Variables,
    /// Approve the code flow without a person (the conformance client);
    /// the daemon has none: `tools login` stores the tokens it uses.
    pub auto_approve: bool,
    pub redirect_uri: String,
    /// Holds the redirect URI's port while approvals may come.
    pub _loopback: Option<std::net::TcpListener>,
}

impl Authorizer {
    async fn authorize(
        &self,
        manager: &Mutex<AuthorizationManager>,
        challenge: &str,
    ) -> Result<(), OAuthError> {
        let mut guard = manager.lock().await;
        if self.config.grant == OAuthGrant::ClientCredentials {
            return self
                .client_credentials(&mut guard, challenge, Vec::new())
                .await;
        }
        if !self.auto_approve {
            return Err(OAuthError::LoginNeeded(self.server.clone()));
        }
        let placeholder = flow::manager(&self.url, None).await?;
        let taken = std::mem::replace(&mut *guard, placeholder);
        let begun = flow::begin_code(
            taken,
            &self.config,
            &self.variables,
            Some(challenge),
            &self.redirect_uri,
        )
        .await;
        let session = match begun {
            Ok(session) => session,
            Err((manager, e)) => {
                *guard = manager;
                return Err(e);
            }
        };
        let callback = match flow::auto_approve(&session.auth_url, &self.redirect_uri).await {
            Ok(callback) => callback,
            Err(e) => {
                *guard = session.auth_manager;
                return Err(e);
            }
        };
        let (manager, result) = match flow::finish_code(session, &callback).await {
            Ok(manager) => (manager, Ok(())),
            Err((manager, e)) => (manager, Err(e)),
        };
        *guard = manager;
        result
    }

    /// The grant with the manager in `slot` (see `client_credentials_apart`).
    async fn client_credentials(
        &self,
        slot: &mut AuthorizationManager,
        challenge: &str,
        extra: Vec<String>,
    ) -> Result<(), OAuthError> {
        let placeholder = flow::manager(&self.url, None).await?;
        let taken = std::mem::replace(slot, placeholder);
        let (manager, result) = flow::client_credentials_apart(
            taken,
            self.config.clone(),
            self.variables.clone(),
            self.url.clone(),
            Some(challenge.to_string()),
            extra,
        )
        .await?;
        *slot = manager;
        result
    }

    async fn step_up(
        &self,
        manager: &Mutex<AuthorizationManager>,
        scope: Option<&str>,
        challenge: &str,
    ) -> Result<(), OAuthError> {
        let Some(scope) = scope else {
            return Err(OAuthError::Other(
                "the server answered 403 insufficient_scope without naming the scope".into(),
            ));
        };
        let mut guard = manager.lock().await;
        if !self.auto_approve && self.config.grant == OAuthGrant::AuthorizationCode {
            return Err(OAuthError::LoginNeeded(self.server.clone()));
        }
        // Counts the attempt and refuses past the limit.
        let auth_url = guard.request_scope_upgrade(scope).await?;
        if self.config.grant == OAuthGrant::ClientCredentials {
            let mut extra = guard.get_current_scopes().await;
            extra.extend(scope.split_whitespace().map(String::from));
            return self.client_credentials(&mut guard, challenge, extra).await;
        }
        let callback = flow::auto_approve(&auth_url, &self.redirect_uri).await?;
        flow::finish_upgrade(&guard, &callback).await
    }
}

/// rmcp's authorized client with our reactions around it.
#[derive(Debug, Clone)]
pub struct OAuthHttp {
    inner: AuthClient<reqwest::Client>,
    authorizer: Arc<Authorizer>,
}

impl OAuthHttp {
    pub fn new(inner: AuthClient<reqwest::Client>, authorizer: Authorizer) -> Self {
        Self {
            inner,
            authorizer: Arc::new(authorizer),
        }
    }

    async fn reacting<T, F, Fut>(&self, call: F) -> Result<T, HttpError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let manager = &self.inner.auth_manager;
        let mut authorized = false;
        // rmcp resets its own count at each token: ours is per request.
        let mut upgrades = 0;
        loop {
            match call().await {
                Err(StreamableHttpError::AuthRequired(e)) if !authorized => {
                    authorized = true;
                    self.authorizer
                        .authorize(manager, &e.www_authenticate_header)
                        .await
                        .map_err(http_error)?;
                }
                Err(StreamableHttpError::InsufficientScope(e))
                    if upgrades < flow::MAX_SCOPE_UPGRADES =>
                {
                    upgrades += 1;
                    let scope = e.get_required_scope().map(String::from);
                    self.authorizer
                        .step_up(manager, scope.as_deref(), &e.www_authenticate_header)
                        .await
                        .map_err(http_error)?;
                }
                other => return other,
            }
        }
    }
}

fn http_error(e: OAuthError) -> HttpError {
    match e {
        OAuthError::Auth(e) => StreamableHttpError::Auth(e),
        other => StreamableHttpError::Auth(AuthError::AuthorizationFailed(other.to_string())),
    }
}

impl StreamableHttpClient for OAuthHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.reacting(|| {
            let (uri, message, session_id) = (uri.clone(), message.clone(), session_id.clone());
            let (auth, headers) = (auth_header.clone(), custom_headers.clone());
            async move {
                self.inner
                    .post_message(uri, message, session_id, auth, headers)
                    .await
            }
        })
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.reacting(|| {
            let (uri, message, session_id) = (uri.clone(), message.clone(), session_id.clone());
            let (auth, headers) = (auth_header.clone(), custom_headers.clone());
            async move {
                self.inner
                    .post_message_with_max_sse_event_size(
                        uri,
                        message,
                        session_id,
                        auth,
                        headers,
                        max_sse_event_size,
                    )
                    .await
            }
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        // Closing needs no new authorization: rmcp's refresh is enough.
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>, HttpError> {
        self.reacting(|| {
            let (uri, session_id, last) = (uri.clone(), session_id.clone(), last_event_id.clone());
            let (auth, headers) = (auth_header.clone(), custom_headers.clone());
            async move {
                self.inner
                    .get_stream(uri, session_id, last, auth, headers)
                    .await
            }
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>, HttpError> {
        self.reacting(|| {
            let (uri, session_id, last) = (uri.clone(), session_id.clone(), last_event_id.clone());
            let (auth, headers) = (auth_header.clone(), custom_headers.clone());
            async move {
                self.inner
                    .get_stream_with_max_sse_event_size(
                        uri,
                        session_id,
                        last,
                        auth,
                        headers,
                        max_sse_event_size,
                    )
                    .await
            }
        })
        .await
    }
}
