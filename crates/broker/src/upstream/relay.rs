//! Notifications between agents and upstream servers: the agents
//! connected now (their MCP peers, roles and logging levels), progress of
//! a call relayed to the agent that made it under its own token, an
//! upstream's log messages to the agents that see its tools, and
//! `tools/list_changed` to every agent when a menu may have changed.

#![allow(deprecated)] // rmcp marks MCP logging deprecated (SEP-2577); agents still use it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::RoleServer;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::Peer;

use crate::locks::LockAnyway;

/// An agent connected now.
#[derive(Debug, Clone)]
struct Listener {
    role: String,
    peer: Peer<RoleServer>,
    /// The lowest level it asked for (`logging/setLevel`); all until then.
    level: Option<LoggingLevel>,
}

/// Where a call's progress goes: the calling agent, under its token.
#[derive(Debug, Clone)]
pub struct ProgressTarget {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

#[derive(Debug, Default)]
pub struct Relay {
    next: AtomicU64,
    listeners: Mutex<HashMap<u64, Listener>>,
    /// (server, the broker's token for the upstream call) to the agent's.
    progress: Mutex<HashMap<(String, ProgressToken), ProgressTarget>>,
}

/// A connection's place among the listeners, taken at initialization
/// and left when the connection ends (the handler is dropped).
#[derive(Debug, Default)]
pub struct ListenerId(Mutex<Option<u64>>);

impl Relay {
    /// The agent of `role` connected on `peer` hears notifications.
    pub fn listen(&self, id: &ListenerId, role: String, peer: Peer<RoleServer>) {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let listener = Listener {
            role,
            peer,
            level: None,
        };
        self.listeners.lock_anyway().insert(key, listener);
        if let Some(old) = id.0.lock_anyway().replace(key) {
            self.listeners.lock_anyway().remove(&old);
        }
    }

    pub fn leave(&self, id: &ListenerId) {
        if let Some(key) = id.0.lock_anyway().take() {
            self.listeners.lock_anyway().remove(&key);
        }
    }

    /// `logging/setLevel` of a connection.
    pub fn set_level(&self, id: &ListenerId, level: LoggingLevel) {
        let Some(key) = *id.0.lock_anyway() else {
            return;
        };
        if let Some(listener) = self.listeners.lock_anyway().get_mut(&key) {
            listener.level = Some(level);
        }
    }

    /// Every connected agent is told its tools may have changed.
    pub fn tools_changed(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peers: Vec<_> = self
            .listeners
            .lock_anyway()
            .values()
            .map(|l| l.peer.clone())
            .collect();
        for peer in peers {
            runtime.spawn(async move {
                let _ = peer.notify_tool_list_changed().await;
            });
        }
    }

    /// Progress of the upstream call with `token` on `server` goes to
    /// `target` until the guard is dropped.
    pub fn route_progress(
        &self,
        server: &str,
        token: ProgressToken,
        target: ProgressTarget,
    ) -> ProgressRoute<'_> {
        let key = (server.to_string(), token);
        self.progress.lock_anyway().insert(key.clone(), target);
        ProgressRoute { relay: self, key }
    }

    /// An upstream's progress notification, to the agent whose call it is
    /// about (under the agent's token); dropped when no call is routed.
    pub async fn progress(&self, server: &str, mut params: ProgressNotificationParam) {
        let key = (server.to_string(), params.progress_token.clone());
        let Some(target) = self.progress.lock_anyway().get(&key).cloned() else {
            return;
        };
        params.progress_token = target.token;
        let _ = target.peer.notify_progress(params).await;
    }

    /// An upstream's log message, to each connected agent whose role
    /// `sees` (one of the server's tools is in its menu) and whose level
    /// it reaches; its logger is named after the server.
    pub async fn log(
        &self,
        server: &str,
        mut params: LoggingMessageNotificationParam,
        sees: impl Fn(&str) -> bool,
    ) {
        params.logger = Some(match params.logger.take() {
            Some(logger) => format!("{server}/{logger}"),
            None => server.to_string(),
        });
        let peers: Vec<_> = self
            .listeners
            .lock_anyway()
            .values()
            .filter(|l| l.level.is_none_or(|min| rank(params.level) >= rank(min)))
            .map(|l| (l.role.clone(), l.peer.clone()))
            .collect();
        for (role, peer) in peers {
            if sees(&role) {
                let _ = peer.notify_logging_message(params.clone()).await;
            }
        }
    }
}

/// Removes a call's progress route when the call ends.
#[derive(Debug)]
pub struct ProgressRoute<'a> {
    relay: &'a Relay,
    key: (String, ProgressToken),
}

impl Drop for ProgressRoute<'_> {
    fn drop(&mut self) {
        self.relay.progress.lock_anyway().remove(&self.key);
    }
}

/// RFC 5424's order, as MCP's levels follow it.
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_rfc_5424() {
        assert!(rank(LoggingLevel::Emergency) > rank(LoggingLevel::Warning));
        assert!(rank(LoggingLevel::Debug) < rank(LoggingLevel::Info));
    }
}
