//! `substrat-sandbox daemon` and the `agent` commands that talk to it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use substrat_broker::Roles;
use substrat_broker::control::Request;
use substrat_broker::daemon::{DaemonConfig, run};
use substrat_broker::secret_env::SecretEnv;
use substrat_broker::store::StateDatabase;
use substrat_broker::turns::TurnConfig;
use substrat_broker::turns::container::{ContainerEngine, EngineKind};
use substrat_broker::upstream::config::UpstreamConfig;
use substrat_policy::text::{self, escape_text as safe};
use substrat_policy::{LoadOptions, builtin, load_builtin, load_file};

use crate::{AgentArgs, AgentCommand, BackendArg, DaemonArgs, ToolsArgs, ToolsCommand};

/// `--state-dir`, else `SUBSTRAT_STATE_DIR` (clap), else `~/.substrat`;
/// for an account whose home is no directory, `daemon` in the user's
/// state directory (`state_dirs`: XDG_STATE_HOME, XDG_RUNTIME_DIR or a
/// private one in TMPDIR).
pub fn state_dir(given: Option<&Path>) -> Result<PathBuf> {
    use substrat_cli::state_dirs::{home_dir, user_state_dir};
    match given {
        Some(dir) => Ok(dir.to_path_buf()),
        None => match home_dir() {
            Ok(home) => Ok(home.join(".substrat")),
            Err(_) => Ok(user_state_dir("SUBSTRAT_STATE_DIR")?.join("daemon")),
        },
    }
}

/// Roles: the built-in policies, overridden and extended by `*.toml` in
/// `dir` (default: ./policies when it exists), then the roles written
/// inline in the daemon's configuration file, which may not reuse a name;
/// with, for each inline role, the text of a policy file standing for it.
pub fn load_roles(
    dir: Option<&Path>,
    config: Option<&Path>,
) -> Result<(Roles, BTreeMap<String, String>)> {
    let mut roles = load_policy_roles(dir)?;
    let mut standalone = BTreeMap::new();
    if let Some(file) = config {
        let options = LoadOptions::default();
        for inline in substrat_policy::inline::load_inline(file, &options)
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            let name = inline.loaded.name.clone();
            if roles.contains_key(&name) {
                bail!(
                    "{}: role `{name}` is also a policy (built in or in the policies directory); give it another name",
                    file.display(),
                );
            }
            roles.insert(name.clone(), inline.loaded);
            standalone.insert(name, inline.standalone);
        }
    }
    Ok((roles, standalone))
}

