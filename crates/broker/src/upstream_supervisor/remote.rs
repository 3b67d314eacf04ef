//! Connecting to a remote server: the broker is its MCP client over HTTP.
//! The credentials are read from the daemon's environment at each start
//! (a rotated token is picked up by a restart) and marked sensitive, so
//! the HTTP stack never prints them.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use super::StartError;
use super::health::{Health, Watched};
use super::oauth::OAuthContext;
use super::sse::SseTransport;
use crate::upstream::config::{RemoteServer, RemoteTransport};

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an SSE server has to name its endpoint.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest event a server may send on an SSE stream (a tool's result
/// travels in one).
pub(super) const MAX_EVENT_BYTES: usize = 16 << 20;

/// Connects and initializes: the daemon's path to a remote server, with
/// its handler (`ListChanged`), and `tools conformance-client`'s, with a
/// bare one. The HTTP client, its headers and credentials are made here.
/// What shows the session gone is signalled through `health` (the
/// supervisor connects afresh: rmcp's own re-initialization after a 404
/// is off, so a restarted server's tools are listed and checked again).
pub(super) async fn connect<H: ClientHandler>(
    remote: &RemoteServer,
    oauth: &OAuthContext,
    handler: H,
    health: &Health,
) -> Result<RunningService<RoleClient, H>, StartError> {
    let client = http_client()?;
    let headers = headers(remote)?;
    let token = match &remote.bearer_token_env {
        Some(name) => Some(variable(name)?),
        None => None,
    };
    match remote.transport {
        RemoteTransport::StreamableHttp => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(remote.url.as_str())
                .custom_headers(headers)
                .max_sse_event_size(MAX_EVENT_BYTES)
                .reinit_on_expired_session(false);
            if let Some(settings) = &remote.oauth {
                let client = super::oauth::http_client(&remote.url, settings, oauth, client)
                    .await
                    .map_err(|e| StartError::Remote(e.to_string()))?;
                let client = Watched::new(client, health.clone());
                let transport = StreamableHttpClientTransport::with_client(client, config);
                return handler.serve(transport).await.map_err(initialize_error);
            }
            if let Some(token) = token {
                config = config.auth_header(token);
            }
            let client = Watched::new(client, health.clone());
            let transport = StreamableHttpClientTransport::with_client(client, config);
            handler.serve(transport).await.map_err(initialize_error)
        }
        RemoteTransport::Sse => {
            let mut headers: HeaderMap = headers.into_iter().collect();
            if let Some(token) = token {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        StartError::Remote("the bearer token is not a valid header value".into())
                    })?;
                value.set_sensitive(true);
                headers.insert(AUTHORIZATION, value);
            }
            let transport = SseTransport::open(
                client,
                &remote.url,
                headers,
                MAX_EVENT_BYTES,
                ENDPOINT_TIMEOUT,
                health.clone(),
            )
            .await
            .map_err(|e| {
                StartError::Remote(format!("cannot open the event stream: {}", chain(&e)))
            })?;
            handler.serve(transport).await.map_err(initialize_error)
        }
    }
}

/// What went wrong, without the transport's type names: for a failed
/// request, the HTTP client's chain of causes (refused, 401, TLS).
fn initialize_error(e: rmcp::service::ClientInitializeError) -> StartError {
    use rmcp::service::ClientInitializeError;
    match e {
        ClientInitializeError::TransportError { error, .. } => {
            // The HTTP client's error is kept as text by the transport's
            // own error, its causes (connection refused, TLS) unchained.
            let inner: &(dyn std::error::Error + 'static) = match error
                .error
                .downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(StreamableHttpError::Client(client)) => client,
                _ => error.error.as_ref(),
            };
            StartError::Remote(format!("cannot initialize: {}", chain(inner)))
        }
        other => StartError::Initialize(Box::new(other)),
    }
}

/// An error and its causes, on one line.
pub(super) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// No redirects (a token must reach only the configured server) and no
/// proxy from the daemon's environment (the operator's URL is the route).
fn http_client() -> Result<reqwest::Client, StartError> {
    // TLS by rustls with ring, installed once per process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(|e| StartError::Remote(format!("cannot make an HTTP client: {e}")))
}

/// The fixed headers and those from variables, all marked sensitive.
fn headers(remote: &RemoteServer) -> Result<HashMap<HeaderName, HeaderValue>, StartError> {
    let mut out = HashMap::new();
    let from_env = remote
        .header_env
        .iter()
        .map(|(name, var)| Ok((name, variable(var)?)));
    let fixed = remote.headers.iter().map(|(n, v)| Ok((n, v.clone())));
    for entry in fixed.chain(from_env) {
        let (name, value): (&String, String) = entry?;
        let bad = || StartError::Remote(format!("header `{name}`: not a valid name or value"));
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
        let mut value = HeaderValue::from_str(&value).map_err(|_| bad())?;
        value.set_sensitive(true);
        out.insert(header, value);
    }
    Ok(out)
}

/// A credential from the daemon's environment; its value is never shown.
fn variable(name: &str) -> Result<String, StartError> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        _ => Err(StartError::MissingVariable(name.to_string())),
    }
}
