//! The upstream servers' state the broker reads: each server's slot
//! (status, its pinned tools, its client while it runs), and the version
//! that changes whenever a menu must be built again. `runtime` fills it.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use serde::Serialize;
use serde_json::{Map, Value};

use super::config::{Category, ServerSource, UpstreamConfig, UpstreamServer};
use super::error::UpstreamError;
use super::menu::{PinState, ServerTools, UpstreamTool};
use super::pins;
use super::relay::{ProgressTarget, Relay};
use crate::locks::{LockAnyway, RwLockAnyway};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ServerStatus {
    Disabled,
    Starting,
    Up {
        /// The launcher's pid (its sandbox dies with it).
        pid: Option<u32>,
        /// The MCP protocol version the server answered to `initialize`
        /// (the broker offers `OFFERED_PROTOCOL`).
        protocol_version: String,
    },
    Down {
        reason: String,
    },
}

#[derive(Debug)]
pub(crate) struct SlotState {
    pub(crate) status: ServerStatus,
    pub(crate) tools: Vec<(UpstreamTool, PinState)>,
    pub(crate) peer: Option<Peer<RoleClient>>,
    /// The session's health (a remote server's): a call that fails once
    /// the session is found gone says the server is restarting.
    pub(crate) health: Option<crate::upstream_supervisor::health::Health>,
    pub(crate) restarts: u32,
}

#[derive(Debug)]
pub struct ServerSlot {
    pub config: UpstreamServer,
    state: RwLock<SlotState>,
    /// Whether the server runs now (the file's `enabled`, then `tools
    /// enable|disable`) and how many times it was switched: its supervisor
    /// restarts it on every switch, so an off-and-on it did not see still
    /// drops the old connection.
    enabled: tokio::sync::watch::Sender<(bool, u64)>,
}

impl ServerSlot {
    pub fn enabled(&self) -> bool {
        self.enabled.borrow().0
    }

    pub(crate) fn watch_enabled(&self) -> tokio::sync::watch::Receiver<(bool, u64)> {
        self.enabled.subscribe()
    }

    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, SlotState> {
        self.state.read_anyway()
    }

    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, SlotState> {
        self.state.write_anyway()
    }
}

/// Why a server without a session cannot be called: it is restarting, or
/// it waits for an operator's `tools login` (it is down for that reason).
fn not_running(slot: &ServerSlot) -> UpstreamError {
    let server = slot.config.name.clone();
    let needs_login =
        crate::upstream_supervisor::oauth::OAuthError::LoginNeeded(server.clone()).to_string();
    match &slot.read().status {
        ServerStatus::Down { reason } if reason.contains(&needs_login) => {
            UpstreamError::NotAuthorized(server)
        }
        _ => UpstreamError::NotRunning(server),
    }
}

/// Every configured server, in config order, and a version that changes
/// whenever any server's tools do (menus are cached by it).
#[derive(Debug, Default)]
pub struct Upstreams {
    pub(crate) slots: Vec<ServerSlot>,
    version: AtomicU64,
    /// Set when the daemon stops: every server is stopped.
    stopping: tokio::sync::watch::Sender<bool>,
    /// The servers' supervision tasks.
    supervisors: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Notifications between the agents connected and the servers.
    pub relay: Relay,
}

/// What ties an upstream call to the agent's request: its cancellation
/// (the agent's `notifications/cancelled`) and where progress goes.
pub struct CallLink<C> {
    pub cancelled: C,
    pub progress: Option<ProgressTarget>,
}

impl<C> std::fmt::Debug for CallLink<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLink")
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}

impl CallLink<std::future::Pending<()>> {
    /// A call no agent can cancel, with no progress wanted.
    pub fn none() -> Self {
        Self {
            cancelled: std::future::pending(),
            progress: None,
        }
    }
}

impl Upstreams {
    pub fn new(config: UpstreamConfig) -> Self {
        let slots = config
            .servers
            .into_iter()
            .map(|config| ServerSlot {
                state: RwLock::new(SlotState {
                    status: if config.enabled {
                        ServerStatus::Starting
                    } else {
                        ServerStatus::Disabled
                    },
                    tools: Vec::new(),
                    peer: None,
                    health: None,
                    restarts: 0,
                }),
                enabled: tokio::sync::watch::Sender::new((config.enabled, 0)),
                config,
            })
            .collect();
        Self {
            slots,
            version: AtomicU64::new(0),
            stopping: tokio::sync::watch::Sender::new(false),
            supervisors: Default::default(),
            relay: Relay::default(),
        }
    }

