//! The proxy server: HTTP CONNECT (and plain-HTTP forward requests) on a
//! Unix socket that is bound into one sandbox, so the agent is the socket.
//! One tokio task per connection, at most `MAX_CONNECTIONS` at once. Every
//! decision is audited when it is made; an allowed connection gets a
//! second line with its byte counts when it closes.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::request::{Target, parse_request};
use crate::rules::{ProxyRules, Refusal};

/// The longest request head read before the request is refused.
pub const MAX_HEAD: usize = 16 * 1024;
/// Connections one sandbox may have open through its proxy.
pub const MAX_CONNECTIONS: usize = 256;
/// The longest reason written to the audit log (an agent controls part of it).
const MAX_REASON: usize = 300;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const DNS_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Copy buffers: tokio's default 8 KiB halves the throughput (docs/benchmarks.md).
const BUFFER: usize = 64 << 10;

#[derive(Debug, Serialize)]
struct AuditLine<'a> {
    ts_ms: u128,
    agent: &'a str,
    /// `decision` when it is made; `closed` when an allowed connection ends.
    event: &'static str,
    host: &'a str,
    port: u16,
    decision: &'static str,
    reason: &'a str,
    address: Option<String>,
    bytes_up: u64,
    bytes_down: u64,
}

/// Where audit lines go (a file, or stderr).
pub struct Audit {
    out: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Audit")
    }
}

impl Audit {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: Mutex::new(out),
        }
    }

    fn record(&self, line: &AuditLine<'_>) {
        if let Ok(mut text) = serde_json::to_string(line) {
            text.push('\n');
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }
}

/// The proxy of one agent: serves every connection on `listener` until
/// `shutdown`, then gives open connections up to a second to end.
pub async fn serve(
    listener: UnixListener,
    agent: Arc<str>,
    rules: Arc<ProxyRules>,
    audit: Arc<Audit>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut open = tokio::task::JoinSet::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((mut stream, _)) = accepted else { continue };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    let reason = format!("more than {MAX_CONNECTIONS} connections open");
                    audit.record(&Conn::new(&agent).line("decision", "denied", &reason));
                    refuse(&mut stream, "503 Service Unavailable", &reason).await;
                    continue;
                };
                let (agent, rules, audit) = (agent.clone(), rules.clone(), audit.clone());
                open.spawn(async move {
                    handle(stream, &agent, &rules, &audit).await;
                    drop(slot);
                });
            }
            Some(_) = open.join_next(), if !open.is_empty() => {}
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while open.join_next().await.is_some() {}
    })
    .await;
}

/// Reads up to the blank line; returns the head and what came after it.
/// `Err(None)`: closed before a byte (nothing was asked).
async fn read_head(stream: &mut UnixStream) -> Result<(String, Vec<u8>), Option<String>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            let head = String::from_utf8(buf)
                .map_err(|_| Some("the request head is not UTF-8".to_string()))?;
            return Ok((head, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(Some(format!("request head longer than {MAX_HEAD} bytes")));
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| Some(format!("read: {e}")))?;
        if n == 0 {
            return Err(
                (!buf.is_empty()).then(|| "the client closed before the request ended".to_string())
            );
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn resolve(rules: &ProxyRules, host: &str, port: u16) -> Result<Vec<IpAddr>, Refusal> {
    if let Some(ip) = rules.hosts.get(host) {
        return Ok(vec![*ip]);
    }
    let found = tokio::time::timeout(DNS_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| Refusal::NoAddress(host.to_string()))?
        .map_err(|_| Refusal::NoAddress(host.to_string()))?;
    let mut addresses: Vec<IpAddr> = found.map(|a| a.ip()).collect();
    addresses.dedup();
    Ok(addresses)
}

async fn refuse(stream: &mut UnixStream, status: &str, reason: &str) {
    let body = format!("substrat proxy: {reason}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The facts of one connection, for its audit lines.
struct Conn<'a> {
    agent: &'a str,
    host: String,
    port: u16,
    address: Option<SocketAddr>,
}

impl<'a> Conn<'a> {
    fn new(agent: &'a str) -> Self {
        Self {
            agent,
            host: String::new(),
            port: 0,
            address: None,
        }
    }

    fn line<'b>(
        &'b self,
        event: &'static str,
        decision: &'static str,
        reason: &'b str,
    ) -> AuditLine<'b> {
        AuditLine {
            ts_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0),
            agent: self.agent,
            event,
            host: &self.host,
            port: self.port,
            decision,
            reason: cut(reason),
            address: self.address.map(|a| a.to_string()),
            bytes_up: 0,
            bytes_down: 0,
        }
    }
}

