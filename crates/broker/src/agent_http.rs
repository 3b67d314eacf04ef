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
//! ways by two parsers: refused), one message (no batches), only
//! `initialize` without a session, no request of a revision without
//! sessions (rmcp would serve it statelessly, whatever session it names),
//! and a request that names another agent is refused and audited.
//! Requests other than tool calls (which the role's `calls_per_minute`
//! limits) are held to `OTHER_REQUESTS_PER_SECOND` (429 past it).
//! Sessions: at most `MAX_SESSIONS` per agent, a new one ends the oldest
//! (each CLI process makes its own, and not every CLI ends it); an idle
//! one ends after `SESSION_IDLE`. Requests carrying a browser `Origin`
//! other than the loopback's, or a `Host` that is not the loopback, are
//! refused by rmcp (DNS rebinding).
//!
//! A client whose stream broke resumes it with a GET naming its session
//! and the `Last-Event-ID` it had: the agent's event log
//! (`agent_http_events`, bounded, an answered stream kept `RESUME_WINDOW`)
//! replays that session's events only; the door refuses a resumption
//! without a live session or of a revision without sessions, and one whose
//! id is not its session's (400, audited `resume_refused`).
//!
//! rmcp starts each SSE stream with a priming event (an id, `retry`, and
//! empty `data`: SEP-1699, revision 2025-11-25) whatever revision the
//! client negotiated; a client of an earlier revision may parse that
//! empty `data` as JSON and fail. Gemini CLI 0.61 (2025-06-18) does, and
//! takes the failure for a lost server: it lists none of its tools. So a
//! session whose `initialize` asks for a revision before 2025-11-25 is
//! served by a second rmcp server, without priming events (the TypeScript
//! SDK's server sends none to such clients either); each request goes to
//! the server holding its session.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use rmcp::model::{ProtocolVersion, RequestMetaObject};
use rmcp::transport::common::http_header::HEADER_MCP_PROTOCOL_VERSION;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

pub use crate::agent_http_speaks::Speaks;

use crate::agent_http_events::EventLog;
use crate::agent_http_sessions::Sessions;
use crate::broker::Broker;
use crate::gate::{INVALID_REQUEST, PARSE_ERROR};
use crate::limits::TokenBucket;
use crate::locks::LockAnyway;
use crate::server::AgentHandler;

/// The largest POST body read (the line protocol's longest line).
pub const MAX_BODY: usize = 4 << 20;
/// Live MCP sessions per agent; a new one ends the oldest.
pub const MAX_SESSIONS: usize = 8;
/// An idle session ends after this long.
pub const SESSION_IDLE: Duration = Duration::from_secs(600);
/// Request ids one session may use (each is remembered to refuse its
/// reuse); a CLI's session lasts a turn.
pub const MAX_IDS_PER_SESSION: usize = 100_000;
/// How long an answered stream's events are kept for a client that lost
/// it (it comes back after the SSE `retry`).
pub const RESUME_WINDOW: Duration = Duration::from_secs(10);
/// The SSE `retry` of a priming event (rmcp's default).
pub const SSE_RETRY: Duration = Duration::from_secs(3);
/// Requests other than `tools/call` an agent may make a second (a CLI
/// makes a handful a turn), with a burst of twice that.
pub const OTHER_REQUESTS_PER_SECOND: u32 = 50;
/// A client gets this long to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const SESSION_HEADER: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";

type Service = StreamableHttpService<AgentHandler, Sessions>;
type Answer = Response<BoxBody<Bytes, Infallible>>;

/// One rmcp server of an agent, with its sessions.
struct Served {
    sessions: Arc<Sessions>,
    service: Service,
}

impl Served {
    /// `primed`: its SSE streams start with a priming event (the SSE
    /// `retry`, and an id to resume from).
    fn new(
        broker: &Arc<Broker>,
        agent_id: &str,
        primed: bool,
        events: &Arc<EventLog>,
        stop: &CancellationToken,
    ) -> Self {
        let retry = primed.then_some(SSE_RETRY);
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(SESSION_IDLE);
        sessions.session_config.completed_cache_ttl = RESUME_WINDOW;
        sessions.session_config.sse_retry = retry;
        let sessions = Arc::new(Sessions::new(sessions, events.clone()));
        let mut config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(["127.0.0.1", "localhost", "::1", "[::1]"])
            .with_allowed_origins(["http://127.0.0.1:*", "http://localhost:*"])
            .enforce_origin_validation()
            .with_max_request_body_bytes(MAX_BODY)
            .with_sse_retry(retry);
        config.cancellation_token = stop.clone();
        let (broker, agent_id) = (broker.clone(), agent_id.to_string());
        let service = StreamableHttpService::new(
            move || Ok(AgentHandler::new(broker.clone(), agent_id.clone())),
            sessions.clone(),
            config,
        );
        Self { sessions, service }
    }

