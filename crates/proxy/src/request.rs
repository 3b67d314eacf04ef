//! A request head an agent sends the proxy, parsed into what it asks for
//! (a tunnel or one forwarded request), or refused with the reason the
//! agent is told (400) and the audit log records.

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("IP literals are not accepted; ask for a host name")]
    IpLiteral,
    #[error("bad port in `{0}`")]
    BadPort(String),
    #[error("`{0}` has no port")]
    NoPort(String),
    #[error("control characters in the request line")]
    ControlCharacters,
    #[error("malformed request line")]
    RequestLine,
    #[error("unsupported protocol version")]
    Version,
    #[error("plain requests must be absolute `http://` URLs; use CONNECT for TLS")]
    NotAbsolute,
    #[error("malformed header line")]
    Header,
    #[error("chunked request bodies are not forwarded; use CONNECT")]
    Chunked,
    #[error("bad Content-Length")]
    ContentLength,
    #[error("conflicting Content-Length headers")]
    ConflictingLengths,
}

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
    pub(crate) fn host_port(&self) -> (&str, u16) {
        match self {
            Self::Connect { host, port } | Self::Forward { host, port, .. } => (host, *port),
        }
    }
}

fn split_host_port(
    authority: &str,
    default_port: Option<u16>,
) -> Result<(String, u16), RequestError> {
    if authority.starts_with('[') {
        return Err(RequestError::IpLiteral);
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| RequestError::BadPort(authority.to_string()))?,
        ),
        None => (
            authority,
            default_port.ok_or_else(|| RequestError::NoPort(authority.to_string()))?,
        ),
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// Parses a request head (request line and headers, without the blank line).
pub fn parse_request(head: &str) -> Result<Target, RequestError> {
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    // A bare LF (or any control character) in the request line could end
    // the line early for the upstream server: a second, smuggled request.
    if line.chars().any(|c| c.is_control()) {
        return Err(RequestError::ControlCharacters);
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::RequestLine);
    };
    if !version.starts_with("HTTP/1.") {
        return Err(RequestError::Version);
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, None)?;
        return Ok(Target::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(RequestError::NotAbsolute);
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
) -> Result<Target, RequestError> {
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
            return Err(RequestError::Header);
        };
        let name = name.to_ascii_lowercase();
        let bad_value = value.chars().any(|c| c.is_control() && c != '\t');
        if name.is_empty()
            || name.contains(|c: char| c.is_whitespace() || c.is_control())
            || bad_value
        {
            return Err(RequestError::Header);
        }
        match name.as_str() {
            "transfer-encoding" => {
                return Err(RequestError::Chunked);
            }
            "content-length" => {
                let length: u64 = value
                    .trim()
                    .parse()
                    .map_err(|_| RequestError::ContentLength)?;
                if body.is_some_and(|b| b != length) {
                    return Err(RequestError::ConflictingLengths);
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
}
