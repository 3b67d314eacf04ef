//! Running upstream servers: each enabled stdio server in its own sandbox
//! (`substrat-run`, i.e. `substrat-sandbox run`, with the server's policy, started as a separate
//! process), spoken to as an MCP client (rmcp). Its tools are listed on
//! start and on `notifications/tools/list_changed`, pinned, and published
//! for the menus. A server that exits is restarted with backoff; meanwhile
//! calls to its tools fail at once. Calls time out; a timed-out call is
//! cancelled upstream (`notifications/cancelled`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde::Serialize;
use serde_json::{Map, Value};

use super::config::{UpstreamConfig, UpstreamServer};
use super::menu::{PinState, ServerTools, UpstreamTool};
use super::pins;
use crate::broker::Broker;
use crate::locks::RwLockAnyway;

/// How long a server has to start and list its tools.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How the daemon launches servers' sandboxes.
#[derive(Debug, Clone)]
pub struct UpstreamLaunch {
    /// The launcher (`substrat-run`, the same as `substrat-sandbox run`).
    pub launcher: PathBuf,
    pub backend: String,
    pub state_dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ServerStatus {
    Disabled,
    Starting,
    Up {
        /// The launcher's pid (its sandbox dies with it).
        pid: Option<u32>,
    },
    Down {
        reason: String,
    },
}

#[derive(Debug)]
struct SlotState {
    status: ServerStatus,
    tools: Vec<(UpstreamTool, PinState)>,
    peer: Option<Peer<RoleClient>>,
    restarts: u32,
}

#[derive(Debug)]
pub struct ServerSlot {
    pub config: UpstreamServer,
    state: RwLock<SlotState>,
}

impl ServerSlot {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, SlotState> {
        self.state.read_anyway()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SlotState> {
        self.state.write_anyway()
    }
}

/// Every configured server, in config order, and a version that changes
/// whenever any server's tools do (menus are cached by it).
#[derive(Debug, Default)]
pub struct Upstreams {
    slots: Vec<ServerSlot>,
    version: AtomicU64,
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
                    restarts: 0,
                }),
                config,
            })
            .collect();
        Self {
            slots,
            version: AtomicU64::new(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// What each enabled server offers now (last known while it restarts).
    pub fn server_tools(&self) -> Vec<ServerTools> {
        self.slots
            .iter()
            .filter(|s| s.config.enabled)
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
                    "status": state.status, "restarts": state.restarts,
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
    ) -> Result<CallToolResult, String> {
        let slot = self
            .slot(server)
            .ok_or_else(|| format!("no upstream server `{server}`"))?;
        let peer = slot.read().peer.clone().ok_or_else(|| {
            format!("upstream server `{server}` is not running (restarting); try again later")
        })?;
        let timeout = slot.config.timeout;
        let mut options = PeerRequestOptions::no_options();
        options.timeout = Some(timeout);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(tool.to_string()).with_arguments(arguments),
        ));
        let handle = peer
            .send_cancellable_request(request, options)
            .await
            .map_err(|e| format!("upstream server `{server}`: {e}"))?;
        match handle.await_response().await {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(format!(
                "upstream server `{server}` answered something else"
            )),
            Err(ServiceError::Timeout { .. }) => Err(format!(
                "timed out after {} ms; the call was cancelled upstream",
                timeout.as_millis()
            )),
            Err(e) => Err(format!("upstream server `{server}`: {e}")),
        }
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

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// Starts every enabled server's supervision task.
pub fn spawn_all(broker: &Arc<Broker>, launch: &Arc<UpstreamLaunch>) {
    for (index, slot) in broker.upstreams().slots.iter().enumerate() {
        if slot.config.enabled {
            tokio::spawn(supervise(broker.clone(), launch.clone(), index));
        }
    }
}

/// Tells the supervisor the server's tool list changed.
#[derive(Debug, Clone)]
struct ListChanged {
    broker: Arc<Broker>,
    index: usize,
}

impl ClientHandler for ListChanged {
    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        if let Err(e) = refresh(&self.broker, self.index, &context.peer).await {
            tracing::warn!(error = %e, "cannot list an upstream's tools after list_changed");
        }
    }
}

async fn supervise(broker: Arc<Broker>, launch: Arc<UpstreamLaunch>, index: usize) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let name = broker.upstreams().slots[index].config.name.clone();
        match tokio::time::timeout(START_TIMEOUT, start(&broker, &launch, index)).await {
            Ok(Ok(service)) => {
                backoff = BACKOFF_FIRST;
                tracing::info!(server = %name, "upstream server up");
                let reason = match service.waiting().await {
                    Ok(quit) => format!("exited ({quit:?})"),
                    Err(e) => format!("exited ({e})"),
                };
                mark_down(&broker, index, &reason);
            }
            Ok(Err(reason)) => {
                let log = log_path(&launch, &name);
                mark_down(
                    &broker,
                    index,
                    &format!("{reason} (its log: {})", log.display()),
                );
            }
            Err(_) => mark_down(&broker, index, "did not start within 60 s"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
        let slot = &broker.upstreams().slots[index];
        slot.write().restarts += 1;
        tracing::info!(server = %name, "restarting upstream server");
    }
}

