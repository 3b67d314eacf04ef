//! The gateway's HTTP service: one Unix socket per agent (bound into that
//! agent's sandbox, bridged to a loopback port there), so the agent is the
//! socket it came in on. A request is routed to its API, its key checked
//! against the agent's placeholder, admitted by the budgets, then sent on
//! with the real key; the answer streams back chunk by chunk while its
//! token counts are read on the way, and one audit line records it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::api::{self, Api, Route};
use crate::config::{Budget, GatewayConfig, Secret, Upstream};
use crate::ledger::{Ledger, Refusal};
use crate::usage::{Framing, Usage, UsageTap};

/// The largest request body forwarded (a CLI replays its whole history).
pub const MAX_REQUEST: usize = 32 << 20;
/// Connections one agent may have open at once.
pub const MAX_CONNECTIONS: usize = 32;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// Where usage goes to be kept (the broker's store).
pub trait UsageSink: Send + Sync + std::fmt::Debug {
    fn record(&self, agent_id: &str, api: Api, usage: &Usage);
}

/// The team's budget where several gateways (daemons) serve one team: each
/// request the team's budget limits is counted where they all see it, and
/// refused there once the team's minute or day is spent.
pub trait TeamMeter: Send + Sync + std::fmt::Debug {
    fn admit(&self, team: &Budget) -> Result<(), Refusal>;
}

/// What the gateway knows of one agent.
#[derive(Debug, Clone)]
struct AgentEntry {
    placeholder: Secret,
    budget: Budget,
}

/// Why the gateway could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the gateway's HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

pub struct Gateway {
    config: GatewayConfig,
    client: reqwest::Client,
    agents: RwLock<HashMap<String, AgentEntry>>,
    ledger: Ledger,
    audit: Mutex<Box<dyn Write + Send>>,
    sink: Option<Arc<dyn UsageSink>>,
    team_meter: RwLock<Option<Arc<dyn TeamMeter>>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Serialize)]
struct AuditLine<'a> {
    ts_ms: u128,
    agent: &'a str,
    api: Option<Api>,
    model: Option<&'a str>,
    decision: &'static str,
    status: u16,
    reason: &'a str,
    /// From the request's arrival to the upstream's response headers.
    latency_ms: u128,
    /// From the request's arrival to the end of the response's body.
    duration_ms: u128,
    input_tokens: u64,
    output_tokens: u64,
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

impl Gateway {
    pub fn new(
        config: GatewayConfig,
        audit: Box<dyn Write + Send>,
        sink: Option<Arc<dyn UsageSink>>,
    ) -> Result<Self, GatewayError> {
        // TLS by rustls with ring, once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(300))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(GatewayError::Client)?;
        Ok(Self {
            config,
            client,
            agents: RwLock::new(HashMap::new()),
            ledger: Ledger::default(),
            audit: Mutex::new(audit),
            sink,
            team_meter: RwLock::new(None),
        })
    }

    /// Counts the team's budget also with `meter` (several daemons).
    pub fn set_team_meter(&self, meter: Arc<dyn TeamMeter>) {
        *self.team_meter.write().unwrap_or_else(|p| p.into_inner()) = Some(meter);
    }

