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

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: String, port: u16 },
    /// `GET http://host[:port]/path HTTP/1.1`: one request, forwarded in
    /// origin form with `Host` from the URL and `Connection: close`.
    Forward {
        host: String,
        port: u16,
        /// The request line and headers to send upstream.
        head: String,
        /// The request body's length (`Content-Length`, else 0).
        body: u64,
    },
}

impl Target {
    fn host_port(&self) -> (&str, u16) {
        match self {
            Self::Connect { host, port } | Self::Forward { host, port, .. } => (host, *port),
        }
    }
}

fn split_host_port(authority: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    if authority.starts_with('[') {
        return Err("IP literals are not accepted; ask for a host name".into());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("bad port in `{authority}`"))?,
        ),
        None => (
            authority,
            default_port.ok_or_else(|| format!("`{authority}` has no port"))?,
        ),
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// Parses a request head (request line and headers, without the blank line).
pub fn parse_request(head: &str) -> Result<Target, String> {
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    // A bare LF (or any control character) in the request line could end
    // the line early for the upstream server: a second, smuggled request.
    if line.chars().any(|c| c.is_control()) {
        return Err("control characters in the request line".into());
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line".into());
    };
    if !version.starts_with("HTTP/1.") {
        return Err("unsupported protocol version".into());
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, None)?;
        return Ok(Target::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err("plain requests must be absolute `http://` URLs; use CONNECT for TLS".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host_port(authority, Some(80))?;
    forward(method, &host, port, path, version, lines)
}

/// The head sent upstream: the request line in origin form, `Host` from
/// the URL (a different `Host` header could name a virtual host the
/// allowlist never saw), `Connection: close` (one request per
/// connection: a second one, perhaps for another host, must not reach
/// this one), no hop-by-hop or `Proxy-` headers.
fn forward<'a>(
    method: &str,
    host: &str,
    port: u16,
    path: &str,
    version: &str,
    headers: impl Iterator<Item = &'a str>,
) -> Result<Target, String> {
    let authority = if port == 80 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    let mut out =
        format!("{method} {path} {version}\r\nHost: {authority}\r\nConnection: close\r\n");
    let mut body = None;
    for header in headers {
        let Some((name, value)) = header.split_once(':') else {
            return Err("malformed header line".into());
        };
        let name = name.to_ascii_lowercase();
        let bad_value = value.chars().any(|c| c.is_control() && c != '\t');
        if name.is_empty()
            || name.contains(|c: char| c.is_whitespace() || c.is_control())
            || bad_value
        {
            return Err("malformed header line".into());
        }
        match name.as_str() {
            "transfer-encoding" => {
                return Err("chunked request bodies are not forwarded; use CONNECT".into());
            }
            "content-length" => {
                let length: u64 = value
                    .trim()
                    .parse()
                    .map_err(|_| "bad Content-Length".to_string())?;
                if body.is_some_and(|b| b != length) {
                    return Err("conflicting Content-Length headers".into());
                }
                body = Some(length);
            }
            "host" | "connection" | "keep-alive" | "te" | "upgrade" => continue,
            n if n.starts_with("proxy-") => continue,
            _ => {}
        }
        out.push_str(header);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    Ok(Target::Forward {
        host: host.to_string(),
        port,
        head: out,
        body: body.unwrap_or(0),
    })
}

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
        Err(reason) => {
            deny(&conn, &reason);
            return refuse(&mut stream, "400 Bad Request", &reason).await;
        }
    };
    let (host, port) = target.host_port();
    (conn.host, conn.port) = (host.to_string(), port);
    let address = match decide(rules, host, port).await {
        Ok(address) => address,
        Err(refusal) => {
            let reason = refusal.to_string();
            deny(&conn, &reason);
            return refuse(&mut stream, "403 Forbidden", &reason).await;
        }
    };
    conn.address = Some(address);
    audit.record(&conn.line("decision", "allowed", ""));
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
async fn decide(rules: &ProxyRules, host: &str, port: u16) -> Result<SocketAddr, Refusal> {
    rules.check_name(host, port)?;
    let addresses = resolve(rules, host, port).await?;
    rules.check_addresses(host, &addresses)?;
    let first = addresses
        .first()
        .ok_or_else(|| Refusal::NoAddress(host.to_string()))?;
    Ok(SocketAddr::new(*first, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_into_targets() {
        assert_eq!(
            parse_request("CONNECT api2.cursor.sh:443 HTTP/1.1\r\nHost: api2.cursor.sh:443"),
            Ok(Target::Connect {
                host: "api2.cursor.sh".into(),
                port: 443
            })
        );
        assert_eq!(
            parse_request(
                "POST http://Example.COM/a?b HTTP/1.1\r\nHost: other.example\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nContent-Length: 3\r\nAccept: */*"
            ),
            Ok(Target::Forward {
                host: "example.com".into(),
                port: 80,
                head: "POST /a?b HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\nContent-Length: 3\r\nAccept: */*\r\n\r\n".into(),
                body: 3,
            })
        );
        assert_eq!(
            parse_request("GET http://x.test:8080 HTTP/1.0"),
            Ok(Target::Forward {
                host: "x.test".into(),
                port: 8080,
                head: "GET / HTTP/1.0\r\nHost: x.test:8080\r\nConnection: close\r\n\r\n".into(),
                body: 0,
            })
        );
        for bad in [
            "CONNECT [::1]:443 HTTP/1.1",
            "CONNECT host HTTP/1.1",
            "CONNECT host:0 HTTP/1.1",
            "GET /relative HTTP/1.1",
            "GET https://x.test/ HTTP/1.1",
            "GET http://x.test/ SPDY/3",
            "GARBAGE",
            "POST http://x.test/ HTTP/1.1\r\nTransfer-Encoding: chunked",
            "POST http://x.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4",
            "GET http://x.test/ HTTP/1.1\r\nno colon here",
            "GET http://x.test/ HTTP/1.1\r\nBad Name: x",
            // Found by the proxy_request fuzz target: a bare LF in the path
            // would split the forwarded request line in two.
            "GEV http://kxample.com/\u{1}\0\0hHTTP1/.1[\nhttps://ae.com/a?b HTTP/1.1\r\nhttps:/ keep-alive\r\r\nccept: */*",
            "GET http://x.test/a\rb HTTP/1.1",
            "GET http://x.test/ HTTP/1.1\r\nX: a\rb",
            "GET http://x.test/ HTTP/1.1\r\n: empty name",
        ] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
    }

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