    pub(crate) fn supervised(&self, task: tokio::task::JoinHandle<()>) {
        self.supervisors.lock_anyway().push(task);
    }

    pub(crate) fn watch_stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Stops every server (a local one's launcher gets SIGTERM and removes
    /// what it made in the workspace) and waits for them, at most `within`.
    pub async fn stop(&self, within: Duration) {
        self.stopping.send_replace(true);
        let tasks = std::mem::take(&mut *self.supervisors.lock_anyway());
        if tokio::time::timeout(within, futures::future::join_all(tasks))
            .await
            .is_err()
        {
            tracing::warn!("upstream servers did not stop within {within:?}");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Switches a server on or off (its supervisor starts or stops it);
    /// false when it was so already. A core server is never switched off.
    pub fn switch(&self, server: &str, on: bool) -> Result<bool, UpstreamError> {
        let slot = self
            .slot(server)
            .ok_or_else(|| UpstreamError::UnknownServer(server.to_string()))?;
        if !on && slot.config.category == Category::Core {
            return Err(UpstreamError::Core(server.to_string()));
        }
        let changed = slot.enabled.send_if_modified(|(enabled, switches)| {
            let changed = *enabled != on;
            if changed {
                *enabled = on;
                *switches += 1;
            }
            changed
        });
        if changed {
            if !on {
                let mut state = slot.write();
                state.status = ServerStatus::Disabled;
                state.peer = None;
                state.health = None;
            }
            self.bump();
        }
        Ok(changed)
    }

    /// Ends the session of `server`, if it has one, and marks it down with
    /// `reason` (`tools logout`: the tokens it was opened with are gone).
    /// Its supervisor connects afresh, as after a session found gone.
    pub fn end_session(&self, server: &str, reason: &str) {
        let Some(slot) = self.slot(server) else {
            return;
        };
        let mut state = slot.write();
        let Some(health) = state.health.take() else {
            return;
        };
        health.lost(reason.to_string());
        state.peer = None;
        state.status = ServerStatus::Down {
            reason: reason.to_string(),
        };
    }

    /// `text` (an error an agent will read) without the query of the
    /// server's URL, where an operator may have put a key: the HTTP
    /// client's errors print the URL they failed on.
    pub fn redact(&self, server: &str, text: String) -> String {
        let Some(slot) = self.slot(server) else {
            return text;
        };
        let ServerSource::Remote(remote) = &slot.config.source else {
            return text;
        };
        match remote.url.split_once('?') {
            Some((_, query)) if !query.is_empty() => text.replace(query, "[redacted]"),
            _ => text,
        }
    }

    /// What each enabled server offers now (last known while it restarts).
    pub fn server_tools(&self) -> Vec<ServerTools> {
        self.slots
            .iter()
            .filter(|s| s.enabled())
            .map(|s| ServerTools {
                server: s.config.name.clone(),
                tools: s.read().tools.clone(),
            })
            .collect()
    }

    /// For `tools list`: each server's status, restarts and tools.
    pub fn report(&self) -> Vec<Value> {
        self.slots
            .iter()
            .map(|s| {
                let state = s.read();
                serde_json::json!({
                    "server": s.config.name, "category": s.config.category,
                    "enabled": s.enabled(), "status": state.status, "restarts": state.restarts,
                    "tools": state.tools.iter().map(|(t, pin)| serde_json::json!({"tool": t.name, "pin": pin})).collect::<Vec<_>>(),
                })
            })
            .collect()
    }

    fn slot(&self, server: &str) -> Option<&ServerSlot> {
        self.slots.iter().find(|s| s.config.name == server)
    }

    pub fn timeout_of(&self, server: &str) -> Duration {
        self.slot(server)
            .map_or(Duration::from_secs(30), |s| s.config.timeout)
    }

    /// Calls `tool` on `server`: an error at once when the server is not
    /// up; after its timeout the request is cancelled upstream.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, UpstreamError> {
        self.call_linked(server, tool, arguments, CallLink::none())
            .await
    }

    /// `call`, for an agent's request: cancelled upstream when `link`'s
    /// cancellation resolves; the server's progress goes to the agent.
    pub async fn call_linked(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        link: CallLink<impl std::future::Future<Output = ()>>,
    ) -> Result<CallToolResult, UpstreamError> {
        let slot = self
            .slot(server)
            .ok_or_else(|| UpstreamError::UnknownServer(server.to_string()))?;
        let (peer, health) = {
            let state = slot.read();
            let peer = state.peer.clone();
            (peer, state.health.clone())
        };
        let peer = peer.ok_or_else(|| not_running(slot))?;
        // A call that fails because the session is gone: the server is
        // being connected afresh.
        let service = |source| {
            if health.as_ref().is_some_and(|h| h.is_lost()) {
                UpstreamError::NotRunning(server.to_string())
            } else {
                UpstreamError::Service {
                    server: server.to_string(),
                    source,
                }
            }
        };
        let timeout = slot.config.timeout;
        let mut options = PeerRequestOptions::no_options();
        options.timeout = Some(timeout);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(tool.to_string()).with_arguments(arguments),
        ));
        let handle = peer
            .send_cancellable_request(request, options)
            .await
            .map_err(service)?;
        let _route = link.progress.map(|to| {
            self.relay
                .route_progress(server, handle.progress_token.clone(), to)
        });
        let id = handle.id.clone();
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            () = link.cancelled => {
                let why = Some("cancelled by the agent".to_string());
                let cancel = rmcp::model::CancelledNotificationParam::new(Some(id), why);
                let _ = peer.notify_cancelled(cancel).await;
                return Err(UpstreamError::Cancelled(server.to_string()));
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(UpstreamError::UnexpectedAnswer(server.to_string())),
            Err(ServiceError::Timeout { .. }) => Err(UpstreamError::TimedOut {
                server: server.to_string(),
                ms: timeout.as_millis(),
            }),
            Err(e) => Err(service(e)),
        }
    }

