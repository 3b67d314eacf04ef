//! The daemon: state directory, the control socket, one socket per agent,
//! a task per connection, clean shutdown.
//!
//! ```text
//! STATE_DIR/                 0700
//!   state.db                 SQLite (WAL): agents, messages, turns, pins
//!   audit.log                one JSON line per decision
//!   control.sock             0600, the CLI's (with --runtime-dir: there,
//!                            and `runtime-dir` here records where)
//!   daemon.lock              0600, locked while a daemon runs here; its pid
//!   agents/<id>/broker.sock  0600, agent <id>'s only way out
//!   agents/<id>/home/, chats/, config/, proxy.log   its turns' files (docs/broker.md)
//!   gateway/<id>.sock, gateway.log   the model gateway's sockets and audit
//!   agents/<id>/git/repo     its own git dir: the workspace's `.git` in its turns
//!   upstreams/<name>/, <name>.log             upstream servers
//!   tls/ca.key, ca.crt, listening             relays on other hosts (crate::tls)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::agent_http::{AgentHttp, Speaks};
use crate::audit::Audit;
use crate::broker::{AgentEvent, Broker, Roles};
use crate::control::{Request, handle, refused};
use crate::gate::{ConnectionLimits, error_line, serve_connection};
use crate::store::{Agent, StateDatabase};

/// At most this many connections per agent socket at once (a turn is one);
/// more are answered with an error and closed.
pub const CONNECTIONS_PER_AGENT: usize = 16;
/// At most this many agent connections in the whole daemon.
pub const CONNECTIONS_TOTAL: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the runtime directory: {0}")]
    Runtime(#[from] runtime::RuntimeDirError),
    #[error(
        "state directory {dir} is in use by another daemon ({holder}); stop it first, or give this one another --state-dir"
    )]
    Locked { dir: PathBuf, holder: String },
    #[error(
        "runtime directory {dir} is in use by another daemon ({holder}); stop it first, or give this one another --runtime-dir"
    )]
    RuntimeLocked { dir: PathBuf, holder: String },
    #[error(
        "state database {database} is in use by another daemon ({holder}); stop it first, or give this one another --state"
    )]
    DatabaseLocked { database: PathBuf, holder: String },
    #[error(
        "--lease {0:?} is shorter than the {1:?} a call to the state database may take: a daemon held up by one would lose its agents; give at least {1:?}"
    )]
    LeaseTooShort(std::time::Duration, std::time::Duration),
    #[error("--shared-path {0}: {1}")]
    SharedPath(PathBuf, std::io::Error),
}

