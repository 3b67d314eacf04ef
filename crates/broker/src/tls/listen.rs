//! The TCP listener for relays on other hosts: mutual TLS, the agent named
//! by the certificate the client shows (its recorded SHA-256), then the
//! same MCP session as on the agent's socket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::broker::Broker;
use tokio::io::AsyncWriteExt;

use crate::gate::{ConnectionLimits, error_line, serve_connection};

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts relays until the task is aborted. `total` bounds connections
/// (shared with the agents' sockets), `per_agent_limit` each agent's.
pub async fn accept_loop(
    broker: Arc<Broker>,
    total: Arc<Semaphore>,
    per_agent_limit: usize,
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) {
    let acceptor = TlsAcceptor::from(config);
    // The agents' own limit, as on their sockets (an agent's entry lives
    // as long as the listener: a few bytes per agent).
    let per_agent: Arc<std::sync::Mutex<HashMap<String, Arc<Semaphore>>>> = Arc::default();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: not a reason to spin.
                tracing::warn!(error = %e, "TLS listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = total.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "TLS listener: too many connections, refused");
            continue;
        };
        let (acceptor, broker, per_agent) = (acceptor.clone(), broker.clone(), per_agent.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "TLS handshake refused");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let shown = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| super::fingerprint(cert.as_ref()));
            let Some(agent_id) = shown
                .as_deref()
                .and_then(|f| broker.agent_of_certificate(f))
            else {
                // Issued by this authority, but revoked (its agent removed
                // or the certificate replaced): told, then closed.
                tracing::warn!(%peer, fingerprint = ?shown, "TLS: a certificate of no agent, refused");
                refuse(
                    stream,
                    "this certificate speaks for no agent: revoked, or its agent was removed",
                )
                .await;
                return;
            };
            let agent_permit = per_agent
                .lock()
                .map(|mut map| {
                    map.entry(agent_id.clone())
                        .or_insert_with(|| Arc::new(Semaphore::new(per_agent_limit)))
                        .clone()
                })
                .ok()
                .and_then(|limit| limit.try_acquire_owned().ok());
            let Some(agent_permit) = agent_permit else {
                broker.audit_refusal(&agent_id, "(connect)", "too_many_connections");
                refuse(stream, "too many connections for this agent").await;
                return;
            };
            serve_connection(broker, agent_id, stream, ConnectionLimits::default()).await;
            drop((permit, agent_permit));
        });
    }
}

/// A `-32000` line saying why, then the end of the connection.
async fn refuse<S: tokio::io::AsyncWrite + Unpin>(mut stream: S, why: &str) {
    let line = error_line(&serde_json::Value::Null, -32000, why);
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let _ = stream.write_all(&line).await;
        let _ = stream.write_all(b"\n").await;
        let _ = stream.shutdown().await;
    })
    .await;
}