fn cut(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

async fn handle(mut stream: UnixStream, agent: &str, rules: &ProxyRules, audit: &Audit) {
    let mut conn = Conn::new(agent);
    let deny =
        |conn: &Conn<'_>, reason: &str| audit.record(&conn.line("decision", "denied", reason));
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(read)) => read,
        // Closed without a byte: the launcher's readiness probe.
        Ok(Err(None)) => return,
        Ok(Err(Some(reason))) => {
            deny(&conn, &reason);
            return refuse(&mut stream, "400 Bad Request", &reason).await;
        }
        Err(_) => return deny(&conn, "no request within 10 s"),
    };
    let target = match parse_request(&head) {
        Ok(target) => target,
        Err(e) => {
            let reason = e.to_string();
            deny(&conn, &reason);
            return refuse(&mut stream, "400 Bad Request", &reason).await;
        }
    };
    let (host, port) = target.host_port();
    (conn.host, conn.port) = (host.to_string(), port);
    let (address, destination) = match decide(rules, host, port).await {
        Ok(decided) => decided,
        Err(refusal) => {
            let reason = refusal.to_string();
            deny(&conn, &reason);
            return refuse(&mut stream, "403 Forbidden", &reason).await;
        }
    };
    conn.address = Some(address);
    let by = destination
        .map(|name| format!("operator destination `{name}`"))
        .unwrap_or_default();
    audit.record(&conn.line("decision", "allowed", &by));
    let upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await;
    let mut upstream = match upstream {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(e)) => {
            let reason = format!("cannot connect to {address}: {e}");
            audit.record(&conn.line("closed", "allowed", &reason));
            return refuse(&mut stream, "502 Bad Gateway", &reason).await;
        }
        Err(_) => {
            let reason = format!("no connection to {address} within 10 s");
            audit.record(&conn.line("closed", "allowed", &reason));
            return refuse(&mut stream, "504 Gateway Timeout", &reason).await;
        }
    };
    let (up, down, error) = match &target {
        Target::Connect { .. } => tunnel(&mut stream, &mut upstream, &rest).await,
        Target::Forward { head, body, .. } => {
            one_request(&mut stream, &mut upstream, head, &rest, *body).await
        }
    };
    let mut closed = conn.line("closed", "allowed", error.as_deref().unwrap_or(""));
    (closed.bytes_up, closed.bytes_down) = (up, down);
    audit.record(&closed);
}

/// CONNECT: 200, then bytes both ways until both sides are done.
async fn tunnel(
    stream: &mut UnixStream,
    upstream: &mut TcpStream,
    rest: &[u8],
) -> (u64, u64, Option<String>) {
    let opened = async {
        stream
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        upstream.write_all(rest).await
    };
    if let Err(e) = opened.await {
        return (0, 0, Some(e.to_string()));
    }
    match tokio::io::copy_bidirectional_with_sizes(stream, upstream, BUFFER, BUFFER).await {
        Ok((up, down)) => (up + rest.len() as u64, down, None),
        Err(e) => (rest.len() as u64, 0, Some(e.to_string())),
    }
}

/// A forward request: its head, exactly its body, then the answer until
/// the server closes. Nothing more of the client's is sent upstream.
async fn one_request(
    stream: &mut UnixStream,
    upstream: &mut TcpStream,
    head: &str,
    rest: &[u8],
    body: u64,
) -> (u64, u64, Option<String>) {
    let early = rest.len().min(usize::try_from(body).unwrap_or(usize::MAX));
    let sent = async {
        upstream.write_all(head.as_bytes()).await?;
        upstream.write_all(&rest[..early]).await?;
        let mut remaining = (&mut *stream).take(body - early as u64);
        tokio::io::copy(&mut remaining, upstream).await
    };
    let up = match sent.await {
        Ok(n) => head.len() as u64 + early as u64 + n,
        Err(e) => return (head.len() as u64, 0, Some(e.to_string())),
    };
    match tokio::io::copy(upstream, stream).await {
        Ok(down) => {
            let _ = stream.shutdown().await;
            (up, down, None)
        }
        Err(e) => (up, 0, Some(e.to_string())),
    }
}

/// Name, then addresses, then the one address to connect to.
/// Where to connect, and the operator's destination that admitted a
/// non-public address (for the audit line).
async fn decide(
    rules: &ProxyRules,
    host: &str,
    port: u16,
) -> Result<(SocketAddr, Option<String>), Refusal> {
    rules.check_name(host, port)?;
    let addresses = resolve(rules, host, port).await?;
    let by = rules.check_addresses(host, port, &addresses)?;
    let first = addresses
        .first()
        .ok_or_else(|| Refusal::NoAddress(host.to_string()))?;
    Ok((SocketAddr::new(*first, port), by.map(String::from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keep-alive client's second request (for another host) must not
    /// reach the first request's server.
    #[tokio::test]
    async fn a_forward_connection_carries_one_request() {
        use tokio::io::AsyncBufReadExt;
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (socket, _) = upstream.accept().await.unwrap();
            let mut reader = tokio::io::BufReader::new(socket);
            let mut seen = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                    break;
                }
                seen.push_str(&line);
            }
            let mut body = [0u8; 2];
            reader.read_exact(&mut body).await.unwrap();
            seen.push_str(std::str::from_utf8(&body).unwrap());
            reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\n\r\nhi")
                .await
                .unwrap();
            reader.get_mut().shutdown().await.unwrap();
            // Anything more the proxy sent would show up here.
            let mut more = Vec::new();
            let _ = reader.read_to_end(&mut more).await;
            (seen, more)
        });
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("p.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let rules = ProxyRules {
            allow: vec![format!("a.test:{port}"), format!("b.test:{port}")],
            allow_private: true,
            hosts: [
                ("a.test".to_string(), "127.0.0.1".parse().unwrap()),
                ("b.test".to_string(), "127.0.0.1".parse().unwrap()),
            ]
            .into(),
            ..ProxyRules::default()
        };
        let audit = Arc::new(Audit::new(Box::new(std::io::sink())));
        tokio::spawn(serve(
            listener,
            Arc::from("t"),
            Arc::new(rules),
            audit,
            std::future::pending(),
        ));
        let mut client = UnixStream::connect(&socket).await.unwrap();
        let two = format!(
            "POST http://a.test:{port}/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\n\r\nokGET http://b.test:{port}/secret HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n"
        );
        client.write_all(two.as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "HTTP/1.1 200 OK\r\n\r\nhi");
        let (seen, more) = server.await.unwrap();
        assert_eq!(
            seen,
            format!(
                "POST /x HTTP/1.1\r\nHost: a.test:{port}\r\nConnection: close\r\nContent-Length: 2\r\nok"
            )
        );
        assert!(
            more.is_empty(),
            "the second request went upstream: {:?}",
            String::from_utf8_lossy(&more)
        );
    }
}