/// The shortest lease a daemon accepts: the bound on one call to the state
/// database (a call held up that long must not cost the daemon its lease).
pub const MIN_LEASE: std::time::Duration = crate::store::CALL_TIMEOUT;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub state_dir: PathBuf,
    /// Where the control socket and the agents' sockets live instead of
    /// the state directory (`--runtime-dir`; `runtime`).
    pub runtime_dir: Option<PathBuf>,
    /// The state database: `state.db` in `state_dir` unless the operator
    /// names another (`--state`).
    pub state: StateDatabase,
    /// How long this daemon's running turns stay its own without a
    /// heartbeat (other daemons of the database then fail them and adopt
    /// its agents).
    pub lease: std::time::Duration,
    /// The agents this daemon runs at most, counting those other daemons
    /// place on it (`--max-agents`); none: it takes none made elsewhere.
    pub max_agents: Option<u32>,
    /// Directories this daemon reaches as the team's other daemons do
    /// (`--shared-path`): a new agent whose workspace is under one may be
    /// placed on another daemon declaring it (crate::placement).
    pub shared_paths: Vec<PathBuf>,
    pub roles: Roles,
    /// The roles of `roles` written inline in the daemon's configuration:
    /// the text of a policy file standing for each
    /// (`substrat_policy::inline::InlinePolicy`). Written to
    /// `roles/NAME.toml` in the state directory (0600) once the directory
    /// is this daemon's, the role is loaded again from there: that file is
    /// what its launches are given.
    pub inline_roles: std::collections::BTreeMap<String, String>,
    /// How turns run; none: turns stay queued (no provider configured).
    pub turns: Option<crate::turns::TurnConfig>,
    /// How script roles' evaluators are put in sandboxes of the
    /// `upstream` kind; none: they run limited but unsandboxed.
    pub role_eval: Option<crate::roles::eval::EvalLaunch>,
    /// Upstream MCP servers and how their sandboxes are launched.
    pub upstreams: Option<(
        crate::upstream::config::UpstreamConfig,
        crate::upstream_supervisor::UpstreamLaunch,
    )>,
    /// The roles' HTTP endpoints and their bearer token; none: off.
    pub role_http: Option<(crate::role_http::Listen, String)>,
    /// Relays on other hosts over mutual TLS; none: off.
    pub tls: Option<TlsListen>,
    /// The team key (`--team-key`): the relays' authority is the team's,
    /// in the database; none: the daemon's own (`STATE_DIR/tls`).
    pub team_key: Option<Arc<crate::team_key::TeamKey>>,
    /// Told of the upstream servers' first starts (a progress line on a
    /// terminal); none: nothing is drawn or logged of them.
    pub startup: Option<startup::Startup>,
}

/// Where the TLS listener binds, and the names (DNS or IP) its
/// certificate carries: those the relays connect to.
#[derive(Debug, Clone)]
pub struct TlsListen {
    pub addr: std::net::SocketAddr,
    pub names: Vec<String>,
}

pub mod runtime;
pub mod startup;
mod state;
mod turns;
use state::open_state;
use state::write_inline_roles;
pub use state::{lock_runtime_dir, lock_sqlite_database, lock_state_dir, prepare_state_dir};

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |e| DaemonError::Io(what, e)
}

/// A socket bound by crate::sockets, served by tokio.
fn serve(
    listener: std::os::unix::net::UnixListener,
    path: &Path,
) -> Result<UnixListener, DaemonError> {
    UnixListener::from_std(listener).map_err(io(format!("listen on {}", path.display())))
}

struct Daemon {
    broker: Arc<Broker>,
    total: Arc<Semaphore>,
}

