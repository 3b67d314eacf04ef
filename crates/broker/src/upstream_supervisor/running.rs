//! A server while it is up: watched until its connection ends, its
//! session is found gone, or it is to stop (switched off, the daemon
//! stopping). A local server is stopped with SIGTERM to its launcher,
//! which then removes the mount points it made in the workspace (killed,
//! it could not); a remote one's session is closed (rmcp deletes it).

use std::future::Future;
use std::time::Duration;

use rmcp::model::{ClientRequest, ServerResult};
use rmcp::service::{PeerRequestOptions, QuitReason, RunningService};
use rmcp::{ClientHandler, RoleClient};

use super::health::{Signal, Signals};
use crate::upstream::config::{RemoteTransport, ServerSource};

/// How long a server has to answer a ping after an event stream of its
/// session ended.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a stopped server has to end (its launcher to clean up).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How a run ended.
pub(super) enum Ended {
    /// It went down: why, as the end of "down: ...".
    Down(String),
    /// It was stopped, and has ended (or was given up on).
    Stopped,
}

/// Watches the running server until it ends or `stop` resolves.
pub(super) async fn watch<H: ClientHandler>(
    service: RunningService<RoleClient, H>,
    pid: Option<u32>,
    source: &ServerSource,
    signals: &mut Signals,
    stop: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Ended {
    let peer = service.peer().clone();
    let token = service.cancellation_token();
    let mut waiting = Box::pin(service.waiting());
    let mut stop = stop;
    let lost = loop {
        tokio::select! {
            quit = &mut waiting => return Ended::Down(quit_sentence(quit, source)),
            signal = signals.next() => match signal {
                Signal::Lost(reason) => break Some(reason),
                Signal::StreamEnded => match probe(&peer).await {
                    Ok(()) => continue,
                    Err(reason) => break Some(reason),
                },
            },
            () = &mut stop => break None,
        }
    };
    match lost {
        Some(reason) => {
            // Closed in the background: the server is marked down now.
            token.cancel();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(STOP_TIMEOUT, waiting).await;
            });
            Ended::Down(reason)
        }
        None => {
            match pid {
                Some(pid) => terminate(pid),
                None => token.cancel(),
            }
            if tokio::time::timeout(STOP_TIMEOUT, waiting).await.is_err() {
                tracing::warn!("an upstream server did not end within 5 s of its stop");
            }
            Ended::Stopped
        }
    }
}

/// A ping, after an event stream ended: a server that answers only
/// closed the stream (rmcp opens it again); one that does not is gone.
async fn probe(peer: &rmcp::service::Peer<RoleClient>) -> Result<(), String> {
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(PROBE_TIMEOUT);
    let ping = ClientRequest::PingRequest(Default::default());
    let answer = match peer.send_request_with_option(ping, options).await {
        Ok(handle) => handle.await_response().await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(ServerResult::EmptyResult(_)) | Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "its event stream ended and the server {}",
            crate::upstream::error::service_sentence(&e)
        )),
    }
}

/// SIGTERM to a server's launcher (it ends the sandbox and cleans up).
fn terminate(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    if let Err(e) = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM) {
        tracing::debug!(pid, error = %e, "cannot signal an upstream's launcher");
    }
}

/// Why the connection ended, in words.
fn quit_sentence(
    quit: Result<QuitReason, tokio::task::JoinError>,
    source: &ServerSource,
) -> String {
    match (quit, source) {
        (Ok(QuitReason::Closed), ServerSource::Local(_)) => "its process ended".into(),
        (Ok(QuitReason::Closed), ServerSource::Remote(remote)) => match remote.transport {
            RemoteTransport::Sse => "its event stream ended".into(),
            RemoteTransport::StreamableHttp => "the connection closed".into(),
        },
        (Ok(QuitReason::Cancelled), _) => "the connection was closed by the broker".into(),
        (Ok(_), _) => "the connection ended".into(),
        (Err(e), _) => format!("its connection's task failed: {e}"),
    }
}