    async fn holds(&self, session: &str) -> bool {
        self.sessions.holds(session).await
    }
}

/// Whether an `initialize` body asks for a revision with priming events
/// (2025-11-25 or later; the revision negotiated is at most the one asked
/// for).
fn asks_for_priming(body: &[u8]) -> bool {
    let message = serde_json::from_slice::<Value>(body).unwrap_or_default();
    message["params"]["protocolVersion"]
        .as_str()
        .is_some_and(|asked| asked >= ProtocolVersion::V_2025_11_25.as_str())
}

/// One agent's MCP endpoint: its sessions outlive connections (a client
/// opens several), and end with it (dropped when the agent's socket stops
/// being served: removed, or the daemon stopping).
pub struct AgentHttp {
    broker: Arc<Broker>,
    agent_id: String,
    /// The agent's name, read once (an agent's row never changes).
    agent_name: OnceLock<String>,
    /// Sessions of clients of 2025-11-25 or later.
    primed: Served,
    /// Sessions of clients of an earlier revision: no priming events.
    plain: Served,
    /// Session ids in the order they were made (some may have ended).
    made: Mutex<VecDeque<String>>,
    /// The request ids each live session has used.
    seen_ids: Mutex<HashMap<String, HashSet<String>>>,
    /// The events of both servers' streams, for resumption.
    events: Arc<EventLog>,
    /// Requests other than tool calls (OTHER_REQUESTS_PER_SECOND).
    others: Mutex<TokenBucket>,
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
        let stop = CancellationToken::new();
        let events = Arc::new(EventLog::new(RESUME_WINDOW));
        Self {
            primed: Served::new(&broker, &agent_id, true, &events, &stop),
            plain: Served::new(&broker, &agent_id, false, &events, &stop),
            events,
            broker,
            agent_id,
            agent_name: OnceLock::new(),
            made: Mutex::new(VecDeque::new()),
            seen_ids: Mutex::new(HashMap::new()),
            others: Mutex::new(TokenBucket::new(
                OTHER_REQUESTS_PER_SECOND * 60,
                OTHER_REQUESTS_PER_SECOND * 2,
            )),
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
        let connection = builder.serve_connection(io, service);
        // The agent removed or the daemon stopping ends its connections
        // (and rmcp its sessions) at once.
        tokio::select! {
            _ = connection => {}
            _ = self.stop.cancelled() => {}
        }
    }

    /// How many of this agent's MCP sessions are live (at most
    /// `MAX_SESSIONS`; the `agent_http` fuzz target checks it).
    pub async fn live_sessions(&self) -> usize {
        let mut live = 0;
        for served in [&self.primed, &self.plain] {
            live += served.sessions.local.sessions.read().await.len();
        }
        live
    }

    /// Ends every session and connection of this agent (its socket is no
    /// longer served: removed, or the daemon stopping).
    pub fn end(&self) {
        self.stop.cancel();
    }