/// Runs until `shutdown` resolves.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    if config.lease < MIN_LEASE {
        return Err(DaemonError::LeaseTooShort(config.lease, MIN_LEASE));
    }
    // With a runtime directory the agents' sockets are there: only it
    // must leave room for their paths (and the state directory for the
    // warm sandboxes' turns.sock).
    let warm = config.turns.as_ref().is_some_and(|t| t.warm_idle.is_some());
    let sockets_here = config.runtime_dir.is_none() || warm;
    prepare_state_dir(&config.state_dir, sockets_here)?;
    // Before anything in the directory is touched (sockets, the store).
    let _lock = lock_state_dir(&config.state_dir)?;
    // Resolved once: the agents' writable binds (their chats) are opened
    // without following symlinks.
    let mut config = config;
    config.state_dir = config
        .state_dir
        .canonicalize()
        .map_err(io(format!("resolve {}", config.state_dir.display())))?;
    // The state directory is this daemon's: its record is removed unless
    // the daemon starts.
    let mut record = runtime::RecordGuard(Some(config.state_dir.clone()));
    // The sockets' directory, locked (one daemon's sockets in it: a second
    // would replace them), then recorded (a client names only the state
    // directory): a daemon refused it records nothing.
    let runtime_dir = match config.runtime_dir.as_deref() {
        Some(runtime) => {
            state::check_socket_room(runtime)?;
            Some(runtime::make(runtime)?)
        }
        None => None,
    };
    let _runtime_lock = runtime_dir.as_deref().map(lock_runtime_dir).transpose()?;
    runtime::record(&config.state_dir, runtime_dir.as_deref())?;
    config.runtime_dir = runtime_dir;
    if let Some(launch) = config.role_eval.take() {
        crate::roles::eval::sandbox_in(&config.state_dir, launch)
            .map_err(io("prepare the script roles' evaluator sandbox"))?;
    }
    // Resolved once, as every daemon compares them (crate::placement).
    for path in &mut config.shared_paths {
        *path = path
            .canonicalize()
            .map_err(|e| DaemonError::SharedPath(path.clone(), e))?;
    }
    write_inline_roles(&mut config)?;
    let (store, _database_lock) = open_state(&config)?;
    let broker = build_broker(store, &mut config)?;
    broker.set_shared_paths(config.shared_paths.clone());
    if let Some(key) = &config.team_key {
        broker.set_team_key(key.clone());
    }
    if let Some((listen, token)) = config.role_http.take() {
        let endpoints = crate::role_http::serve(&listen, broker.clone(), token)
            .await
            .map_err(io(format!("listen for the roles' endpoints on {listen:?}")))?;
        tokio::spawn(endpoints);
        tracing::info!(?listen, "roles' HTTP endpoints ready");
    }
    // The agents no daemon runs become this one's before its sockets are
    // bound (below, with its own).
    broker
        .keep_seat(usize::MAX)
        .map_err(other("take this daemon's seat"))?;
    let (events, mut event_rx) = mpsc::unbounded_channel();
    broker.set_events(events);
    let daemon = Arc::new(Daemon {
        broker: broker.clone(),
        total: Arc::new(Semaphore::new(CONNECTIONS_TOTAL)),
    });
    let mut listeners = serve_own_agents(&daemon)?;
    let engine = config.turns.as_ref().and_then(|t| t.engine.clone());
    let mut tasks = start_tasks(&daemon, &mut config).await?;
    tracing::info!(state_dir = %config.state_dir.display(), state = %config.state, agents = listeners.len(), "broker ready");
    if let Some(progress) = config.startup.take() {
        tasks.push(tokio::spawn(startup::follow_upstreams(
            broker.clone(),
            progress,
        )));
    }
    record.0 = None;

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(event) = event_rx.recv() => match event {
                AgentEvent::Created(agent, listener) => match serve_agent(&daemon, &agent, listener) {
                    Ok(task) => { listeners.insert(agent.id.clone(), task); }
                    Err(e) => tracing::error!(agent = %agent.name, error = %e, "cannot open the agent socket"),
                },
                AgentEvent::Removed(id) => {
                    if let Some(task) = listeners.remove(&id) {
                        task.abort();
                    }
                    let _ = std::fs::remove_dir_all(config.state_dir.join("agents").join(&id));
                    if let Some(dir) = broker.socket_path(&id).parent() {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                }
                AgentEvent::Released(id) => {
                    if let Some(task) = listeners.remove(&id) {
                        task.abort();
                        let _ = std::fs::remove_file(broker.socket_path(&id));
                        tracing::info!(agent = %id, "agent runs on another daemon now: its socket here is closed");
                    }
                }
            },
        }
    }
    tracing::info!("broker shutting down");
    // Ended, not killed: a local server's launcher removes what it made
    // in the server's workspace.
    broker
        .upstreams()
        .stop(std::time::Duration::from_secs(6))
        .await;
    for task in tasks.into_iter().chain(listeners.into_values()) {
        task.abort();
    }
    // The turns' containers outlive their engine's clients: removed (the
    // scheduler stopped above takes no turn any more).
    if let Some(engine) = &engine {
        turns::stop_containers(&broker, engine).await;
    }
    let _ = std::fs::remove_file(broker.runtime_dir().join("control.sock"));
    Ok(())
}

/// A broker error as the daemon's, saying what was being done.
fn other(what: &'static str) -> impl FnOnce(crate::BrokerError) -> DaemonError {
    move |e| DaemonError::Io(what.into(), std::io::Error::other(e.to_string()))
}