    /// Makes (or replaces) the agent's placeholder key: what its CLI is
    /// given instead of a real key.
    pub fn register(&self, agent_id: &str, budget: Budget) -> String {
        let placeholder = format!("substrat-{agent_id}-{}", random_hex());
        let entry = AgentEntry {
            placeholder: Secret::new(placeholder.clone()),
            budget,
        };
        self.agents
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent_id.to_string(), entry);
        placeholder
    }

    pub fn forget(&self, agent_id: &str) {
        self.agents
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent_id);
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn entry(&self, agent_id: &str) -> Option<AgentEntry> {
        self.agents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent_id)
            .cloned()
    }

    fn audit(&self, line: &AuditLine<'_>) {
        if let Ok(mut text) = serde_json::to_string(line) {
            text.push('\n');
            let mut out = self.audit.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }

    /// Serves one agent's socket until the task is dropped.
    pub async fn serve_agent(self: Arc<Self>, listener: UnixListener, agent_id: String) {
        let agent: Arc<str> = Arc::from(agent_id);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                continue; // dropped: over the connection limit
            };
            let (gateway, agent) = (self.clone(), agent.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let (gateway, agent) = (gateway.clone(), agent.clone());
                    async move { Ok::<_, Infallible>(gateway.handle(&agent, request).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
                drop(permit);
            });
        }
    }

    async fn handle(
        self: &Arc<Self>,
        agent: &str,
        request: Request<Incoming>,
    ) -> Response<GatewayBody> {
        let start = Instant::now();
        match self.forward(agent, request, start).await {
            Ok(response) => response,
            Err(refused) => {
                self.audit(&AuditLine {
                    ts_ms: now_ms(),
                    agent,
                    api: refused.api,
                    model: None,
                    decision: "refused",
                    status: refused.status.as_u16(),
                    reason: &refused.reason,
                    latency_ms: start.elapsed().as_millis(),
                    duration_ms: start.elapsed().as_millis(),
                    input_tokens: 0,
                    output_tokens: 0,
                });
                error_response(refused.api, refused.status, &refused.reason)
            }
        }
    }

    /// Whether the request may go on: a forwarded call, this agent's
    /// placeholder key, an upstream for its API, budget left.
    fn admit(
        &self,
        agent: &str,
        request: &Request<Incoming>,
    ) -> Result<(Route, &Upstream), Refused> {
        let refused = |api, status, reason: &str| Refused {
            api,
            status,
            reason: reason.to_string(),
        };
        let route = api::route(request.uri().path()).ok_or_else(|| {
            refused(
                None,
                StatusCode::NOT_FOUND,
                "not a model API call the gateway forwards",
            )
        })?;
        let api = Some(route.api);
        let entry = self
            .entry(agent)
            .ok_or_else(|| refused(api, StatusCode::FORBIDDEN, "this agent has no model access"))?;
        let headers = request
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)));
        let keys = api::presented_keys(headers, request.uri().query());
        if keys.len() != 1 || keys[0] != entry.placeholder.expose() {
            let reason = "the key is not this agent's placeholder";
            return Err(refused(api, StatusCode::UNAUTHORIZED, reason));
        }
        let upstream = self.config.upstreams.get(&route.api).ok_or_else(|| {
            let reason = format!(
                "no {} upstream is configured on this daemon",
                route.api.as_str()
            );
            refused(api, StatusCode::SERVICE_UNAVAILABLE, &reason)
        })?;
        self.ledger
            .admit(agent, &entry.budget, &self.config.team)
            .map_err(|e| refused(api, StatusCode::TOO_MANY_REQUESTS, &e.to_string()))?;
        // Counted here last: a request this daemon refuses uses none of
        // the team's budget the other daemons see.
        let team = &self.config.team;
        let meter = self
            .team_meter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(meter) = meter
            && (team.requests_per_minute.is_some() || team.tokens_per_day.is_some())
        {
            meter.admit(team).map_err(|e| {
                let status = match e {
                    Refusal::Unchecked(_) => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::TOO_MANY_REQUESTS,
                };
                refused(api, status, &e.to_string())
            })?;
        }
        Ok((route, upstream))
    }

    /// The request sent on with the real key; the answer streamed back.
    async fn forward(
        self: &Arc<Self>,
        agent: &str,
        request: Request<Incoming>,
        start: Instant,
    ) -> Result<Response<GatewayBody>, Refused> {
        let (route, upstream) = self.admit(agent, &request)?;
        let api = route.api;
        let refused = |status, reason: String| Refused {
            api: Some(api),
            status,
            reason,
        };
        let (parts, body) = request.into_parts();
        let body = Limited::new(body, MAX_REQUEST)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|_| {
                let reason = "the request body is too large or was cut".to_string();
                refused(StatusCode::PAYLOAD_TOO_LARGE, reason)
            })?;
        let model = route.model.or_else(|| model_of(&body));
        let path = parts.uri.path();
        let url = match api::query_without_key(parts.uri.query()) {
            Some(q) => format!("{}{path}?{q}", upstream.base_url),
            None => format!("{}{path}", upstream.base_url),
        };
        let mut outgoing = self.client.request(parts.method, url);
        for (name, value) in &parts.headers {
            if !api::is_dropped_header(name.as_str()) {
                outgoing = outgoing.header(name, value);
            }
        }
        let (name, value) = api.credential(upstream.key.expose());
        let answer = outgoing
            .header(name, value)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                let reason = format!("the model upstream cannot be reached: {}", e.without_url());
                refused(StatusCode::BAD_GATEWAY, reason)
            })?;
        let record = Record {
            gateway: self.clone(),
            agent: agent.to_string(),
            api,
            model,
            status: answer.status().as_u16(),
            start,
            latency_ms: start.elapsed().as_millis(),
            tap: Some(UsageTap::new(api, framing_of(answer.headers()))),
        };
        Ok(relay(answer, record))
    }
}

