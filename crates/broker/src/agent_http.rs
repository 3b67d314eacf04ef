//! An agent's MCP over streamable HTTP (issue 41), on the same broker
//! socket the stdio relay uses, told apart by the first byte a client
//! sends (an HTTP method starts with an ASCII capital, a JSON-RPC line with
//! `{`), and served with rmcp's streamable HTTP server. Inside the sandbox
//! it is reached on the sandbox's own loopback
//! (`substrat_sandbox::plan::MCP_PORT`, bridged as the model gateway is);
//! who speaks is the socket's agent, as on the line protocol.
//!
//! Before rmcp reads a POST, the line gate's door: the body is bounded
//! (413 past `MAX_BODY`), strict JSON (a duplicate key could be read two
//! ways by two parsers: refused), one message (no batches), and a request
//! that names another agent is refused and audited. Sessions: at most
//! `MAX_SESSIONS` per agent, a new one ends the oldest (each CLI process
//! makes its own, and not every CLI ends it); an idle one ends after
//! `SESSION_IDLE`. Requests carrying a browser `Origin` other than the
//! loopback's, or a `Host` that is not the loopback, are refused by rmcp
//! (DNS rebinding).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::locks::LockAnyway;
use crate::server::AgentHandler;

/// The largest POST body read (the line protocol's longest line).
pub const MAX_BODY: usize = 4 << 20;
/// Live MCP sessions per agent; a new one ends the oldest.
pub const MAX_SESSIONS: usize = 8;
/// An idle session ends after this long.
pub const SESSION_IDLE: Duration = Duration::from_secs(600);
/// A client gets this long to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const SESSION_HEADER: &str = "mcp-session-id";

/// What a new connection to an agent's socket speaks, from its first byte
/// (read without taking it: the server that answers reads it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// JSON-RPC lines (the stdio relay, a direct client): the line gate.
    Lines,
    /// HTTP/1.1 (MCP streamable HTTP through the sandbox's bridge).
    Http,
}

impl Speaks {
    /// An HTTP request line starts with its method, ASCII capitals; a
    /// JSON-RPC line with `{` (or blank space). A client that closes
    /// before a byte is the line gate's to end.
    pub fn of_first_byte(first: Option<u8>) -> Self {
        match first {
            Some(b'A'..=b'Z') => Self::Http,
            _ => Self::Lines,
        }
    }