/// The broker over `store`: the roles (script roles registered), the
/// upstream servers (checked, switched as last recorded, started).
fn build_broker(
    store: crate::store::Store,
    config: &mut DaemonConfig,
) -> Result<Arc<Broker>, DaemonError> {
    let scripts = crate::roles::load_scripts(&config.roles).map_err(|e| {
        DaemonError::Io(
            "load script roles".into(),
            std::io::Error::other(e.to_string()),
        )
    })?;
    let roles = std::mem::take(&mut config.roles);
    let audit = Audit::open(&config.state_dir.join("audit.log")).map_err(io("open audit.log"))?;
    let mut broker = Broker::new(store, roles, config.state_dir.clone(), audit);
    if let Some(runtime) = &config.runtime_dir {
        broker.set_runtime_dir(runtime.clone());
    }
    for role in scripts {
        broker
            .register_role(role)
            .map_err(other("register a role"))?;
    }
    let mut upstream_launch = None;
    if let Some((upstreams, launch)) = config.upstreams.take() {
        check_upstream_policies(&broker, &upstreams)?;
        broker = broker.with_upstreams(upstreams);
        broker
            .apply_server_switches()
            .map_err(other("read server switches"))?;
        upstream_launch = Some(Arc::new(launch));
    }
    let broker = Arc::new(broker);
    if let Some(launch) = &upstream_launch {
        crate::upstream_supervisor::spawn_all(&broker, launch);
    }
    Ok(broker)
}

/// The sockets of the agents this daemon runs, bound and served.
fn serve_own_agents(daemon: &Arc<Daemon>) -> Result<HashMap<String, JoinHandle<()>>, DaemonError> {
    let mut listeners = HashMap::new();
    for agent in daemon.broker.own_agents().map_err(other("load agents"))? {
        let path = daemon.broker.socket_path(&agent.id);
        let listener = crate::sockets::bind_agent_socket(&path)
            .map_err(io(format!("bind {}", path.display())))?;
        daemon.broker.mark_serving(&agent.id);
        listeners.insert(agent.id.clone(), serve_agent(daemon, &agent, listener)?);
    }
    Ok(listeners)
}

/// The daemon's tasks: the TLS listener (first: a port in use stops the
/// start with nothing run), the turns' scheduler, the seat's heartbeat and
/// (PostgreSQL) its listener, the control socket.
async fn start_tasks(
    daemon: &Arc<Daemon>,
    config: &mut DaemonConfig,
) -> Result<Vec<JoinHandle<()>>, DaemonError> {
    let broker = &daemon.broker;
    let mut tasks = Vec::new();
    if let Some(listen) = &config.tls {
        tasks.push(start_tls(daemon, listen).await?);
    }
    tasks.extend(turns::start_turns(broker, config.turns.take()).await?);
    tasks.push(tokio::spawn(crate::seat::keep(
        broker.clone(),
        config.lease,
    )));
    if let StateDatabase::Postgres(url) = &config.state {
        let listen = crate::seat::listen(broker.clone(), url.clone(), broker.daemon_id());
        tasks.push(tokio::spawn(listen));
        tasks.push(tokio::spawn(crate::seat::watch(
            broker.clone(),
            config.lease,
        )));
    }
    let control_path = daemon.broker.runtime_dir().join("control.sock");
    let control = crate::sockets::bind_private(&control_path)
        .map_err(io(format!("bind {}", control_path.display())))?;
    let control = serve(control, &control_path)?;
    tasks.push(tokio::spawn(control_loop(daemon.clone(), control)));
    Ok(tasks)
}

