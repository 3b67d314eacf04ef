//! Noticing at once that a remote server's session is gone. rmcp's
//! streamable HTTP client retries a broken event stream on its own and
//! hands a session-level refusal (npm server-everything answers HTTP 400
//! "No valid session ID provided" with a JSON-RPC error of null id) to
//! nobody, so a call would wait out its timeout. The HTTP client is
//! wrapped here: what shows the session is gone (a connection refused, a
//! 404 or 400 for the session, such an error) is signalled to the
//! supervisor, which marks the server `down` and connects afresh; an event
//! stream that ends is signalled too (the supervisor pings to tell a
//! server that closed a stream from one that went away).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::Sse;
use tokio::sync::mpsc;

/// What the wrapped client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Signal {
    /// The session is gone: the reason, as the end of "down: ...".
    Lost(String),
    /// An event stream of the session ended (it may be reopened).
    StreamEnded,
}

/// One connection's health: signals for the supervisor, and a flag calls
/// read to tell a lost session from a failed request.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    signals: mpsc::Sender<Signal>,
    lost: Arc<AtomicBool>,
}

/// The supervisor's end.
#[derive(Debug)]
pub(super) struct Signals(mpsc::Receiver<Signal>);

impl Signals {
    /// The next signal; never, once every sender is gone.
    pub(super) async fn next(&mut self) -> Signal {
        match self.0.recv().await {
            Some(signal) => signal,
            None => std::future::pending().await,
        }
    }
}

impl Health {
    pub(super) fn new() -> (Self, Signals) {
        let (signals, rx) = mpsc::channel(8);
        let health = Self {
            signals,
            lost: Arc::new(AtomicBool::new(false)),
        };
        (health, Signals(rx))
    }

    /// Whether the session was found gone (calls then say the server is
    /// restarting rather than what the transport said).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    pub(crate) fn lost(&self, reason: String) {
        self.lost.store(true, Ordering::Release);
        // A full queue already holds a signal the supervisor acts on.
        let _ = self.signals.try_send(Signal::Lost(reason));
    }

    fn stream_ended(&self) {
        let _ = self.signals.try_send(Signal::StreamEnded);
    }

    /// Looks at an HTTP client's error: one that means the server cannot
    /// be reached or no longer knows the session marks it lost.
    fn judge<E: std::error::Error + Send + Sync + 'static>(&self, error: &StreamableHttpError<E>) {
        if let Some(reason) = lost_reason(error) {
            self.lost(reason);
        }
    }
}