    /// Waits for the first byte of `stream` and peeks at it.
    pub async fn of(stream: &tokio::net::UnixStream) -> std::io::Result<Self> {
        let mut first = [0u8; 1];
        loop {
            stream.readable().await?;
            let peeked = stream.try_io(Interest::READABLE, || {
                rustix::net::recv(stream, &mut first[..], rustix::net::RecvFlags::PEEK)
                    .map_err(std::io::Error::from)
            });
            match peeked {
                Ok((0, _)) => return Ok(Self::of_first_byte(None)),
                Ok(_) => return Ok(Self::of_first_byte(Some(first[0]))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

type Service = StreamableHttpService<AgentHandler, LocalSessionManager>;
type Answer = Response<BoxBody<Bytes, Infallible>>;

/// One agent's MCP endpoint: its sessions outlive connections (a client
/// opens several), and end with it (dropped when the agent's socket stops
/// being served: removed, or the daemon stopping).
pub struct AgentHttp {
    broker: Arc<Broker>,
    agent_id: String,
    /// The agent's name, read once (an agent's row never changes).
    agent_name: OnceLock<String>,
    sessions: Arc<LocalSessionManager>,
    service: Service,
    /// Session ids in the order they were made (some may have ended).
    made: Mutex<VecDeque<String>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for AgentHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHttp")
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

impl Drop for AgentHttp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl AgentHttp {
    pub fn new(broker: Arc<Broker>, agent_id: String) -> Self {
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(SESSION_IDLE);
        let sessions = Arc::new(sessions);
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(["127.0.0.1", "localhost", "::1", "[::1]"])
            .with_allowed_origins(["http://127.0.0.1:*", "http://localhost:*"])
            .enforce_origin_validation()
            .with_max_request_body_bytes(MAX_BODY);
        let stop = config.cancellation_token.clone();
        let (factory_broker, factory_agent) = (broker.clone(), agent_id.clone());
        let service = StreamableHttpService::new(
            move || {
                Ok(AgentHandler::new(
                    factory_broker.clone(),
                    factory_agent.clone(),
                ))
            },
            sessions.clone(),
            config,
        );
        Self {
            broker,
            agent_id,
            agent_name: OnceLock::new(),
            sessions,
            service,
            made: Mutex::new(VecDeque::new()),
            stop,
        }
    }

    /// Serves one connection (HTTP/1.1, kept alive) until the client
    /// leaves.
    pub async fn serve_connection<S>(self: &Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let this = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let this = this.clone();
            async move { Ok::<_, Infallible>(this.answer(request).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT);
        let io = hyper_util::rt::TokioIo::new(stream);
        let _ = builder.serve_connection(io, service).await;
    }

    async fn answer(&self, request: Request<Incoming>) -> Answer {
        if request.method() != Method::POST {
            return self.service.handle(request).await;
        }
        let new_session = !request.headers().contains_key(SESSION_HEADER);
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                self.broker
                    .audit_refusal(&self.agent_id, "(protocol)", "body_too_long");
                return refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &Value::Null,
                    INVALID_REQUEST,
                    &format!("a request body longer than {MAX_BODY} bytes is refused"),
                );
            }
            Err(_) => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    &Value::Null,
                    INVALID_REQUEST,
                    "the request body could not be read",
                );
            }
        };
        if let Some(refused) = self.judge(&body) {
            return refused;
        }
        if new_session {
            self.make_room().await;
        }
        let response = self
            .service
            .handle(Request::from_parts(parts, Full::new(body)))
            .await;
        if let Some(id) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|_| new_session)
        {
            self.made.lock_anyway().push_back(id.to_string());
        }
        response
    }

    /// The line gate's door for one POST body: a refusal, or none to let
    /// rmcp have it.
    fn judge(&self, body: &[u8]) -> Option<Answer> {
        let parsed = std::str::from_utf8(body)
            .map_err(|_| "invalid UTF-8".to_string())
            .and_then(|text| crate::strict_json::from_str(text).map_err(|e| e.to_string()));
        let value = match parsed {
            Ok(value) => value,
            Err(why) => {
                return Some(refusal(
                    StatusCode::BAD_REQUEST,
                    &Value::Null,
                    PARSE_ERROR,
                    &format!("parse error: {why}"),
                ));
            }
        };
        let Value::Object(message) = &value else {
            let why = if value.is_array() {
                "batch requests are not supported"
            } else {
                "a message must be a JSON object"
            };
            return Some(refusal(
                StatusCode::BAD_REQUEST,
                &Value::Null,
                INVALID_REQUEST,
                why,
            ));
        };
        let method = message.get("method").and_then(Value::as_str)?;
        let claim =
            crate::gate::foreign_identity(message.get("params"), &self.agent_id, self.name())?;
        self.broker
            .audit_refusal(&self.agent_id, method, &format!("identity_spoof: {claim}"));
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        Some(refusal(
            StatusCode::OK,
            &id,
            INVALID_REQUEST,
            "requests act as the agent of this connection only; naming another agent is refused",
        ))
    }

    /// The agent's name: a store read the first time only (none while the
    /// agent cannot be read).
    fn name(&self) -> &str {
        if let Some(name) = self.agent_name.get() {
            return name;
        }
        match self.broker.agent(&self.agent_id) {
            Ok(Some(agent)) => self.agent_name.get_or_init(|| agent.name),
            _ => "",
        }
    }

    /// Ends the oldest sessions until a new one fits under MAX_SESSIONS.
    async fn make_room(&self) {
        loop {
            let live: std::collections::HashSet<String> = {
                let sessions = self.sessions.sessions.read().await;
                sessions.keys().map(|id| id.to_string()).collect()
            };
            if live.len() < MAX_SESSIONS {
                return;
            }
            let oldest = {
                let mut made = self.made.lock_anyway();
                made.retain(|id| live.contains(id));
                made.pop_front()
            };
            let Some(oldest) = oldest else {
                return; // made by another connection just now; never mind
            };
            let _ = self.sessions.close_session(&Arc::<str>::from(oldest)).await;
        }
    }
}

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

/// A JSON-RPC error as the whole answer.
fn refusal(status: StatusCode, id: &Value, code: i64, message: &str) -> Answer {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::Speaks;

    #[test]
    fn an_http_method_is_told_from_a_json_line_by_its_first_byte() {
        for first in [b'P', b'G', b'D', b'O', b'H'] {
            assert_eq!(Speaks::of_first_byte(Some(first)), Speaks::Http);
        }
        for first in [b'{', b' ', b'\n', b'[', b'p', 0, 0xff] {
            assert_eq!(Speaks::of_first_byte(Some(first)), Speaks::Lines);
        }
        assert_eq!(Speaks::of_first_byte(None), Speaks::Lines);
    }
}