/// Network only for the network category (seed 003), and every local
/// server's policy a known role (a remote server has no sandbox).
fn check_upstream_policies(
    broker: &Broker,
    upstreams: &crate::upstream::config::UpstreamConfig,
) -> Result<(), DaemonError> {
    for server in &upstreams.servers {
        let fail = |why: String| {
            Err(DaemonError::Io(
                format!("upstream server `{}`", server.name),
                std::io::Error::other(why),
            ))
        };
        let crate::upstream::config::ServerSource::Local(local) = &server.source else {
            continue;
        };
        let Some(policy) = broker.roles().get(&local.policy) else {
            return fail(format!("policy `{}` is not a known role", local.policy));
        };
        let networked = policy.policy.network != substrat_policy::model::NetworkMode::None;
        let network_category = server.category == crate::upstream::config::Category::Network;
        if networked != network_category {
            return fail(format!(
                "category {:?} with policy `{}` (network {:?}): only category network servers get network, and they need a policy with it",
                server.category, local.policy, policy.policy.network
            ));
        }
    }
    Ok(())
}

/// The TLS listener for relays on other hosts: the authority made on
/// first use, a server certificate for `listen.names`, the bound address
/// written to `tls/listening` (a port 0 becomes the one the kernel chose)
/// and, with a team authority, recorded for the team (`daemons`).
async fn start_tls(
    daemon: &Arc<Daemon>,
    listen: &TlsListen,
) -> Result<JoinHandle<()>, DaemonError> {
    let tls = |e: crate::tls::TlsError| {
        DaemonError::Io("TLS".into(), std::io::Error::other(e.to_string()))
    };
    let authority = daemon.broker.authority().map_err(tls)?;
    let config = authority.server_config(&listen.names).map_err(tls)?;
    let listener = tokio::net::TcpListener::bind(listen.addr)
        .await
        .map_err(io(format!("listen on {}", listen.addr)))?;
    let bound = listener
        .local_addr()
        .map_err(io(format!("listen on {}", listen.addr)))?;
    let record = authority.dir().join("listening");
    std::fs::write(&record, format!("{bound}\n"))
        .map_err(io(format!("write {}", record.display())))?;
    let reached_at = listen
        .names
        .first()
        .map(|name| format!("tls://{}", tls_host_port(name, bound.port())));
    if let Err(e) = daemon.broker.record_tls_address(reached_at.as_deref()) {
        tracing::warn!(error = %e, "could not record the TLS address in the database");
    }
    tracing::info!(%bound, names = ?listen.names, "relays on other hosts: mutual TLS");
    let limits = crate::tls_listen::Limits {
        total: daemon.total.clone(),
        per_agent: CONNECTIONS_PER_AGENT,
    };
    let (configs, configs_rx) = tokio::sync::watch::channel(config);
    let broker = daemon.broker.clone();
    let names = listen.names.clone();
    // One task: aborting it at shutdown stops both.
    Ok(tokio::spawn(async move {
        let accepting =
            crate::tls_listen::accept_loop(broker.clone(), limits, listener, configs_rx);
        let following = crate::tls_listen::follow_authorities(broker, names, configs);
        tokio::select! {
            () = accepting => {}
            () = following => {}
        }
    }))
}

/// `NAME:PORT`, an IPv6 address in brackets.
fn tls_host_port(name: &str, port: u16) -> String {
    if name.contains(':') {
        format!("[{name}]:{port}")
    } else {
        format!("{name}:{port}")
    }
}

/// Accepts on an agent's socket, already bound (crate::sockets).
fn serve_agent(
    daemon: &Arc<Daemon>,
    agent: &Agent,
    listener: std::os::unix::net::UnixListener,
) -> Result<JoinHandle<()>, DaemonError> {
    let listener = serve(listener, &daemon.broker.socket_path(&agent.id))?;
    let daemon = daemon.clone();
    let agent_id = agent.id.clone();
    Ok(tokio::spawn(async move {
        agent_accept_loop(daemon, agent_id, listener).await
    }))
}

