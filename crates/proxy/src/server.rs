//! The proxy server: HTTP CONNECT (and plain-HTTP forward requests) on a
//! Unix socket that is bound into one sandbox, so the agent is the socket.
//! One tokio task per connection; every decision is one audit line.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::rules::{ProxyRules, Refusal};

/// The longest request head read before the request is refused.
pub const MAX_HEAD: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: String, port: u16 },
    /// `GET http://host[:port]/path HTTP/1.1`: forwarded in origin form.
    Forward {
        host: String,
        port: u16,
        /// The request line and headers to send upstream.
        head: String,
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
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line `{line}`"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported protocol `{version}`"));
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, None)?;
        return Ok(Target::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(format!(
            "`{target}`: plain requests must be absolute `http://` URLs; use CONNECT for TLS"
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host_port(authority, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    for header in lines {
        let name = header.split(':').next().unwrap_or("").to_ascii_lowercase();
        if name.starts_with("proxy-") {
            continue;
        }
        out.push_str(header);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    Ok(Target::Forward {
        host,
        port,
        head: out,
    })
}

#[derive(Debug, Serialize)]
struct AuditLine<'a> {
    ts_ms: u128,
    agent: &'a str,
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
/// `shutdown`, then gives open connections up to a second to end, so their
/// audit lines (written when they close) are not lost.
pub async fn serve(
    listener: UnixListener,
    agent: Arc<str>,
    rules: Arc<ProxyRules>,
    audit: Arc<Audit>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut open = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let (agent, rules, audit) = (agent.clone(), rules.clone(), audit.clone());
                open.spawn(async move { handle(stream, &agent, &rules, &audit).await });
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
async fn read_head(stream: &mut UnixStream) -> Result<(String, Vec<u8>), String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            let head =
                String::from_utf8(buf).map_err(|_| "the request head is not UTF-8".to_string())?;
            return Ok((head, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("request head longer than {MAX_HEAD} bytes"));
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(if buf.is_empty() {
                String::new()
            } else {
                "the client closed before the request ended".into()
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn resolve(rules: &ProxyRules, host: &str, port: u16) -> Result<Vec<IpAddr>, Refusal> {
    if let Some(ip) = rules.hosts.get(host) {
        return Ok(vec![*ip]);
    }
    let found = tokio::net::lookup_host((host, port))
        .await
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

async fn handle(mut stream: UnixStream, agent: &str, rules: &ProxyRules, audit: &Audit) {
    let mut line = AuditLine {
        ts_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
        agent,
        host: "",
        port: 0,
        decision: "denied",
        reason: "",
        address: None,
        bytes_up: 0,
        bytes_down: 0,
    };
    let head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await;
    let (head, rest) = match head {
        Ok(Ok(read)) => read,
        // A connection closed without a byte asked for nothing (the
        // launcher's readiness probe): nothing to audit.
        Ok(Err(reason)) if reason.is_empty() => return,
        Ok(Err(reason)) => {
            line.reason = &reason;
            audit.record(&line);
            refuse(&mut stream, "400 Bad Request", &reason).await;
            return;
        }
        Err(_) => {
            line.reason = "no request within 10 s";
            audit.record(&line);
            return;
        }
    };
    let target = match parse_request(&head) {
        Ok(target) => target,
        Err(reason) => {
            line.reason = &reason;
            audit.record(&line);
            refuse(&mut stream, "400 Bad Request", &reason).await;
            return;
        }
    };
    let (host, port) = target.host_port();
    line.host = host;
    line.port = port;
    let address = match decide(rules, host, port).await {
        Ok(address) => address,
        Err(refusal) => {
            let reason = refusal.to_string();
            line.reason = &reason;
            audit.record(&line);
            refuse(&mut stream, "403 Forbidden", &reason).await;
            return;
        }
    };
    line.address = Some(address.to_string());
    let upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await;
    let mut upstream = match upstream {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(e)) => {
            let reason = format!("cannot connect to {address}: {e}");
            line.reason = &reason;
            audit.record(&line);
            refuse(&mut stream, "502 Bad Gateway", &reason).await;
            return;
        }
        Err(_) => {
            let reason = format!("no connection to {address} within 10 s");
            line.reason = &reason;
            audit.record(&line);
            refuse(&mut stream, "504 Gateway Timeout", &reason).await;
            return;
        }
    };
    let (opened, head_bytes) = match &target {
        Target::Connect { .. } => (
            stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await,
            0,
        ),
        Target::Forward { head, .. } => (upstream.write_all(head.as_bytes()).await, head.len()),
    };
    let leftover = if rest.is_empty() {
        Ok(())
    } else {
        upstream.write_all(&rest).await
    };
    line.decision = "allowed";
    if opened.is_ok()
        && leftover.is_ok()
        && let Ok((up, down)) =
            tokio::io::copy_bidirectional_with_sizes(&mut stream, &mut upstream, 64 << 10, 64 << 10)
                .await
    {
        line.bytes_up = up + (rest.len() + head_bytes) as u64;
        line.bytes_down = down;
    }
    audit.record(&line);
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
                "GET http://Example.COM/a?b HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\nAccept: */*"
            ),
            Ok(Target::Forward {
                host: "example.com".into(),
                port: 80,
                head: "GET /a?b HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n".into()
            })
        );
        assert_eq!(
            parse_request("GET http://x.test:8080 HTTP/1.0"),
            Ok(Target::Forward {
                host: "x.test".into(),
                port: 8080,
                head: "GET / HTTP/1.0\r\n\r\n".into()
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
        ] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
    }
}
