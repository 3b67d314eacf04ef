//! The TCP listener for relays on other hosts (beside `tls`, which knows
//! nothing of the broker: no import loop): mutual TLS, the agent named
//! by the certificate the client shows (its recorded SHA-256), then the
//! same MCP session as on the agent's socket, the certificate checked
//! again at every line (crate::gate).
//!
//! Anyone on the network can connect, so nothing a client without a
//! certificate does may cost the agents on their sockets: handshakes have
//! their own small budget and a short deadline, and a connection takes a
//! permit of the daemon's total (shared with the sockets) only once its
//! certificate names an agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::broker::Broker;
use crate::gate::{ConnectionLimits, error_line, serve_connection};

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// Handshakes in progress at once; more clients wait in the backlog.
const HANDSHAKES: usize = 64;

/// The limits a listener applies.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The daemon's connections (shared with the agents' sockets).
    pub total: Arc<Semaphore>,
    /// Each agent's connections over TLS.
    pub per_agent: usize,
}

/// Accepts relays until the task is aborted.
pub async fn accept_loop(
    broker: Arc<Broker>,
    limits: Limits,
    listener: TcpListener,
    configs: watch::Receiver<Arc<rustls::ServerConfig>>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
    // An agent's entry lives as long as the listener: a few bytes each.
    let per_agent: Arc<std::sync::Mutex<HashMap<String, Arc<Semaphore>>>> = Arc::default();
    loop {
        // A handshake slot first: a flood of idle clients waits in the
        // kernel's backlog instead of holding anything of the daemon's.
        let Ok(slot) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: not a reason to spin.
                tracing::warn!(error = %e, "TLS listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The authorities trusted now (follow_authorities).
        let acceptor = TlsAcceptor::from(configs.borrow().clone());
        let (broker, limits, per_agent) = (broker.clone(), limits.clone(), per_agent.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(slot);
            let Ok(Ok(stream)) = handshake else {
                // Debug only: anyone can cause these.
                tracing::debug!(%peer, "TLS handshake failed or timed out");
                return;
            };
            let leaf = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first());
            let shown = leaf.map(|cert| crate::tls::fingerprint(cert.as_ref()));
            let in_cert = leaf.and_then(|cert| crate::tls::agent_named(cert.as_ref()));
            // The recorded agent, and only if the certificate names it.
            let named = shown
                .as_deref()
                .and_then(|f| broker.agent_of_certificate(f))
                .filter(|agent| in_cert.as_deref() == Some(agent.as_str()));
            let (Some(agent_id), Some(fingerprint)) = (named, shown) else {
                // Issued by this authority, but revoked (its agent removed
                // or the certificate replaced).
                tracing::warn!(%peer, "TLS: a certificate of no agent, refused");
                refuse(
                    stream,
                    "this certificate speaks for no agent: revoked, or its agent was removed",
                )
                .await;
                return;
            };
            let agent_limit = per_agent.lock().map(|mut map| {
                map.entry(agent_id.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(limits.per_agent)))
                    .clone()
            });
            let permits = (
                agent_limit.ok().and_then(|l| l.try_acquire_owned().ok()),
                limits.total.clone().try_acquire_owned().ok(),
            );
            let (Some(agent_permit), Some(total_permit)) = permits else {
                broker.audit_refusal(&agent_id, "(connect)", "too_many_connections");
                refuse(stream, "too many connections for this agent").await;
                return;
            };
            let limits = ConnectionLimits::default();
            serve_connection(broker, agent_id, stream, limits, Some(fingerprint)).await;
            drop((agent_permit, total_permit));
        });
    }
}

/// How often a daemon looks for a rotation or a retirement by any daemon
/// of the team.
const FOLLOW_EVERY: Duration = Duration::from_secs(2);

/// With a team authority: whenever the team's authorities change (a
/// rotation, a retirement, by any daemon), a new listener configuration
/// trusting those now, with its certificate issued again. Connections
/// already open keep theirs: a rotation drops no agent. Returns only when
/// the listener is gone.
pub async fn follow_authorities(
    broker: Arc<Broker>,
    names: Vec<String>,
    configs: watch::Sender<Arc<rustls::ServerConfig>>,
) {
    let mut known: Option<Vec<(String, crate::store::AuthorityState)>> = None;
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        if configs.is_closed() {
            return;
        }
        let looked = broker.clone();
        let Ok(Ok(Some(rows))) =
            tokio::task::spawn_blocking(move || looked.team_authorities()).await
        else {
            // No team authority, or the database is away: as it was.
            continue;
        };
        let now: Vec<_> = rows.into_iter().map(|r| (r.fingerprint, r.state)).collect();
        if known.as_ref() == Some(&now) {
            continue;
        }
        let (building, names) = (broker.clone(), names.clone());
        let built =
            tokio::task::spawn_blocking(move || building.authority()?.server_config(&names)).await;
        match built {
            Ok(Ok(config)) => {
                tracing::info!(
                    authorities = now.len(),
                    "the team's authorities changed: the listener follows"
                );
                let _ = configs.send(config);
                known = Some(now);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the team's authorities changed, but cannot be loaded")
            }
            Err(_) => {}
        }
    }
}

/// A `-32000` line saying why, then the end of the connection. What the
/// client already sent is read and dropped before the socket closes: a
/// socket closed with unread data sends a reset, which can destroy the
/// line on its way.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, why: &str) {
    let line = error_line(&serde_json::Value::Null, -32000, why);
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let _ = stream.write_all(&line).await;
        let _ = stream.write_all(b"\n").await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left = 1usize << 20;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}
