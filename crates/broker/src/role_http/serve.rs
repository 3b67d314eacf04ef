//! The endpoints over HTTP/1.1 (hyper, as the model gateway serves): the
//! token is checked before a connection takes a slot (`admit`: the head
//! read within a bound of its own, time and size), again on what hyper
//! parses, bodies are bounded, a prompt is resolved off the runtime, one
//! request per connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::sync::Semaphore;

use super::admit::{HEAD_TIMEOUT, Head, Replay, Waiting, read_head};
use super::{Answer, MAX_BODY, Route, authorized, error, list_answer, prompt_answer, route};
use crate::broker::Broker;

/// Authenticated requests served at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 32;
/// How long a body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the endpoints listen: a loopback address, or a Unix socket
/// (`unix:PATH`, made mode 0600).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("`{text}`: the socket path must be absolute"));
            }
            return Ok(Listen::Unix(path));
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| format!("`{text}`: expected HOST:PORT (loopback) or unix:PATH"))?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "`{text}`: the roles' endpoints listen on a loopback address or a Unix socket only"
            ));
        }
        Ok(Listen::Tcp(addr))
    }
}

enum Bound {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Binds now (so a taken address stops the daemon's start), then serves
/// until the task is dropped.
pub async fn serve(
    listen: &Listen,
    broker: Arc<Broker>,
    token: String,
) -> std::io::Result<impl Future<Output = ()> + use<>> {
    let bound = match listen {
        Listen::Tcp(addr) => Bound::Tcp(tokio::net::TcpListener::bind(addr).await?),
        Listen::Unix(path) => {
            // A socket left by an earlier daemon goes; anything else at the
            // path stays, and binding fails with the reason.
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path)?;
            }
            let listener = tokio::net::UnixListener::bind(path)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Bound::Unix(listener)
        }
    };
    let token: Arc<str> = Arc::from(token);
    Ok(async move {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut waiting = Waiting::default();
        loop {
            // Accepted at once: a connection waits for its head under the
            // unauthenticated bound, not in the backlog.
            let accepted = match &bound {
                Bound::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
                Bound::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
            };
            let Ok(stream) = accepted else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let evicted = waiting.admit();
            let (broker, token, slots) = (broker.clone(), token.clone(), slots.clone());
            match stream {
                Stream::Tcp(s) => tokio::spawn(connection(s, broker, token, slots, evicted)),
                Stream::Unix(s) => tokio::spawn(connection(s, broker, token, slots, evicted)),
            };
        }
    })
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// One connection: its head, then, with the right token, a slot and its
/// one request through hyper.
async fn connection<S>(
    mut stream: S,
    broker: Arc<Broker>,
    token: Arc<str>,
    slots: Arc<Semaphore>,
    evicted: tokio::sync::oneshot::Receiver<()>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Head::Authorized(head) = read_head(&mut stream, &token, evicted).await else {
        return;
    };
    let Ok(_permit) = slots.acquire_owned().await else {
        return;
    };
    let service = hyper::service::service_fn(move |request| {
        let (broker, token) = (broker.clone(), token.clone());
        async move { Ok::<_, Infallible>(answer(&broker, &token, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(false);
    let io = hyper_util::rt::TokioIo::new(Replay::new(head, stream));
    let _ = builder.serve_connection(io, service).await;
}

async fn answer(
    broker: &Arc<Broker>,
    token: &str,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let auth = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if !authorized(auth, token) {
        let mut response = reply(error(401, "unauthorized", "a bearer token is required"));
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return response;
    }
    match route(request.method().as_str(), request.uri().path()) {
        Route::List => reply(list_answer(&broker.role_infos())),
        Route::Metrics => metrics(broker).await,
        Route::Prompt { name } => reply(prompt(broker, name, request).await),
        Route::WrongMethod { allowed } => {
            let mut response = reply(error(405, "method_not_allowed", format!("use {allowed}")));
            response.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static(allowed),
            );
            response
        }
        Route::NotFound => reply(error(404, "not_found", "no such endpoint")),
    }
}

async fn prompt(broker: &Arc<Broker>, name: String, request: Request<Incoming>) -> Answer {
    if broker.role_info(&name).is_none() {
        return error(404, "not_found", format!("no role `{name}`"));
    }
    // A slow body would hold a slot: it has a bound of its own.
    let read = Limited::new(request.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => {
            return error(
                413,
                "bad_request",
                format!("the body is over {MAX_BODY} bytes"),
            );
        }
        Err(_) => return error(408, "timeout", "the body did not arrive in time"),
    };
    let args = match super::prompt_args(&body) {
        Ok(args) => args,
        Err(why) => return error(400, "bad_request", why),
    };
    let broker = broker.clone();
    match tokio::task::spawn_blocking(move || broker.resolve_role(&name, args, None)).await {
        Ok(outcome) => prompt_answer(outcome),
        Err(e) => error(500, "agent_error", e.to_string()),
    }
}

/// The metrics, the team read off the runtime (the store blocks).
async fn metrics(broker: &Arc<Broker>) -> Response<Full<Bytes>> {
    let broker = broker.clone();
    match tokio::task::spawn_blocking(move || broker.metrics_text()).await {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        Err(e) => reply(error(500, "internal", e.to_string())),
    }
}

fn reply(answer: Answer) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(&answer.body).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = hyper::StatusCode::from_u16(answer.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