/// A request the gateway answers itself, with why.
struct Refused {
    api: Option<Api>,
    status: StatusCode,
    reason: String,
}

/// The answer's status and headers, and its body streamed through.
fn relay(answer: reqwest::Response, record: Record) -> Response<GatewayBody> {
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !api::is_dropped_header(name.as_str()) {
            response = response.header(name, value);
        }
    }
    let stream = Tapped {
        inner: Box::pin(answer.bytes_stream()),
        record: Some(record),
    };
    let body = BodyExt::boxed_unsync(StreamBody::new(stream));
    response
        .body(body)
        .unwrap_or_else(|_| error_response(None, StatusCode::BAD_GATEWAY, "bad upstream headers"))
}

fn framing_of(headers: &reqwest::header::HeaderMap) -> Framing {
    let event_stream = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if event_stream {
        Framing::EventStream
    } else {
        Framing::Json
    }
}

/// The request's `model`, read only for the audit line.
fn model_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let model = value.get("model")?.as_str()?;
    (model.len() <= 200).then(|| model.to_string())
}

fn error_response(api: Option<Api>, status: StatusCode, reason: &str) -> Response<GatewayBody> {
    let body = match api {
        Some(api) => api.error_body(status.as_u16(), reason),
        None => serde_json::json!({"error": {"message": reason}}),
    };
    let bytes = Bytes::from(body.to_string());
    let mut response = Response::new(
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    let _ = getrandom(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 16 random bytes from the kernel.
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// A forwarded request's record, made when its answer has streamed
/// through (or was cut off: the client went away, the upstream broke).
struct Record {
    gateway: Arc<Gateway>,
    agent: String,
    api: Api,
    model: Option<String>,
    status: u16,
    start: Instant,
    latency_ms: u128,
    tap: Option<UsageTap>,
}

impl Record {
    fn finish(&mut self, reason: &str) {
        let Some(tap) = self.tap.take() else {
            return;
        };
        let usage = tap.finish();
        self.gateway.ledger.spend(&self.agent, usage.total());
        if let Some(sink) = &self.gateway.sink {
            sink.record(&self.agent, self.api, &usage);
        }
        let model = usage.model.as_deref().or(self.model.as_deref());
        self.gateway.audit(&AuditLine {
            ts_ms: now_ms(),
            agent: &self.agent,
            api: Some(self.api),
            model,
            decision: "forwarded",
            status: self.status,
            reason,
            latency_ms: self.latency_ms,
            duration_ms: self.start.elapsed().as_millis(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        });
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.finish("the answer was cut off");
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The upstream's body, each chunk passed on as it comes and read for
/// its token counts on the way.
struct Tapped {
    inner: ByteStream,
    record: Option<Record>,
}

impl Stream for Tapped {
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(tap) = self.record.as_mut().and_then(|r| r.tap.as_mut()) {
                    tap.feed(&chunk);
                }
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(mut record) = self.record.take() {
                    record.finish("the upstream's answer broke off");
                }
                Poll::Ready(Some(Err(Box::new(e.without_url()))))
            }
            Poll::Ready(None) => {
                if let Some(mut record) = self.record.take() {
                    record.finish("");
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
