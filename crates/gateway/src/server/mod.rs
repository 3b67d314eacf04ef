//! The gateway's HTTP service: one Unix socket per agent (bound into that
//! agent's sandbox, bridged to a loopback port there), so the agent is the
//! socket it came in on. A request is routed to its API, its key checked
//! against the agent's placeholder (which opens its own API only), its body
//! spooled, admitted by the budgets (a slot among the requests at once),
//! its body read (the tools it names, the output it asks for), its worst
//! case reserved, then sent on with the real key; the answer streams back chunk
//! by chunk while its token counts are read on the way (`relay`), and one
//! audit line records it.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use serde::Serialize;
use substrat_policy::model::HostedTool;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::api::{self, Api, Route};
use crate::body::{self, Spooled};
use crate::config::{Budget, GatewayConfig, Secret, Upstream};
use crate::ledger::{Ledger, Refusal, Slot};
use crate::usage::UsageTap;

mod facts;
mod headers;
mod relay;
mod stall;

use facts::{body_status, read_facts};
use relay::{Record, Refused, TeamHold, Unanswered, error_response, framing_of};

/// Connections one agent may have open at once.
pub const MAX_CONNECTIONS: usize = 8;
/// The most a connection buffers of a request's head.
pub const MAX_HEAD_BUFFER: usize = 64 << 10;
/// The longest wait for a request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The output tokens a request reserves when it names no limit (more
/// than any model answers today).
pub const OUTPUT_RESERVE: u64 = 128_000;
/// The most output tokens a request may ask for.
pub const MAX_OUTPUT: u64 = 1_000_000;
/// The most input tokens a request is taken to hold (more than any
/// model's context); below it, one token a byte of its body.
pub const MAX_INPUT: u64 = 2_000_000;
/// The longest an agent may leave an answer unread before its connection
/// is closed (its slot and reservation are then given up).
pub const WRITE_STALL: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// Where usage goes to be kept (the broker's store).
pub trait UsageSink: Send + Sync + std::fmt::Debug {
    fn record(&self, agent_id: &str, api: Api, usage: &crate::Usage);
    /// A budget refused one of the agent's requests (for the metrics:
    /// `problems::refusal_labels`).
    fn budget_refused(&self, _agent_id: &str, _refusal: &Refusal) {}
    /// A request named a model outside the agent's allowance
    /// (`model.models`).
    fn model_refused(&self, _agent_id: &str) {}
}

/// The team's budget where several gateways (daemons) serve one team: each
/// request the team's budget limits is counted where they all see it, and
/// refused there once the team's minute or day is spent.
pub trait TeamMeter: Send + Sync + std::fmt::Debug {
    fn admit(&self, team: &Budget) -> Result<(), Refusal>;
    /// Reserves `tokens` of the team's day where every daemon sees it, for
    /// the request `id` in flight, or refuses when the day is spent (used
    /// and reserved).
    fn reserve(&self, team: &Budget, id: &str, tokens: u64) -> Result<(), Refusal>;
    /// The request `id` ended; its usage was recorded (the `UsageSink`).
    fn release(&self, id: &str);
}

/// What an agent may do with its model: the one API its CLI speaks (its
/// placeholder opens no other), its budget, the provider-side tools its
/// role allows.
#[derive(Debug, Clone)]
pub struct ModelAccess {
    pub api: Api,
    pub budget: Budget,
    pub hosted_tools: BTreeSet<HostedTool>,
    /// The models the role allows (`model.models`, glob patterns); none:
    /// any.
    pub models: Option<Vec<String>>,
}

/// What the gateway knows of one agent.
#[derive(Debug, Clone)]
struct AgentEntry {
    placeholder: Secret,
    access: ModelAccess,
}