    /// Whether `server` lists `tool` with an output schema.
    pub fn has_output_schema(&self, server: &str, tool: &str) -> bool {
        self.slot(server).is_some_and(|slot| {
            slot.read()
                .tools
                .iter()
                .any(|(t, _)| t.name == tool && t.output_schema.is_some())
        })
    }

    /// Marks a tool approved in its server's current list (after its pin
    /// was approved), so menus list it again.
    pub fn approved(&self, server: &str, tool: &str) {
        if let Some(slot) = self.slot(server) {
            for (t, pin) in slot.write().tools.iter_mut() {
                if t.name == tool {
                    *pin = PinState::Approved;
                }
            }
            self.bump();
        }
    }

    /// Menus must be built again: the agents connected are told.
    pub(crate) fn bump(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.relay.tools_changed();
    }
}

/// The hash and the flag of a definition, for the store.
pub fn pin_inputs(tool: &UpstreamTool) -> (String, String, Option<String>) {
    (
        pins::definition_hash(tool),
        pins::canonical_json(&pins::definition(tool)),
        pins::suspicious(tool),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::config::parse;

    #[test]
    fn servers_switch_on_and_off_but_core_stays_on() {
        let config = parse(
            r#"{"mcpServers": {
                "core": {"command": "c", "category": "core"},
                "off": {"command": "o", "enabled": false},
                "on": {"url": "https://example.com/mcp"}
            }}"#,
        )
        .unwrap();
        let upstreams = Upstreams::new(config);
        let enabled = |u: &Upstreams| {
            u.server_tools()
                .into_iter()
                .map(|s| s.server)
                .collect::<Vec<_>>()
        };
        assert_eq!(enabled(&upstreams), ["core", "on"]);
        let version = upstreams.version();
        assert!(matches!(
            upstreams.switch("core", false),
            Err(UpstreamError::Core(_))
        ));
        assert!(matches!(
            upstreams.switch("nothing", true),
            Err(UpstreamError::UnknownServer(_))
        ));
        assert_eq!(upstreams.version(), version, "a refusal changes nothing");
        assert!(upstreams.switch("off", true).unwrap());
        assert!(!upstreams.switch("off", true).unwrap(), "already on");
        assert!(upstreams.switch("on", false).unwrap());
        assert_eq!(enabled(&upstreams), ["core", "off"]);
        assert!(upstreams.version() > version, "menus are built again");
        let slot = upstreams.slot("on").unwrap();
        assert_eq!(slot.read().status, ServerStatus::Disabled);
        assert!(upstreams.switch("core", true).is_ok(), "on is fine");
    }

    #[test]
    fn a_remote_urls_query_never_reaches_an_agent() {
        let config = parse(
            r#"{"mcpServers": {"q": {"url": "https://example.com/mcp?api_key=s3cret&x=1"},
                               "l": {"command": "c"}}}"#,
        )
        .unwrap();
        let upstreams = Upstreams::new(config);
        let error = "error sending request for url (https://example.com/mcp?api_key=s3cret&x=1)";
        assert_eq!(
            upstreams.redact("q", error.to_string()),
            "error sending request for url (https://example.com/mcp?[redacted])"
        );
        assert_eq!(upstreams.redact("l", "as is".into()), "as is");
    }
}
