//! A relay on another host than its broker: `SUBSTRAT_BROKER=tls://HOST:PORT`
//! and `SUBSTRAT_TLS_DIR` holding what `agent cert` wrote (agent.crt,
//! agent.key, ca.crt). The daemon is trusted by its authority's
//! certificate alone (no system roots), by the name HOST; the relay shows
//! the agent's certificate, which is what the daemon knows it by.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How long connecting and the handshake may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// HOST and PORT of a `tls://HOST:PORT` address (HOST may be `[v6]`).
pub fn parse_address(url: &str) -> Result<(String, u16), String> {
    let bad = || format!("SUBSTRAT_BROKER `{url}`: expected tls://HOST:PORT");
    let rest = url.strip_prefix("tls://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let plain = |c: char| c.is_ascii_alphanumeric() || ".-:".contains(c);
    if host.is_empty() || port == 0 || !host.chars().all(plain) {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// The client's configuration from `dir`.
fn client_config(dir: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let pem =
        |file: &str, e: rustls::pki_types::pem::Error| format!("{}: {e}", dir.join(file).display());
    // Every authority the team trusts now (two during a rotation).
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read("ca.crt")?) {
        let ca = ca.map_err(|e| pem("ca.crt", e))?;
        roots.add(ca).map_err(|e| format!("ca.crt: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no certificate", dir.join("ca.crt").display()));
    }
    let cert =
        CertificateDer::from_pem_slice(&read("agent.crt")?).map_err(|e| pem("agent.crt", e))?;
    let key =
        PrivateKeyDer::from_pem_slice(&read("agent.key")?).map_err(|e| pem("agent.key", e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // TLS 1.3 only, as the daemon: 1.2 would show the agent's
    // certificate to the network.
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)
        .map_err(|e| format!("agent.crt and agent.key: {e}"))?;
    Ok(Arc::new(config))
}

/// The daemons of `SUBSTRAT_BROKER`: one `tls://HOST:PORT`, or several
/// separated by commas (the team's daemons, tried in order).
pub fn parse_addresses(text: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = text.split(',').map(|u| u.trim().to_string()).collect();
    for url in &urls {
        parse_address(url)?;
    }
    Ok(urls)
}

/// The first of `urls` that answers, over mutual TLS with the
/// credentials in `dir`; why none did otherwise.
pub async fn connect_any(urls: &[String], dir: &Path) -> Result<TlsStream<TcpStream>, String> {
    let mut why = Vec::new();
    for url in urls {
        match connect(url, dir).await {
            Ok(stream) => return Ok(stream),
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

/// TCP keepalive: a broker host gone silent (powered off, cut off) ends
/// the connection in about 30 s, so the relay fails over instead of
/// waiting on it for ever. Best effort: a refusal leaves the default.
fn keep_alive(tcp: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(15))
        .with_interval(std::time::Duration::from_secs(5))
        .with_retries(3);
    let _ = socket2::SockRef::from(tcp).set_tcp_keepalive(&probes);
}

/// The broker at `url`, over mutual TLS with the credentials in `dir`.
pub async fn connect(url: &str, dir: &Path) -> Result<TlsStream<TcpStream>, String> {
    let (host, port) = parse_address(url)?;
    let config = client_config(dir)?;
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host}: {e}"))?;
    // Bounded: the client's requests are answered (with errors) either way.
    let connecting = async {
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("the broker is not reachable at {host}:{port}: {e}"))?;
        keep_alive(&tcp);
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with the broker at {host}:{port}: {e}"))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| {
            format!(
                "the broker at {host}:{port} did not answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            )
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_connection_to_the_broker_is_kept_alive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let socket = socket2::SockRef::from(&tcp);
        assert!(!socket.keepalive().unwrap());
        keep_alive(&tcp);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap().as_secs(), 15);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
    }

    #[test]
    fn addresses_are_tls_host_and_port_only() {
        assert_eq!(
            parse_address("tls://broker.example:7443"),
            Ok(("broker.example".into(), 7443))
        );
        assert_eq!(
            parse_address("tls://127.0.0.1:1"),
            Ok(("127.0.0.1".into(), 1))
        );
        assert_eq!(parse_address("tls://[::1]:7443"), Ok(("::1".into(), 7443)));
        for bad in [
            "tcp://h:1",
            "tls://h",
            "tls://:1",
            "tls://h:0",
            "tls://h:99999",
            "tls://h/x:1",
            "tls://user@h:1",
            "h:1",
        ] {
            assert!(parse_address(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_addresses("tls://a:1, tls://b:2"),
            Ok(vec!["tls://a:1".to_string(), "tls://b:2".to_string()])
        );
        assert!(parse_addresses("tls://a:1,").is_err());
        assert!(parse_addresses("tls://a:1,tcp://b:2").is_err());
    }
}
