//! The older HTTP+SSE transport (MCP 2024-11-05), which rmcp no longer
//! ships: a GET opens an event stream whose first `endpoint` event names
//! the URL to POST each message to; the server's messages arrive as
//! `message` events on the stream. The endpoint must be on the configured
//! server's origin: a server cannot send the broker's credentials elsewhere.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use super::health::Health;
use crate::upstream::sse_events::{Event, EventParser};

/// How long a POST may take: the server answers 202 at once (its answer
/// comes on the stream); some never answer one for a session they do not
/// know (npm server-everything).
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the transport failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SseTransportError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("the server answered with {0}, not an event stream")]
    NotEventStream(String),
    #[error("the stream ended before the server named its endpoint")]
    NoEndpoint,
    #[error("no endpoint within {0:?}")]
    EndpointTimeout(Duration),
    #[error("endpoint `{0}`: {1}")]
    BadEndpoint(String, String),
    #[error("event stream: {0}")]
    Events(#[from] crate::upstream::sse_events::SseError),
}

type Chunks = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// The stream and where to post.
pub(super) struct SseTransport {
    client: reqwest::Client,
    headers: HeaderMap,
    endpoint: reqwest::Url,
    chunks: Chunks,
    parser: EventParser,
    pending: std::collections::VecDeque<Event>,
    health: Health,
}

impl SseTransport {
    /// Opens the stream and waits for the `endpoint` event.
    pub(super) async fn open(
        client: reqwest::Client,
        url: &str,
        headers: HeaderMap,
        max_event: usize,
        timeout: Duration,
        health: Health,
    ) -> Result<Self, SseTransportError> {
        let response = client
            .get(url)
            .headers(headers.clone())
            .header(ACCEPT, "text/event-stream")
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(SseTransportError::Status(response.status()));
        }
        let kind = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no content type")
            .to_string();
        if !kind.starts_with("text/event-stream") {
            return Err(SseTransportError::NotEventStream(kind));
        }
        let base = response.url().clone();
        let mut transport = Self {
            client,
            headers,
            endpoint: base.clone(),
            chunks: Box::pin(response.bytes_stream()),
            parser: EventParser::new(max_event),
            pending: Default::default(),
            health,
        };
        let first = tokio::time::timeout(timeout, transport.next_event())
            .await
            .map_err(|_| SseTransportError::EndpointTimeout(timeout))??;
        match first {
            Some(event) if event.kind == "endpoint" => {
                transport.endpoint = same_origin_endpoint(&base, &event.data)?;
                Ok(transport)
            }
            _ => Err(SseTransportError::NoEndpoint),
        }
    }

    async fn next_event(&mut self) -> Result<Option<Event>, SseTransportError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            match self.chunks.next().await {
                Some(chunk) => self.pending.extend(self.parser.feed(&chunk?)?),
                None => return Ok(None),
            }
        }
    }
}

/// The endpoint, resolved against the stream's URL, on the same scheme,
/// host and port.
fn same_origin_endpoint(
    base: &reqwest::Url,
    given: &str,
) -> Result<reqwest::Url, SseTransportError> {
    let bad = |why: &str| SseTransportError::BadEndpoint(given.to_string(), why.to_string());
    let endpoint = base.join(given.trim()).map_err(|e| bad(&e.to_string()))?;
    if endpoint.origin() != base.origin() {
        return Err(bad("not on the server's origin"));
    }
    Ok(endpoint)
}

impl Transport<RoleClient> for SseTransport {
    type Error = SseTransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let request = self
            .client
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .timeout(POST_TIMEOUT)
            .json(&item);
        let health = self.health.clone();
        async move {
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => {
                    if e.is_connect() {
                        health.lost(format!("cannot be reached: {}", super::remote::chain(&e)));
                    }
                    return Err(e.into());
                }
            };
            let status = response.status();
            if status.is_success() {
                Ok(())
            } else {
                if status == reqwest::StatusCode::NOT_FOUND
                    || status == reqwest::StatusCode::BAD_REQUEST
                {
                    health.lost(format!(
                        "the server no longer knows the session (HTTP {status})"
                    ));
                }
                Err(SseTransportError::Status(status))
            }
        }
    }

    /// The next message; an event that is not one is skipped (and logged),
    /// a broken stream ends the session (the supervisor connects afresh:
    /// a session of this transport lives as long as its stream).
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let event = match self.next_event().await {
                Ok(Some(event)) => event,
                Ok(None) => {
                    self.health.lost("its event stream ended".into());
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "an upstream's event stream broke");
                    self.health.lost(format!("its event stream broke: {e}"));
                    return None;
                }
            };
            if event.kind != "message" {
                continue;
            }
            match serde_json::from_str(&event.data) {
                Ok(message) => return Some(message),
                Err(e) => {
                    tracing::warn!(error = %e, "an upstream sent an event that is not a message")
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_stays_on_the_servers_origin() {
        let base = reqwest::Url::parse("http://127.0.0.1:3001/sse").unwrap();
        let ok = |given: &str| same_origin_endpoint(&base, given).unwrap().to_string();
        assert_eq!(
            ok("/messages/?session_id=ab"),
            "http://127.0.0.1:3001/messages/?session_id=ab"
        );
        assert_eq!(ok("message?s=1"), "http://127.0.0.1:3001/message?s=1");
        assert_eq!(ok("http://127.0.0.1:3001/m"), "http://127.0.0.1:3001/m");
        for bad in [
            "http://evil.example/m",
            "//evil.example/m",
            "https://127.0.0.1:3001/m",
            "http://127.0.0.1:3002/m",
        ] {
            let err = same_origin_endpoint(&base, bad).unwrap_err().to_string();
            assert!(err.contains("not on the server's origin"), "{bad}: {err}");
        }
    }
}