    async fn answer(&self, request: Request<Incoming>) -> Answer {
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let holder = self.holder(session.as_deref()).await;
        if request.method() == Method::GET
            && let Some(refused) =
                self.judge_resume(request.headers(), session.as_deref(), holder.is_some())
        {
            return refused;
        }
        if request.method() != Method::POST {
            // One naming no live session: the primed server's to refuse.
            let served = holder.unwrap_or(&self.primed);
            return served.service.handle(request).await;
        }
        let new_session = session.is_none();
        // Request ids are remembered only for sessions that exist.
        let live = holder.is_some();
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
        let session = session.as_deref().filter(|_| live);
        if let Some(refused) = self.judge(&parts.headers, &body, session, new_session) {
            return refused;
        }
        if new_session {
            self.make_room().await;
        }
        let served = match holder {
            Some(served) => served,
            None if new_session && !asks_for_priming(&body) => &self.plain,
            None => &self.primed,
        };
        let response = served
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

    /// The server holding a live session.
    async fn holder(&self, session: Option<&str>) -> Option<&Served> {
        let session = session?;
        if self.primed.holds(session).await {
            Some(&self.primed)
        } else if self.plain.holds(session).await {
            Some(&self.plain)
        } else {
            None
        }
    }

    /// The line gate's door for one POST body: a refusal, or none to let
    /// rmcp have it. `session`: the live session it names; `sessionless`:
    /// it names none (only `initialize` may: rmcp would serve anything
    /// else with a handler of its own, steps counted from zero).
    fn judge(
        &self,
        headers: &header::HeaderMap,
        body: &[u8],
        session: Option<&str>,
        sessionless: bool,
    ) -> Option<Answer> {
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
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        if sessionless && method != "initialize" {
            return Some(refusal(
                StatusCode::BAD_REQUEST,
                &id,
                INVALID_REQUEST,
                "this endpoint serves MCP sessions: send initialize first, then each request \
                 with the Mcp-Session-Id it answered",
            ));
        }
        // rmcp serves a request of a revision without sessions (2026-07-28
        // on) statelessly, whatever session it names: with a handler of
        // its own, as sessionless requests would be.
        if method != "initialize" && sessionless_revision(headers, message) {
            return Some(refusal(
                StatusCode::BAD_REQUEST,
                &id,
                INVALID_REQUEST,
                "this endpoint serves MCP with sessions (revisions up to 2025-11-25): a request \
                 of a later revision, or with its per-request protocol context, is refused",
            ));
        }
        if let (Some(session), false) = (session, id.is_null())
            && let Some(why) = self.first_use(session, &id)
        {
            return Some(refusal(StatusCode::OK, &id, INVALID_REQUEST, why));
        }
        if method != "tools/call"
            && !id.is_null()
            && let Some(refused) = self.over_rate(method, &id)
        {
            return Some(refused);
        }
        let claim =
            crate::gate::foreign_identity(message.get("params"), &self.agent_id, self.name())?;
        self.broker
            .audit_refusal(&self.agent_id, method, &format!("identity_spoof: {claim}"));
        Some(refusal(
            StatusCode::OK,
            &id,
            INVALID_REQUEST,
            "requests act as the agent of this connection only; naming another agent is refused",
        ))
    }

    /// The door for a resumption (a GET with `Last-Event-ID`): it must name
    /// a live session of this agent, of a revision with sessions, and an
    /// event of that session's streams (rmcp would replay by the id alone,
    /// or with no session at all). A refusal, or none to let rmcp have it.
    fn judge_resume(
        &self,
        headers: &header::HeaderMap,
        session: Option<&str>,
        live: bool,
    ) -> Option<Answer> {
        let last = headers.get(LAST_EVENT_ID)?;
        let refused = |status, why: &str| Some(refusal(status, &Value::Null, INVALID_REQUEST, why));
        let Some(session) = session else {
            return refused(
                StatusCode::BAD_REQUEST,
                "resuming a stream needs the Mcp-Session-Id of the session it belongs to",
            );
        };
        if sessionless_header(headers) {
            return refused(
                StatusCode::BAD_REQUEST,
                "this endpoint serves MCP with sessions (revisions up to 2025-11-25): a \
                 resumption of a later revision is refused",
            );
        }
        if !live {
            return refused(StatusCode::NOT_FOUND, "session not found");
        }
        let owned = last
            .to_str()
            .is_ok_and(|id| self.events.owns(session, id, Instant::now()));
        if owned {
            return None;
        }
        self.broker
            .audit_refusal(&self.agent_id, "(protocol)", "resume_refused");
        refused(
            StatusCode::BAD_REQUEST,
            "Last-Event-ID names no event of this session's streams that can be resumed \
             (unknown, expired, or another session's)",
        )
    }

    /// The 429 for a request besides tool calls past
    /// OTHER_REQUESTS_PER_SECOND, or none (a token taken).
    fn over_rate(&self, method: &str, id: &Value) -> Option<Answer> {
        let wait_ms = self.others.lock_anyway().take(Instant::now()).err()?;
        self.broker
            .audit_refusal(&self.agent_id, method, "rate_limited: requests over HTTP");
        let mut refused = refusal(
            StatusCode::TOO_MANY_REQUESTS,
            id,
            RATE_LIMITED,
            &format!(
                "more than {OTHER_REQUESTS_PER_SECOND} requests a second besides tool calls; \
                 retry in {wait_ms} ms"
            ),
        );
        let seconds = wait_ms.div_ceil(1000).max(1).to_string();
        if let Ok(value) = header::HeaderValue::from_str(&seconds) {
            refused.headers_mut().insert(header::RETRY_AFTER, value);
        }
        Some(refused)
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

    /// Records a request id of a session; why it is refused when it was
    /// used before in that session (the answer to the first would be lost)
    /// or the session has used too many.
    fn first_use(&self, session: &str, id: &Value) -> Option<&'static str> {
        let mut seen = self.seen_ids.lock_anyway();
        let ids = seen.entry(session.to_string()).or_default();
        if ids.len() >= MAX_IDS_PER_SESSION {
            return Some("this session has made its 100000 requests: start a new one");
        }
        (!ids.insert(id.to_string())).then_some("duplicate request id in this session")
    }

    /// Forgets what ended sessions left, then ends the oldest sessions
    /// until a new one fits under MAX_SESSIONS.
    async fn make_room(&self) {
        loop {
            let mut live: HashSet<String> = HashSet::new();
            for served in [&self.primed, &self.plain] {
                let sessions = served.sessions.local.sessions.read().await;
                live.extend(sessions.keys().map(|id| id.to_string()));
            }
            self.seen_ids
                .lock_anyway()
                .retain(|id, _| live.contains(id));
            let oldest = {
                let mut made = self.made.lock_anyway();
                made.retain(|id| live.contains(id));
                if live.len() < MAX_SESSIONS {
                    return;
                }
                made.pop_front()
            };
            let Some(oldest) = oldest else {
                return; // made by another connection just now; never mind
            };
            let oldest = Arc::<str>::from(oldest);
            for served in [&self.primed, &self.plain] {
                let _ = served.sessions.close_session(&oldest).await;
            }
        }
    }
}

/// Whether rmcp would serve `message` statelessly, outside any session: an
/// `MCP-Protocol-Version` header other than a revision with sessions (rmcp
/// routes by the first; all are judged), or the per-request context of the
/// revisions without (a protocol version or client capabilities in
/// `_meta`: rmcp routes by these before the header).
fn sessionless_revision(
    headers: &header::HeaderMap,
    message: &serde_json::Map<String, Value>,
) -> bool {
    let meta = message
        .get("params")
        .and_then(|params| params.get("_meta"))
        .and_then(Value::as_object)
        .is_some_and(|meta| {
            RequestMetaObject::DRAFT_REQUIRED_KEYS
                .iter()
                .any(|key| meta.contains_key(*key))
        });
    sessionless_header(headers) || meta
}

/// An `MCP-Protocol-Version` header other than a revision with sessions
/// (rmcp routes by the first; all are judged).
fn sessionless_header(headers: &header::HeaderMap) -> bool {
    let with_sessions = |v: &header::HeaderValue| {
        ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .any(|known| known.has_initialize() && known.as_str().as_bytes() == v.as_bytes())
    };
    headers
        .get_all(HEADER_MCP_PROTOCOL_VERSION)
        .iter()
        .any(|v| !with_sessions(v))
}

/// The broker's code for a request refused by a rate limit.
const RATE_LIMITED: i64 = -32000;

/// A JSON-RPC error (the line gate's) as the whole answer.
fn refusal(status: StatusCode, id: &Value, code: i64, message: &str) -> Answer {
    let body = crate::gate::error_line(id, code, message);
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::asks_for_priming;

    #[test]
    fn only_a_client_of_2025_11_25_or_later_gets_priming_events() {
        let initialize = |version: &str| {
            serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": version, "capabilities": {}}})
            .to_string()
        };
        for version in ["2025-11-25", "2026-07-28"] {
            assert!(
                asks_for_priming(initialize(version).as_bytes()),
                "{version}"
            );
        }
        for version in ["2025-06-18", "2025-03-26", "2024-11-05"] {
            assert!(
                !asks_for_priming(initialize(version).as_bytes()),
                "{version}"
            );
        }
        assert!(!asks_for_priming(b"{\"method\":\"initialize\"}"));
    }
}