fn mark_down(broker: &Broker, index: usize, reason: &str) {
    let slot = &broker.upstreams().slots[index];
    tracing::warn!(server = %slot.config.name, reason, "upstream server down");
    let mut state = slot.write();
    state.peer = None;
    state.status = ServerStatus::Down {
        reason: reason.to_string(),
    };
}

async fn start(
    broker: &Arc<Broker>,
    launch: &UpstreamLaunch,
    index: usize,
) -> Result<RunningService<RoleClient, ListChanged>, String> {
    let slot = &broker.upstreams().slots[index];
    slot.write().status = ServerStatus::Starting;
    let command = sandboxed_command(broker, launch, &slot.config)?;
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    if let Some(stderr) = stderr {
        tokio::spawn(keep_log(stderr, log_path(launch, &slot.config.name)));
    }
    let pid = transport.id();
    let handler = ListChanged {
        broker: broker.clone(),
        index,
    };
    let service = handler
        .serve(transport)
        .await
        .map_err(|e| format!("initialize failed: {e}"))?;
    let peer = service.peer().clone();
    refresh(broker, index, &peer).await?;
    let mut state = slot.write();
    state.peer = Some(peer);
    state.status = ServerStatus::Up { pid };
    Ok(service)
}

/// Where a server's stderr (and its launcher's) goes: STATE/upstreams/NAME.log.
pub fn log_path(launch: &UpstreamLaunch, server: &str) -> PathBuf {
    launch
        .state_dir
        .join("upstreams")
        .join(format!("{server}.log"))
}

/// Appends the server's stderr to its log; a log over 1 MiB is started
/// afresh at the next start.
async fn keep_log(mut stderr: tokio::process::ChildStderr, path: PathBuf) {
    use tokio::io::AsyncWriteExt;
    let large = std::fs::metadata(&path).is_ok_and(|m| m.len() > 1 << 20);
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(!large)
        .write(true)
        .truncate(large)
        .open(&path)
        .await;
    match file {
        Ok(mut file) => {
            let _ = tokio::io::copy(&mut stderr, &mut file).await;
            let _ = file.flush().await;
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open an upstream's log")
        }
    }
}

/// `substrat-run` for a server: its policy, its workspace, only
/// the allowlisted environment (set in the launcher's environment and
/// passed by name), its death tied to the daemon's.
fn sandboxed_command(
    broker: &Broker,
    launch: &UpstreamLaunch,
    server: &UpstreamServer,
) -> Result<tokio::process::Command, String> {
    let policy = broker
        .roles()
        .get(&server.policy)
        .ok_or_else(|| format!("policy `{}` is not a known role", server.policy))?;
    let policy_arg = if substrat_policy::builtin::is_builtin_label(&policy.path) {
        policy.name.clone()
    } else {
        policy.path.display().to_string()
    };
    let workspace = server
        .workspace
        .clone()
        .unwrap_or_else(|| launch.state_dir.join("upstreams").join(&server.name));
    std::fs::create_dir_all(&workspace)
        .map_err(|e| format!("cannot create {}: {e}", workspace.display()))?;
    // A writable bind source must be free of symlinks (the launcher refuses
    // one that is not): resolve the operator's path now.
    let workspace = workspace
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", workspace.display()))?;
    let mut command = tokio::process::Command::new(&launch.launcher);
    command
        .args(["--policy", &policy_arg, "--backend", &launch.backend])
        .args(["--agent-id", &format!("upstream-{}", server.name)])
        .arg("--workspace")
        .arg(&workspace)
        // The server's own git dir for its workspace, kept with its state.
        .arg("--git-state")
        .arg(
            launch
                .state_dir
                .join("upstreams")
                .join(format!("{}.git", server.name)),
        )
        .args(["--die-with-parent", &std::process::id().to_string()]);
    for name in server.env.keys().chain(server.env_allow.iter()) {
        command.args(["--pass-env", name]);
    }
    command
        .arg("--")
        .arg(&server.command)
        .args(&server.args)
        .envs(&server.env)
        .kill_on_drop(true);
    Ok(command)
}

/// Lists the server's tools, checks each against its pin, publishes them.
async fn refresh(broker: &Broker, index: usize, peer: &Peer<RoleClient>) -> Result<(), String> {
    let tools = peer
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {e}"))?;
    let slot = &broker.upstreams().slots[index];
    let mut checked = Vec::new();
    for (position, tool) in tools.into_iter().enumerate() {
        let tool = upstream_tool(tool);
        let pin = broker
            .check_pin(&slot.config.name, position, &tool)
            .map_err(|e| format!("cannot check pins: {e}"))?;
        checked.push((tool, pin));
    }
    slot.write().tools = checked;
    broker.upstreams().bump();
    Ok(())
}

fn upstream_tool(tool: Tool) -> UpstreamTool {
    UpstreamTool {
        name: tool.name.to_string(),
        description: tool.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*tool.input_schema).clone()),
        annotations: tool
            .annotations
            .and_then(|a| serde_json::to_value(a).ok())
            .unwrap_or(Value::Null),
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