/// Why `error` means the session is gone, if it does.
fn lost_reason<E: std::error::Error + Send + Sync + 'static>(
    error: &StreamableHttpError<E>,
) -> Option<String> {
    match error {
        StreamableHttpError::SessionExpired => {
            Some("the server no longer knows the session (HTTP 404)".into())
        }
        StreamableHttpError::Client(e) => {
            let e: &(dyn std::error::Error + 'static) = e;
            let e = e.downcast_ref::<reqwest::Error>()?;
            if e.is_connect() {
                Some(format!("cannot be reached: {}", super::remote::chain(e)))
            } else {
                match e.status() {
                    Some(s)
                        if s == reqwest::StatusCode::NOT_FOUND
                            || s == reqwest::StatusCode::BAD_REQUEST =>
                    {
                        Some(format!("the server no longer knows the session (HTTP {s})"))
                    }
                    _ => None,
                }
            }
        }
        _ => None,
    }
}

/// An HTTP client whose failures are watched.
#[derive(Debug, Clone)]
pub(super) struct Watched<C> {
    inner: C,
    health: Health,
}

impl<C> Watched<C> {
    pub(super) fn new(inner: C, health: Health) -> Self {
        Self { inner, health }
    }
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for Watched<C>
where
    C::Error: 'static,
{
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let attached = session_id.is_some();
        let answer = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.posted(attached, answer)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let attached = session_id.is_some();
        let answer = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.posted(attached, answer)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
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
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let stream = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        self.opened(stream)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let stream = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.opened(stream)
    }
}

impl<C: StreamableHttpClient> Watched<C>
where
    C::Error: 'static,
{
    /// A POST's answer, judged. A JSON-RPC error of null id to a message
    /// of the session answers no request: the server refused the session
    /// itself (server-everything's 400); it becomes an error here, so the
    /// call fails at once instead of waiting for an answer never coming.
    fn posted(
        &self,
        attached: bool,
        answer: Result<StreamableHttpPostResponse, StreamableHttpError<C::Error>>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<C::Error>> {
        match answer {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(e), _))
                if attached && e.id.is_none() =>
            {
                let why = e.error.message.trim_end_matches('.').to_string();
                self.health
                    .lost(format!("the server no longer knows the session: {why}"));
                Err(StreamableHttpError::UnexpectedServerResponse(
                    format!("the server refused the session: {why}").into(),
                ))
            }
            Err(e) => {
                self.health.judge(&e);
                Err(e)
            }
            ok => ok,
        }
    }

    /// An event stream, watched to its end.
    fn opened(
        &self,
        stream: Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<C::Error>>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<C::Error>> {
        match stream {
            Ok(stream) => {
                let health = self.health.clone();
                let ended = futures::stream::once(async move {
                    health.stream_ended();
                    None
                });
                Ok(stream
                    .map(Some)
                    .chain(ended)
                    .filter_map(std::future::ready)
                    .boxed())
            }
            Err(e) => {
                self.health.judge(&e);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_refusal_is_a_loss() {
        let expired: StreamableHttpError<reqwest::Error> = StreamableHttpError::SessionExpired;
        assert_eq!(
            lost_reason(&expired).as_deref(),
            Some("the server no longer knows the session (HTTP 404)")
        );
        let other: StreamableHttpError<reqwest::Error> =
            StreamableHttpError::UnexpectedServerResponse("HTTP 500".into());
        assert_eq!(lost_reason(&other), None);
        let (health, _signals) = Health::new();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let watched = Watched::new(reqwest::Client::new(), health.clone());
        let answer: rmcp::model::ServerJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": null,
             "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}
        ))
        .unwrap();
        let judged = watched.posted(true, Ok(StreamableHttpPostResponse::Json(answer, None)));
        assert!(judged.is_err());
        assert!(health.is_lost());
    }

    /// Found by tests/python/test_oauth_login.py: after `tools logout` the
    /// server stayed `up`, each call refused. The session ends now: the
    /// supervisor is told, the server is down, and a call says why.
    #[tokio::test(flavor = "current_thread")]
    async fn a_logout_ends_the_session_and_calls_say_to_log_in() {
        use crate::upstream::config::parse;
        use crate::upstream::error::UpstreamError;
        use crate::upstream::registry::{ServerStatus, Upstreams};
        let config = r#"{"mcpServers": {"docs": {"url": "https://example.com/mcp", "oauth": {}}}}"#;
        let upstreams = Upstreams::new(parse(config).unwrap());
        let needs_login = super::super::oauth::OAuthError::LoginNeeded("docs".into()).to_string();
        // No session: nothing to end.
        upstreams.end_session("docs", &needs_login);
        assert_eq!(upstreams.slots[0].read().status, ServerStatus::Starting);
        let (health, mut signals) = Health::new();
        upstreams.slots[0].write().health = Some(health.clone());
        upstreams.slots[0].write().status = ServerStatus::Up {
            pid: None,
            protocol_version: "2025-11-25".into(),
        };
        upstreams.end_session("docs", &needs_login);
        assert!(health.is_lost());
        assert_eq!(signals.next().await, Signal::Lost(needs_login.clone()));
        {
            let state = upstreams.slots[0].read();
            assert!(state.peer.is_none() && state.health.is_none());
            assert_eq!(
                state.status,
                ServerStatus::Down {
                    reason: needs_login.clone()
                }
            );
        }
        let refused = upstreams
            .call("docs", "t", Default::default())
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "upstream server `docs` is not authorized: an operator must run \
             `substrat-sandbox tools login docs`"
        );
        // Down for another reason, or starting: restarting.
        upstreams.slots[0].write().status = ServerStatus::Down {
            reason: "cannot be reached".into(),
        };
        let refused = upstreams.call("docs", "t", Default::default()).await;
        assert!(matches!(refused, Err(UpstreamError::NotRunning(_))));
    }
}