/// Why the gateway could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the gateway's HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("the gateway cannot spool request bodies in {dir}: {source}")]
    Spool {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub struct Gateway {
    config: GatewayConfig,
    client: reqwest::Client,
    agents: RwLock<HashMap<String, AgentEntry>>,
    ledger: Arc<Ledger>,
    audit: Mutex<Box<dyn Write + Send>>,
    sink: Option<Arc<dyn UsageSink>>,
    team_meter: RwLock<Option<Arc<dyn TeamMeter>>>,
    /// Requests refused for a model outside the agent's allowance.
    model_refusals: AtomicU64,
    problems: crate::problems::Problems,
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
        body::check_dir(&config.spool.dir).map_err(|source| GatewayError::Spool {
            dir: config.spool.dir.clone(),
            source,
        })?;
        // TLS by rustls with ring, once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(300))
            .redirect(reqwest::redirect::Policy::none())
            // The upstream is the one configured: never a proxy named in
            // the daemon's environment (it would see a cleartext key).
            .no_proxy()
            .build()
            .map_err(GatewayError::Client)?;
        Ok(Self {
            config,
            client,
            agents: RwLock::new(HashMap::new()),
            ledger: Arc::new(Ledger::default()),
            audit: Mutex::new(audit),
            sink,
            team_meter: RwLock::new(None),
            model_refusals: AtomicU64::new(0),
            problems: Default::default(),
        })
    }

    /// Counts the team's budget also with `meter` (several daemons).
    pub fn set_team_meter(&self, meter: Arc<dyn TeamMeter>) {
        *self.team_meter.write().unwrap_or_else(|p| p.into_inner()) = Some(meter);
    }

    /// Makes (or replaces) the agent's placeholder key: what its CLI is
    /// given instead of a real key.
    pub fn register(&self, agent_id: &str, access: ModelAccess) -> String {
        let placeholder = format!("substrat-{agent_id}-{}", random_hex());
        let entry = AgentEntry {
            placeholder: Secret::new(placeholder.clone()),
            access,
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

    /// Requests refused so far for naming a model the agent's role does
    /// not allow (`model.models`).
    pub fn model_refusals(&self) -> u64 {
        self.model_refusals.load(Ordering::Relaxed)
    }

    fn count_model_refusal(&self, agent: &str) {
        self.model_refusals.fetch_add(1, Ordering::Relaxed);
        if let Some(sink) = &self.sink {
            sink.model_refused(agent);
        }
    }

    /// The agent's failed model requests since this was last asked (the
    /// last `problems::KEEP_ERRORS`), oldest first.
    pub fn take_errors(&self, agent_id: &str) -> Vec<crate::ModelError> {
        self.problems.take_errors(agent_id)
    }

    /// A budget's refusal, told to the sink, as the agent is told it.
    fn budget_refused(&self, agent: &str, api: Api, refusal: &Refusal) -> Refused {
        if let Some(sink) = &self.sink {
            sink.budget_refused(agent, refusal);
        }
        let status = match refusal {
            Refusal::Unchecked(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        Refused {
            kind: crate::problems::ErrorKind::Budget,
            ..refuser(api)(status, refusal.to_string())
        }
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

    /// Serves one agent's socket until the task is dropped. A connection
    /// beyond `MAX_CONNECTIONS` is closed at once; a request's head must
    /// come within `HEAD_TIMEOUT` and fit `MAX_HEAD_BUFFER`; an answer
    /// left unread for `WRITE_STALL` ends its connection.
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
                let stream = stall::WriteStall::new(stream, WRITE_STALL);
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .max_buf_size(MAX_HEAD_BUFFER)
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
                let status = refused.status.as_u16();
                self.problems
                    .error(agent, refused.kind, status, &refused.reason);
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

    /// The request sent on with the real key; the answer streamed back.
    async fn forward(
        self: &Arc<Self>,
        agent: &str,
        request: Request<Incoming>,
        start: Instant,
    ) -> Result<Response<GatewayBody>, Refused> {
        let checked = self.check(agent, &request)?;
        let api = checked.route.api;
        let refused = refuser(api);
        // The body first (an agent spools on its few connections only):
        // a slot, the team's included, is held only once it has come and
        // been read.
        let (parts, body) = request.into_parts();
        let spooled = body::spool(body, &self.config.spool)
            .await
            .map_err(|e| refused(body_status(&e), e.to_string()))?;
        // Judged before it is admitted: a request refused for its body
        // (its model, its tools, its output) spends none of the rate.
        let facts = read_facts(api, &spooled).await?;
        let reserve = self.worst_case(agent, &checked, &facts, &spooled)?;
        let mut slot = self.admit(agent, &checked.entry)?;
        slot.reserve(reserve, &checked.entry.access.budget, &self.config.team)
            .map_err(|e| self.budget_refused(agent, api, &e))?;
        let team_hold = self.team_reserve(agent, api, reserve)?;
        // From here the request may reach the model: if the agent goes
        // away before the answer comes, it is counted all the same.
        let mut unanswered = Unanswered {
            gateway: self.clone(),
            agent: agent.to_string(),
            api,
            tokens: reserve,
            start,
        };
        let outgoing = self.outgoing(&checked, parts, spooled)?;
        let route = checked.route;
        let answer = match outgoing.send().await {
            Ok(answer) => answer,
            Err(e) => {
                // Never connected: nothing was used. Anything later may
                // have been: the slot, dropped, spends its reservation,
                // and the store (the other daemons) counts it too.
                if e.is_connect() {
                    slot.settle(0);
                    unanswered.tokens = 0;
                }
                drop(unanswered);
                drop(team_hold);
                let reason = format!("the model upstream cannot be reached: {}", e.without_url());
                return Err(Refused {
                    kind: crate::problems::ErrorKind::Unreachable,
                    ..refused(StatusCode::BAD_GATEWAY, reason)
                });
            }
        };
        unanswered.tokens = 0;
        drop(unanswered);
        let status = answer.status();
        if !status.is_success() {
            let reason = format!("the model upstream answered {status}");
            let kind = crate::problems::ErrorKind::Upstream;
            self.problems.error(agent, kind, status.as_u16(), &reason);
        }
        let record = Record {
            gateway: self.clone(),
            agent: agent.to_string(),
            api,
            call: route.call,
            model: route.model.or(facts.model),
            status: answer.status().as_u16(),
            start,
            latency_ms: start.elapsed().as_millis(),
            tap: Some(UsageTap::new(api, framing_of(answer.headers()))),
            slot: Some(slot),
            team_hold,
        };
        Ok(relay::relay(answer, record))
    }

    /// The request as it goes upstream: the agent's headers but those
    /// dropped, the real key, an uncompressed answer asked for, the body
    /// streamed from its spool.
    fn outgoing(
        &self,
        checked: &Checked<'_>,
        parts: http::request::Parts,
        spooled: Spooled,
    ) -> Result<reqwest::RequestBuilder, Refused> {
        let upstream = checked.upstream;
        let path = parts.uri.path();
        let url = match &checked.query {
            Some(q) => format!("{}{path}?{q}", upstream.base_url),
            None => format!("{}{path}", upstream.base_url),
        };
        let mut outgoing = self.client.request(parts.method, url);
        for (name, value) in &parts.headers {
            if !api::is_dropped_request_header(name.as_str()) {
                outgoing = outgoing.header(name, value);
            }
        }
        let (name, value) = checked.route.api.credential(upstream.key.expose());
        let length = spooled.len();
        let stream = spooled.into_stream().map_err(|e| {
            let reason = format!("the spooled body: {e}");
            refuser(checked.route.api)(StatusCode::INTERNAL_SERVER_ERROR, reason)
        })?;
        Ok(outgoing
            .header(name, value)
            .header(http::header::ACCEPT_ENCODING, "identity")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONTENT_LENGTH, length)
            .body(reqwest::Body::wrap_stream(stream)))
    }

    /// What can be decided from the request's head: a forwarded call with
    /// POST, this agent's placeholder for this API, only the query
    /// parameters the API's CLIs use, an upstream configured.
    fn check(&self, agent: &str, request: &Request<Incoming>) -> Result<Checked<'_>, Refused> {
        let route = api::route(request.uri().path()).ok_or_else(|| Refused {
            kind: crate::problems::ErrorKind::Refused,
            api: None,
            status: StatusCode::NOT_FOUND,
            reason: "not a model API call the gateway forwards".into(),
        })?;
        let refused = refuser(route.api);
        if request.method() != Method::POST {
            let reason = format!("{} is not a method the gateway forwards", request.method());
            return Err(refused(StatusCode::METHOD_NOT_ALLOWED, reason));
        }
        let entry = self.entry(agent).ok_or_else(|| {
            refused(
                StatusCode::FORBIDDEN,
                "this agent has no model access".into(),
            )
        })?;
        let headers = request
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)));
        let keys = api::presented_keys(headers, request.uri().query());
        if keys.len() != 1 || keys[0] != entry.placeholder.expose() {
            let reason = "the key is not this agent's placeholder".into();
            return Err(refused(StatusCode::UNAUTHORIZED, reason));
        }
        if entry.access.api != route.api {
            let reason = format!(
                "this agent's key is for the {} API, not the {} API",
                entry.access.api.as_str(),
                route.api.as_str()
            );
            return Err(refused(StatusCode::FORBIDDEN, reason));
        }
        headers::judge(request.headers(), self.config.spool.max_bytes)
            .map_err(|(status, reason)| refused(status, reason))?;
        let query = api::forwarded_query(route.api, request.uri().query()).map_err(|param| {
            let reason = format!("the query parameter {param:?} is not forwarded");
            refused(StatusCode::BAD_REQUEST, reason)
        })?;
        let upstream = self.config.upstreams.get(&route.api).ok_or_else(|| {
            let reason = format!(
                "no {} upstream is configured on this daemon",
                route.api.as_str()
            );
            refused(StatusCode::SERVICE_UNAVAILABLE, reason)
        })?;
        Ok(Checked {
            route,
            entry,
            upstream,
            query,
        })
    }

    /// A slot among the requests at once, with budget left (the agent's,
    /// the team's here, the team's across daemons).
    fn admit(&self, agent: &str, entry: &AgentEntry) -> Result<Slot, Refused> {
        let api = entry.access.api;
        let team = &self.config.team;
        let slot = self
            .ledger
            .admit(agent, &entry.access.budget, team)
            .map_err(|e| self.budget_refused(agent, api, &e))?;
        // Counted here last: a request this daemon refuses uses none of
        // the team's budget the other daemons see.
        let meter = self
            .team_meter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(meter) = meter
            && (team.requests_per_minute.is_some() || team.tokens_per_day.is_some())
        {
            meter
                .admit(team)
                .map_err(|e| self.budget_refused(agent, api, &e))?;
        }
        Ok(slot)
    }

    /// The request's worst case reserved from the team's day where the
    /// other daemons see it (when they share a database and the team has
    /// a day's budget).
    fn team_reserve(
        &self,
        agent: &str,
        api: Api,
        tokens: u64,
    ) -> Result<Option<TeamHold>, Refused> {
        let team = &self.config.team;
        let meter = self
            .team_meter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (Some(meter), Some(_)) = (meter, team.tokens_per_day) else {
            return Ok(None);
        };
        let id = random_hex();
        meter
            .reserve(team, &id, tokens)
            .map_err(|e| self.budget_refused(agent, api, &e))?;
        Ok(Some(TeamHold { meter, id }))
    }
}

/// A request's head, checked.
struct Checked<'a> {
    route: Route,
    entry: AgentEntry,
    upstream: &'a Upstream,
    query: Option<String>,
}

fn refuser(api: Api) -> impl Fn(StatusCode, String) -> Refused {
    move |status, reason| Refused {
        kind: crate::problems::ErrorKind::Refused,
        api: Some(api),
        status,
        reason,
    }
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

#[cfg(test)]
mod attack_tests;
#[cfg(test)]
mod tests;
