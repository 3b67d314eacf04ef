//! Running upstream servers: each enabled stdio server in its own sandbox
//! (`substrat-run`, i.e. `substrat-sandbox run`, with the server's policy, started as a separate
//! process), each remote one over HTTP (`remote`), spoken to as an MCP
//! client (rmcp). Its tools are listed on
//! start and on `notifications/tools/list_changed`, pinned, and published
//! for the menus. A server that exits, or whose session is found gone
//! (`health`), is marked down at once and started again with backoff;
//! meanwhile calls to its tools fail at once. Calls time out; a timed-out
//! call is cancelled upstream (`notifications/cancelled`). Stopped, a
//! server is ended gracefully (`running`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::Tool;
use rmcp::service::{NotificationContext, Peer, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;

pub mod client;
pub(crate) mod health;
pub mod oauth;
mod remote;
mod running;
mod sse;
mod standalone;
#[cfg(test)]
mod switch_tests;

use crate::broker::Broker;
use crate::upstream::config::{LocalServer, ServerSource, UpstreamServer};
use crate::upstream::menu::UpstreamTool;
pub use standalone::{ConnectError, connect_remote};

/// Why a server did not start or could not list its tools (its status
/// shows the text).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("policy `{0}` is not a known role")]
    UnknownPolicy(String),
    #[error("cannot {action} {path}: {source}")]
    Workspace {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start: {0}")]
    Start(#[source] std::io::Error),
    #[error("variable `{0}` is not set in the daemon's environment")]
    MissingVariable(String),
    #[error("{0}")]
    Remote(String),
    #[error("initialize failed: {0}")]
    Initialize(#[source] Box<rmcp::service::ClientInitializeError>),
    #[error("initialize: {0}")]
    Version(String),
    #[error("not a remote server")]
    NotRemote,
    #[error("tools/list failed: the server {}", crate::upstream::error::service_sentence(.0))]
    ListTools(#[source] ServiceError),
    #[error("cannot check pins: {0}")]
    Pins(#[source] crate::broker::BrokerError),
}

/// How long a server has to start and list its tools.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// A local server that keeps failing costs a sandbox per start.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A remote one costs a connection: tried often enough to be back within
/// a few seconds of the server's return.
const BACKOFF_MAX_REMOTE: Duration = Duration::from_secs(4);
/// Up this long, a server starts its next backoff afresh.
const STABLE: Duration = Duration::from_secs(10);

/// How the daemon launches servers' sandboxes.
#[derive(Debug, Clone)]
pub struct UpstreamLaunch {
    /// The launcher (`substrat-run`, the same as `substrat-sandbox run`).
    pub launcher: PathBuf,
    pub backend: String,
    pub state_dir: PathBuf,
    /// The operator's destinations file, for servers whose policy has
    /// `network = "proxy"`.
    pub destinations: Option<PathBuf>,
    /// The daemon's `--cgroup-parent`: a server's groups go below it, as
    /// a turn's do.
    pub cgroup_parent: Option<PathBuf>,
    /// The daemon's secrets: removed from every server's launcher.
    pub secret_env: crate::secret_env::SecretEnv,
}

use crate::upstream::registry::ServerStatus;

/// Starts every server's supervision task: an enabled server starts at
/// once, a disabled one when `tools enable` switches it on.
/// `Upstreams::stop` ends them.
pub fn spawn_all(broker: &Arc<Broker>, launch: &Arc<UpstreamLaunch>) {
    for index in 0..broker.upstreams().slots.len() {
        let task = tokio::spawn(supervise(broker.clone(), launch.clone(), index));
        broker.upstreams().supervised(task);
    }
}

/// Tells the supervisor the server's tool list changed.
#[derive(Debug, Clone)]
struct ListChanged {
    broker: Arc<Broker>,
    index: usize,
}

impl ClientHandler for ListChanged {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        client::client_info()
    }

    async fn create_elicitation(
        &self,
        _request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        Err(client::refuse_elicitation())
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let upstreams = self.broker.upstreams();
        let server = &upstreams.slots[self.index].config.name;
        upstreams.relay.progress(server, params).await;
    }

    /// To the agents that see one of the server's tools.
    #[allow(deprecated)] // rmcp marks MCP logging deprecated (SEP-2577).
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let upstreams = self.broker.upstreams();
        let server = &upstreams.slots[self.index].config.name;
        let sees = |role: &str| {
            let menu = self.broker.menu_for_role(role);
            menu.entries
                .iter()
                .any(|e| e.server.as_deref() == Some(server.as_str()))
        };
        upstreams.relay.log(server, params, sees).await;
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        if let Err(e) = refresh(&self.broker, self.index, &context.peer).await {
            let server = &self.broker.upstreams().slots[self.index].config.name;
            tracing::warn!(%server, error = %e, "cannot list an upstream's tools after list_changed");
        }
    }
}

/// Runs the server while it is enabled: started, restarted with backoff
/// when it fails; switched off, it is stopped (its sandbox or connection
/// ended) and waits to be switched on again; the daemon stopping, it is
/// stopped and the task ends.
async fn supervise(broker: Arc<Broker>, launch: Arc<UpstreamLaunch>, index: usize) {
    let slot = &broker.upstreams().slots[index];
    let mut enabled = slot.watch_enabled();
    let mut stopping = broker.upstreams().watch_stopping();
    loop {
        tokio::select! {
            on = enabled.wait_for(|(on, _)| *on) => if on.is_err() { return },
            _ = stopping.wait_for(|s| *s) => return,
        }
        let switches = enabled.borrow().1;
        let stop = async {
            tokio::select! {
                _ = enabled.wait_for(|(_, n)| *n != switches) => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
        };
        run_with_restarts(&broker, &launch, index, stop).await;
        if *stopping.borrow() {
            return;
        }
        // Switched (off, or off and on again); on again, the loop starts
        // it afresh.
        if !slot.enabled() {
            let mut state = slot.write();
            state.status = ServerStatus::Disabled;
            state.peer = None;
            drop(state);
            tracing::info!(server = %slot.config.name, "upstream server disabled");
        }
    }
}

/// Starts the server, watches it, starts it again after a failure (with
/// backoff), until `stop` resolves (then it is stopped gracefully).
async fn run_with_restarts(
    broker: &Arc<Broker>,
    launch: &UpstreamLaunch,
    index: usize,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let slot = &broker.upstreams().slots[index];
    let name = slot.config.name.clone();
    let local = matches!(slot.config.source, ServerSource::Local(_));
    let cap = if local {
        BACKOFF_MAX
    } else {
        BACKOFF_MAX_REMOTE
    };
    let with_log = |reason: String| {
        if local {
            format!("{reason} (its log: {})", log_path(launch, &name).display())
        } else {
            reason
        }
    };
    let mut backoff = BACKOFF_FIRST;
    loop {
        let (health, mut signals) = health::Health::new();
        let started = tokio::select! {
            started = tokio::time::timeout(START_TIMEOUT, start(broker, launch, index, &health)) => started,
            () = &mut stop => return,
        };
        match started {
            Ok(Ok((service, pid))) => {
                let since = std::time::Instant::now();
                tracing::info!(server = %name, "upstream server up");
                let source = &slot.config.source;
                match running::watch(service, pid, source, &mut signals, stop.as_mut()).await {
                    running::Ended::Stopped => return,
                    running::Ended::Down(reason) => mark_down(broker, index, &with_log(reason)),
                }
                if since.elapsed() >= STABLE {
                    backoff = BACKOFF_FIRST;
                }
            }
            Ok(Err(reason)) => mark_down(broker, index, &with_log(reason.to_string())),
            Err(_) => mark_down(broker, index, "did not start within 60 s"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = &mut stop => return,
        }
        backoff = (backoff * 2).min(cap);
        slot.write().restarts += 1;
        tracing::info!(server = %name, "restarting upstream server");
    }
}

fn mark_down(broker: &Broker, index: usize, reason: &str) {
    let slot = &broker.upstreams().slots[index];
    tracing::warn!(server = %slot.config.name, reason, "upstream server down");
    let mut state = slot.write();
    state.peer = None;
    state.health = None;
    state.status = ServerStatus::Down {
        reason: reason.to_string(),
    };
}

/// The service and, for a local server, its launcher's pid.
type Started = (RunningService<RoleClient, ListChanged>, Option<u32>);

async fn start(
    broker: &Arc<Broker>,
    launch: &UpstreamLaunch,
    index: usize,
    health: &health::Health,
) -> Result<Started, StartError> {
    let slot = &broker.upstreams().slots[index];
    slot.write().status = ServerStatus::Starting;
    let handler = ListChanged {
        broker: broker.clone(),
        index,
    };
    let (service, pid) = match &slot.config.source {
        ServerSource::Local(local) => {
            start_local(broker, launch, &slot.config, local, handler).await?
        }
        ServerSource::Remote(remote) => {
            let oauth = oauth::OAuthContext::daemon(&launch.state_dir, &slot.config.name);
            (
                remote::connect(remote, &oauth, handler, health).await?,
                None,
            )
        }
    };
    let peer = service.peer().clone();
    let protocol_version = client::negotiated(&peer).map_err(StartError::Version)?;
    refresh(broker, index, &peer).await?;
    let mut state = slot.write();
    state.peer = Some(peer);
    state.health = Some(health.clone());
    state.status = ServerStatus::Up {
        pid,
        protocol_version: protocol_version.to_string(),
    };
    Ok((service, pid))
}

/// A local server: its sandbox started, MCP over its stdio.
async fn start_local(
    broker: &Broker,
    launch: &UpstreamLaunch,
    server: &UpstreamServer,
    local: &LocalServer,
    handler: ListChanged,
) -> Result<(RunningService<RoleClient, ListChanged>, Option<u32>), StartError> {
    let command = sandboxed_command(broker, launch, &server.name, local)?;
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(StartError::Start)?;
    if let Some(stderr) = stderr {
        tokio::spawn(keep_log(stderr, log_path(launch, &server.name)));
    }
    let pid = transport.id();
    let service = handler
        .serve(transport)
        .await
        .map_err(|e| StartError::Initialize(Box::new(e)))?;
    Ok((service, pid))
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
    name: &str,
    server: &LocalServer,
) -> Result<tokio::process::Command, StartError> {
    let policy = broker
        .roles()
        .get(&server.policy)
        .ok_or_else(|| StartError::UnknownPolicy(server.policy.clone()))?;
    let policy_arg = if substrat_policy::builtin::is_builtin_label(&policy.path) {
        policy.name.clone()
    } else {
        policy.path.display().to_string()
    };
    let workspace = server
        .workspace
        .clone()
        .unwrap_or_else(|| launch.state_dir.join("upstreams").join(name));
    std::fs::create_dir_all(&workspace).map_err(|source| StartError::Workspace {
        action: "create",
        path: workspace.clone(),
        source,
    })?;
    // A writable bind source must be free of symlinks (the launcher refuses
    // one that is not): resolve the operator's path now.
    let workspace = workspace
        .canonicalize()
        .map_err(|source| StartError::Workspace {
            action: "resolve",
            path: workspace.clone(),
            source,
        })?;
    let mut command = tokio::process::Command::new(&launch.launcher);
    command
        .args(["--policy", &policy_arg, "--backend", &launch.backend])
        .args(["--agent-id", &format!("upstream-{name}")])
        .arg("--workspace")
        .arg(&workspace)
        // The server's own git dir for its workspace, kept with its state.
        .arg("--git-state")
        .arg(
            launch
                .state_dir
                .join("upstreams")
                .join(format!("{name}.git")),
        )
        .args(["--die-with-parent", &std::process::id().to_string()])
        // MCP over stdio: never a terminal.
        .args(["--tty", "never"]);
    if let Some(destinations) = &launch.destinations {
        command.arg("--destinations").arg(destinations);
    }
    if let Some(parent) = &launch.cgroup_parent {
        command.arg("--cgroup-parent").arg(parent);
    }
    for name in server.env.keys().chain(server.env_allow.iter()) {
        command.args(["--pass-env", name]);
    }
    command
        .arg("--")
        .arg(&server.command)
        .args(&server.args)
        .kill_on_drop(true);
    // The daemon's secrets: not in the server's launcher, so no
    // `env_allow` or policy brings one in. A value the server's own entry
    // sets is the operator's for that server, not the daemon's.
    for name in launch.secret_env.present() {
        if !name.to_str().is_some_and(|n| server.env.contains_key(n)) {
            command.env_remove(name);
        }
    }
    command.envs(&server.env);
    Ok(command)
}

/// Lists the server's tools, checks each against its pin, publishes them.
async fn refresh(broker: &Broker, index: usize, peer: &Peer<RoleClient>) -> Result<(), StartError> {
    let tools = list_tools(peer).await?;
    let slot = &broker.upstreams().slots[index];
    let mut checked = Vec::new();
    for (position, tool) in tools.into_iter().enumerate() {
        let pin = broker
            .check_pin(&slot.config.name, position, &tool)
            .map_err(StartError::Pins)?;
        checked.push((tool, pin));
    }
    let mut state = slot.write();
    if state.tools != checked {
        state.tools = checked;
        drop(state);
        broker.upstreams().bump();
    }
    Ok(())
}

/// The server's tools (every page), as the menu holds them.
async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<UpstreamTool>, StartError> {
    let tools = peer.list_all_tools().await.map_err(StartError::ListTools)?;
    Ok(tools.into_iter().map(upstream_tool).collect())
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
        title: tool.title,
        output_schema: tool.output_schema.map(|s| (*s).clone()),
        icons: tool.icons,
        meta: tool.meta,
    }
}