async fn agent_accept_loop(daemon: Arc<Daemon>, agent_id: String, listener: UnixListener) {
    let per_agent = Arc::new(Semaphore::new(CONNECTIONS_PER_AGENT));
    // MCP over streamable HTTP on the same socket; its sessions end with
    // this loop (the agent removed, the daemon stopping).
    let http = Arc::new(AgentHttp::new(daemon.broker.clone(), agent_id.clone()));
    let _end_sessions = EndOnDrop(http.clone());
    let own_uid = nix::unistd::geteuid().as_raw();
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        // Only the daemon's own user may speak for an agent (the sandbox's
        // uid maps to it), or, for a daemon run by root, one of root's
        // subordinate uids (a sandbox launched by root runs as one; the
        // socket, bound only into this agent's sandbox, is shown to it as
        // its own). The socket's mode says so too; this is the check.
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == own_uid || is_roots_sandbox(own_uid, cred.uid()) => {}
            other => {
                let uid = other
                    .map(|c| c.uid().to_string())
                    .unwrap_or_else(|e| e.to_string());
                daemon.broker.audit_refusal(
                    &agent_id,
                    "(connect)",
                    &format!("peer_uid_mismatch: {uid}"),
                );
                continue;
            }
        }
        let permits = (
            per_agent.clone().try_acquire_owned(),
            daemon.total.clone().try_acquire_owned(),
        );
        let (Ok(agent_permit), Ok(total_permit)) = permits else {
            daemon
                .broker
                .audit_refusal(&agent_id, "(connect)", "too_many_connections");
            let line = error_line(
                &Value::Null,
                -32000,
                "too many connections to this agent's socket",
            );
            tokio::spawn(async move {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                    let _ = stream.write_all(&line).await;
                    let _ = stream.write_all(b"\n").await;
                })
                .await;
            });
            continue;
        };
        let broker = daemon.broker.clone();
        let (id, http) = (agent_id.clone(), http.clone());
        tokio::spawn(async move {
            match Speaks::of(&stream).await {
                Ok(Speaks::Http) => http.serve_connection(stream).await,
                Ok(Speaks::Lines) => {
                    serve_connection(broker, id, stream, ConnectionLimits::default(), None).await
                }
                Err(_) => {}
            }
            drop((agent_permit, total_permit));
        });
    }
}

/// Ends an agent's HTTP sessions and connections when its accept loop
/// ends (the task is aborted when the agent is removed).
struct EndOnDrop(Arc<AgentHttp>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Whether `peer` is a subordinate uid of root and this daemon is root's.
/// Read at each such connection: the ranges can change while it runs.
fn is_roots_sandbox(own_uid: u32, peer: u32) -> bool {
    use substrat_policy::subid::{IdRanges, SUBUID_FILE};
    own_uid == 0
        && IdRanges::read(std::path::Path::new(SUBUID_FILE), "root", 0)
            .is_ok_and(|uids| uids.contains(peer))
}

async fn control_loop(daemon: Arc<Daemon>, listener: UnixListener) {
    let own_uid = nix::unistd::geteuid().as_raw();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if !stream
            .peer_cred()
            .is_ok_and(|c| c.uid() == own_uid || c.uid() == 0)
        {
            continue;
        }
        tokio::spawn(control_connection(daemon.clone(), stream));
    }
}

async fn control_connection(daemon: Arc<Daemon>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(request) => {
                // Off the runtime: requests do SQLite work, and a spawn
                // may resolve a script role (up to its time limit).
                let broker = daemon.broker.clone();
                let response = tokio::task::spawn_blocking(move || handle(&broker, request))
                    .await
                    .unwrap_or_else(|e| refused("internal", e.to_string()));
                // An agent is usable when `create` answers: wait for its socket.
                if let Some(socket) = response.get("socket").and_then(Value::as_str) {
                    wait_for_path(Path::new(socket)).await;
                }
                response
            }
            Err(e) => refused("bad_request", e.to_string()),
        };
        let mut out = response.to_string().into_bytes();
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn wait_for_path(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