fn load_policy_roles(dir: Option<&Path>) -> Result<Roles> {
    let options = LoadOptions::default();
    let mut roles = Roles::new();
    for (name, _) in builtin::POLICIES {
        if let Some(loaded) = load_builtin(name, &options) {
            roles.insert(
                name.to_string(),
                loaded.map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
    }
    let default_dir = Path::new("policies");
    let dir = dir.or_else(|| default_dir.is_dir().then_some(default_dir));
    if let Some(dir) = dir {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read policies directory {}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        for file in files {
            let loaded = load_file(&file, &options).map_err(|e| anyhow::anyhow!("{e}"))?;
            roles.insert(loaded.name.clone(), loaded);
        }
    }
    Ok(roles)
}

/// Without `--cgroup-parent`, a daemon alone in a delegated cgroup v2
/// group (a systemd service with `Delegate=yes`) moves into its leaf, so
/// that its launchers can make the sandboxes' groups (docs/operations.md).
fn settle_cgroup(args: &DaemonArgs) {
    use substrat_sandbox::cgroup::{DaemonGroup, settle_daemon};
    if args.cgroup_parent.is_some() {
        return;
    }
    match settle_daemon() {
        Ok(DaemonGroup::MovedToLeaf { group }) => tracing::info!(
            group = %group.display(),
            "moved into the leaf of its delegated cgroup; sandboxes' groups go beside it"
        ),
        Ok(DaemonGroup::Stays { reason }) => {
            tracing::debug!(%reason, "stays in its cgroup")
        }
        Err(e) => tracing::warn!(
            "cannot move into the leaf of its cgroup ({e}); launches that need limits may fail: \
             give the daemon --cgroup-parent"
        ),
    }
}

/// The upstream servers' first starts as a progress line, when stderr is
/// a terminal and the log is text (the line is drawn around its lines);
/// never in a JSON log or a pipe.
fn startup_progress(
    format: substrat_cli::term::LogFormat,
) -> Option<substrat_broker::daemon::startup::Startup> {
    use std::io::IsTerminal as _;
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    let terminal = std::io::stderr().is_terminal() && !dumb;
    (terminal && format == substrat_cli::term::LogFormat::Text).then(|| {
        substrat_broker::daemon::startup::Startup(std::sync::Arc::new(StartupLine::default()))
    })
}

/// The progress line of the daemon's start.
#[derive(Debug, Default)]
struct StartupLine(std::sync::Mutex<Option<substrat_cli::progress::Progress>>);

impl substrat_broker::daemon::startup::StartupProgress for StartupLine {
    fn begin(&self, total: usize) {
        let mut line =
            substrat_cli::progress::Progress::under_log("starting upstreams", total, true);
        line.draw("");
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
    }
    fn step(&self, item: &str) {
        if let Some(line) = self.0.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            line.step(item);
        }
    }
    fn end(&self) {
        // Dropped: the line is erased.
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

pub fn daemon(args: &DaemonArgs) -> ExitCode {
    let result = (|| -> Result<()> {
        let state_dir = state_dir(args.state_dir.as_deref())?;
        let (roles, inline_roles) = load_roles(args.policies.as_deref(), args.config.as_deref())?;
        substrat_cli::term::init_log(args.log_format);
        settle_cgroup(args);
        let destinations = destinations_file(args.destinations.as_deref())?;
        let upstream_config = args.upstreams.as_deref().map(read_upstreams).transpose()?;
        let secret_env = secret_env(args, upstream_config.as_ref());
        let turns = turn_config(args, destinations.clone(), secret_env.clone())?;
        let upstreams = match upstream_config {
            Some(config) => Some((
                config,
                substrat_broker::upstream_supervisor::UpstreamLaunch {
                    launcher: sibling_program("substrat-run")?.canonicalize()?,
                    backend: backend_name(args.backend).into(),
                    state_dir: state_dir.clone(),
                    destinations,
                    cgroup_parent: args.cgroup_parent.clone(),
                    secret_env,
                },
            )),
            None => None,
        };
        let role_http = role_http(args)?;
        let tls = tls_listen(args)?;
        let team_key = match &args.team_key {
            Some(file) => Some(std::sync::Arc::new(
                substrat_broker::team_key::TeamKey::load(file)?,
            )),
            None => None,
        };
        let role_eval = substrat_broker::roles::eval::EvalLaunch {
            launcher: sibling_program("substrat-run")?.canonicalize()?,
            backend: backend_name(args.backend).into(),
            cgroup_parent: args.cgroup_parent.clone(),
        };
        let state = state_database(args, &state_dir)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let shutdown = async {
                let mut term =
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(s) => s,
                        Err(_) => return std::future::pending().await,
                    };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            };
            run(
                DaemonConfig {
                    state_dir,
                    runtime_dir: args.runtime_dir.clone(),
                    state,
                    lease: std::time::Duration::from_secs(args.lease),
                    max_agents: args.max_agents,
                    shared_paths: args.shared_path.clone(),
                    roles,
                    inline_roles,
                    turns,
                    role_eval: Some(role_eval),
                    upstreams,
                    role_http,
                    tls,
                    team_key,
                    startup: startup_progress(args.log_format),
                },
                shutdown,
            )
            .await
        })?;
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox daemon: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

/// An upstream servers' file (`--upstreams FILE` of the daemon and of
/// `check`), read and checked.
pub(crate) fn read_upstreams(file: &std::path::Path) -> Result<UpstreamConfig> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let config = substrat_broker::upstream::config::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(config)
}

/// The daemon's secrets: the registry's, the roles' token's variable and
/// the remote servers' credentials' (removed from every launch).
fn secret_env(args: &DaemonArgs, upstreams: Option<&UpstreamConfig>) -> SecretEnv {
    let named = args.roles_http_token_env.iter().cloned().chain(
        upstreams
            .map(UpstreamConfig::credential_env)
            .unwrap_or_default(),
    );
    SecretEnv::with_named(named)
}

/// `--state`, else the configuration file's `state`, else `state.db` in
/// the state directory.
fn state_database(args: &DaemonArgs, state_dir: &Path) -> Result<StateDatabase> {
    let from_file = match &args.config {
        Some(file) => {
            substrat_policy::inline::daemon_state(file).map_err(|e| anyhow::anyhow!(e))?
        }
        None => None,
    };
    match args.state.as_deref().or(from_file.as_deref()) {
        Some(text) => StateDatabase::parse(text).map_err(|e| anyhow::anyhow!("--state: {e}")),
        None => Ok(StateDatabase::in_state_dir(state_dir)),
    }
}

/// `--listen-tls ADDR [--tls-name NAME]...`: the names the listener's
/// certificate carries; a relay checks the one it connects by.
fn tls_listen(args: &DaemonArgs) -> Result<Option<substrat_broker::daemon::TlsListen>> {
    let Some(addr) = args.listen_tls else {
        return Ok(None);
    };
    let mut names = args.tls_name.clone();
    if !addr.ip().is_unspecified() {
        names.push(addr.ip().to_string());
    }
    if names.is_empty() {
        bail!(
            "--listen-tls {addr}: give --tls-name NAME, the name (or address) relays reach this host by; it goes into the daemon's certificate"
        );
    }
    Ok(Some(substrat_broker::daemon::TlsListen { addr, names }))
}

/// `--roles-http ADDR --roles-http-token-env VAR`: where, and the token
/// (from the daemon's environment, never from its command line).
fn role_http(args: &DaemonArgs) -> Result<Option<(substrat_broker::role_http::Listen, String)>> {
    let (Some(addr), Some(var)) = (&args.roles_http, &args.roles_http_token_env) else {
        return Ok(None);
    };
    let listen = substrat_broker::role_http::Listen::parse(addr)
        .map_err(|e| anyhow::anyhow!("--roles-http {e}"))?;
    let token = std::env::var(var).unwrap_or_default();
    if token.len() < 16 {
        bail!(
            "--roles-http-token-env {var}: the variable must hold a token of at least 16 characters"
        );
    }
    Ok(Some((listen, token)))
}

fn backend_name(backend: BackendArg) -> &'static str {
    backend.choice().name()
}

/// `tools login SERVER`: the daemon begins the flow and answers the URL;
/// this waits for its end (the browser's redirect reaches the daemon).
fn login(state_dir: &Path, server: &str, json: bool) -> Result<()> {
    let checked = |reply: Value| -> Result<Value> {
        if reply["ok"] != Value::Bool(true) {
            bail!(
                "{} ({})",
                reply["message"].as_str().unwrap_or("refused"),
                reply["error"].as_str().unwrap_or("error")
            );
        }
        Ok(reply)
    };
    let server = server.to_string();
    let begun = checked(call(
        state_dir,
        &Request::OauthLogin {
            server: server.clone(),
        },
    )?)?;
    let url = begun["url"].as_str().unwrap_or("");
    if json {
        println!("{}", text::json_safe(serde_json::to_string(&begun)?));
    } else {
        println!(
            "Open this URL to authorize the daemon at `{}`:\n\n  {}\n",
            safe(&server),
            safe(url)
        );
        println!("Waiting for the browser to come back (it redirects to 127.0.0.1)...");
    }
    let done = checked(call(
        state_dir,
        &Request::OauthLoginWait {
            server: server.clone(),
        },
    )?)?;
    if json {
        println!("{}", text::json_safe(serde_json::to_string(&done)?));
    } else {
        println!(
            "{}: authorized; tokens stored in {} (the daemon uses them at its next connect)",
            safe(&server),
            safe(done["stored"].as_str().unwrap_or(""))
        );
    }
    Ok(())
}

/// `substrat-sandbox tools list|approve|enable|disable|logout`.
pub fn tools(args: &ToolsArgs) -> ExitCode {
    let result = (|| -> Result<()> {
        let state_dir = state_dir(args.state_dir.as_deref())?;
        if let ToolsCommand::Login { server } = &args.command {
            return login(&state_dir, server, args.json);
        }
        let request = match &args.command {
            ToolsCommand::List => Request::Tools,
            ToolsCommand::Logout { server } => Request::OauthLogout {
                server: server.clone(),
            },
            ToolsCommand::Login { .. } => bail!("login is asked above"),
            ToolsCommand::Approve { server, tool, hash } => Request::ApproveTool {
                server: server.clone(),
                tool: tool.clone(),
                hash: hash.clone(),
            },
            ToolsCommand::Enable { server } | ToolsCommand::Disable { server } => {
                Request::SwitchServer {
                    server: server.clone(),
                    enabled: matches!(args.command, ToolsCommand::Enable { .. }),
                }
            }
            // Run by main without a daemon.
            ToolsCommand::ConformanceClient { .. } => bail!("conformance-client asks no daemon"),
        };
        let reply = call(&state_dir, &request)?;
        if reply["ok"] != Value::Bool(true) {
            bail!(
                "{} ({})",
                reply["message"].as_str().unwrap_or("refused"),
                reply["error"].as_str().unwrap_or("error")
            );
        }
        if args.json {
            println!("{}", text::json_safe(serde_json::to_string_pretty(&reply)?));
            return Ok(());
        }
        match &args.command {
            ToolsCommand::Approve { .. } => {
                println!(
                    "approved {}",
                    safe(reply["approved"].as_str().unwrap_or(""))
                )
            }
            ToolsCommand::List => print!("{}", crate::agent_text::tools_text(&reply)),
            ToolsCommand::Logout { server } => {
                let what = match reply["outcome"].as_str() {
                    Some("revoked") => "tokens revoked and deleted",
                    Some("deleted") => {
                        "tokens deleted (the authorization server has no revocation endpoint, or refused)"
                    }
                    _ => "no tokens were stored",
                };
                println!("{}: {what}", safe(server));
            }
            ToolsCommand::Login { .. } => {}
            ToolsCommand::Enable { server } | ToolsCommand::Disable { server } => {
                let now = if reply["enabled"] == Value::Bool(true) {
                    "enabled"
                } else {
                    "disabled"
                };
                let was = if reply["changed"] == Value::Bool(true) {
                    ""
                } else {
                    " (it was already)"
                };
                println!("{} {now}{was}", safe(server));
            }
            ToolsCommand::ConformanceClient { .. } => {}
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox tools: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

/// A program next to this one (the workspace's build puts them together).
fn sibling_program(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot locate this program")?;
    let path = me.with_file_name(name);
    if !path.is_file() {
        bail!("{} not found next to {}", name, me.display());
    }
    Ok(path)
}

/// How turns run, or none when no provider is available (`auto` without
/// cursor-agent on PATH, or `none`).
fn turn_config(
    args: &DaemonArgs,
    destinations: Option<PathBuf>,
    secret_env: SecretEnv,
) -> Result<Option<TurnConfig>> {
    let stand_in = || sibling_program("substrat-stand-in-agent");
    let Some(providers) = crate::providers::providers(args, stand_in)? else {
        return Ok(None);
    };
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(Some(TurnConfig {
        launcher: sibling_program("substrat-run")?.canonicalize()?,
        mcp_server: sibling_program("substrat-mcp-server")?.canonicalize()?,
        providers,
        slots: usize::from(args.slots),
        backend: backend_name(args.backend).into(),
        cgroup_parent: args.cgroup_parent.clone(),
        timeout: std::time::Duration::from_secs(args.turn_timeout),
        home: PathBuf::from(home),
        gateway: crate::providers::gateway_config(args)?,
        secret_env,
        destinations,
        warm_idle: args
            .warm
            .then(|| std::time::Duration::from_secs(args.warm_idle)),
        warm_pool: args.warm_pool.iter().cloned().collect(),
        engine: container_engine(args)?,
    }))
}

/// The engine's client on PATH (podman, containerd's ctr) and
/// substrat-oci beside this program.
fn container_engine(args: &DaemonArgs) -> Result<Option<ContainerEngine>> {
    let Some(engine) = args.engine else {
        return Ok(None);
    };
    let (program, kind) = match engine {
        crate::EngineArg::Podman => ("podman", EngineKind::Podman),
        crate::EngineArg::Containerd => (
            "ctr",
            EngineKind::Containerd {
                address: args.containerd_address.clone(),
                namespace: args.containerd_namespace.clone(),
            },
        ),
    };
    let path = crate::providers::on_path(program).with_context(|| {
        let package = if program == "ctr" {
            "containerd"
        } else {
            "podman"
        };
        format!("--engine: {program} is not on PATH (Debian: apt-get install {package})")
    })?;
    let runtime = sibling_program("substrat-oci")?.canonicalize()?;
    Ok(Some(ContainerEngine::new(kind, path, runtime)))
}

/// The operator's destinations file, checked before the daemon starts (a
/// bad one would fail every proxied turn), as an absolute path: each
/// launch reads it again, so an edit applies from the next turn.
fn destinations_file(path: Option<&Path>) -> Result<Option<PathBuf>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let path = path
        .canonicalize()
        .with_context(|| format!("cannot read the destinations file {}", path.display()))?;
    let list = substrat_proxy::destinations::load(&path)?;
    tracing::info!(
        file = %path.display(),
        destinations = list.len(),
        "operator destinations"
    );
    Ok(Some(path))
}

/// The control socket of the daemon of `state_dir`: in the runtime
/// directory it records (checked to be this account's), else there.
pub(crate) fn control_socket(state_dir: &Path) -> Result<PathBuf> {
    let dir = substrat_broker::daemon::runtime::resolve(state_dir)
        .with_context(|| format!("the daemon's sockets for {}", state_dir.display()))?;
    Ok(dir.join("control.sock"))
}

pub(crate) fn call(state_dir: &Path, request: &Request) -> Result<Value> {
    let path = control_socket(state_dir)?;
    let stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "cannot reach the daemon at {} (is `substrat-sandbox daemon` running?)",
            path.display()
        )
    })?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    send_all(&stream, &line).context("cannot send the request to the daemon")?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    serde_json::from_str(&reply).context("the daemon's answer is not JSON")
}

/// Writes all of `bytes` without SIGPIPE (MSG_NOSIGNAL): the client's
/// SIGPIPE has its default action (`prints_and_ends`), and a daemon gone
/// mid-request is an error to report, not a silent end.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    use rustix::net::{SendFlags, send};
    while !bytes.is_empty() {
        match send(stream, bytes, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub fn agent(args: &AgentArgs) -> ExitCode {
    match agent_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "substrat-sandbox agent: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

fn agent_inner(args: &AgentArgs) -> Result<ExitCode> {
    let state_dir = state_dir(args.state_dir.as_deref())?;
    if let Some(code) = crate::agent_layer::run(&state_dir, args)? {
        return Ok(code);
    }
    let request = request_of(&args.command)?;
    if let AgentCommand::Cert { out, .. } = &args.command {
        crate::agent_cert::prepare(out)?;
    }
    let reply = call(&state_dir, &request)?;
    if reply["ok"] != Value::Bool(true) {
        if args.json {
            println!("{}", text::json_safe(reply.to_string()));
        }
        bail!(
            "{} ({})",
            reply["message"].as_str().unwrap_or("refused"),
            reply["error"].as_str().unwrap_or("error")
        );
    }
    // The key goes to files, never to the terminal.
    let reply = match &args.command {
        AgentCommand::Cert { out, .. } => crate::agent_cert::write(out, reply)?,
        _ => reply,
    };
    if args.json {
        let mut reply = reply;
        if let Value::Object(map) = &mut reply {
            map.remove("ok");
        }
        println!("{}", text::json_safe(serde_json::to_string_pretty(&reply)?));
        return Ok(ExitCode::SUCCESS);
    }
    crate::agent_text::print_human(&args.command, &reply);
    Ok(ExitCode::SUCCESS)
}

/// The daemon's request for an agent command (the layer commands are
/// carried out here, never sent).
fn request_of(command: &AgentCommand) -> Result<Request> {
    Ok(match command {
        AgentCommand::Create {
            name,
            role,
            parent,
            workspace,
            provider,
        } => {
            let workspace = workspace
                .as_ref()
                .map(|w| {
                    w.canonicalize()
                        .with_context(|| format!("workspace {}", w.display()))
                })
                .transpose()?
                .map(|w| w.display().to_string());
            Request::Create {
                name: name.clone(),
                role: role.clone(),
                parent: parent.clone(),
                workspace,
                provider: provider.clone(),
            }
        }
        AgentCommand::Spawn {
            name,
            role,
            workspace,
            model,
            provider,
            args,
            instructions,
        } => Request::Spawn {
            name: name.clone(),
            role: role.clone(),
            workspace: workspace
                .canonicalize()
                .with_context(|| format!("workspace {}", workspace.display()))?
                .display()
                .to_string(),
            model: model.clone(),
            provider: provider.clone(),
            instructions: instructions.clone(),
            args: args.iter().cloned().collect(),
        },
        AgentCommand::Suspend { name } => Request::Suspend { name: name.clone() },
        AgentCommand::Resume { name } => Request::Resume { name: name.clone() },
        AgentCommand::Kill { name } => Request::Kill { name: name.clone() },
        AgentCommand::List => Request::List,
        AgentCommand::Inspect { name } => Request::Inspect { name: name.clone() },
        AgentCommand::Send { name, text } => Request::Send {
            name: name.clone(),
            text: text.clone(),
        },
        AgentCommand::Remove { name } => Request::Remove { name: name.clone() },
        AgentCommand::Cert { name, replace, .. } => Request::Cert {
            name: name.clone(),
            replace: *replace,
        },
        AgentCommand::Diff { .. }
        | AgentCommand::Review { .. }
        | AgentCommand::Apply { .. }
        | AgentCommand::Discard { .. }
        | AgentCommand::Rollback { .. } => bail!("a layer command reached the daemon's requests"),
    })
}
