//! A turn as a container (`daemon --engine podman|containerd`): the
//! engine runs the agent's provider with `substrat-oci` as its runtime,
//! from the same plan `substrat-run` would build (the role's binds, the
//! agent's binds, its home, its environment), and the role's policy on
//! top of the container (`io.substrat.policy`): its Landlock rules,
//! seccomp filter, protected paths and limits hold as under
//! `substrat-run`, whatever the engine adds.
//!
//! substrat-oci gets a runtime configuration of the agent's own (podman's
//! `--runtime-flag config=...`; for containerd a script of the agent's as
//! the runc shim's binary): where the role's policy is, and the agent's
//! binds, which the policy's Landlock rules allow as under substrat-run
//! (without them they would deny the broker socket, the relay, the home).
//! The root filesystem is an empty directory of the agent's: every path
//! in it comes from a bind. Each container carries the daemon's labels
//! (`engine`), by which `sweep` finds what no live turn owns.

mod engine;
pub mod record;
mod sources;
pub mod sweep;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use substrat_policy::LoadedPolicy;
use substrat_policy::model::{NetworkMode, WorkspaceMode};
use substrat_provider::TurnRequest;
use substrat_sandbox::plan::{
    Access, AgentBind, AgentContext, HomeMount, LaunchPlan, MountStep, SocketUse, build_plan,
};
use substrat_sandbox::workspace_git::WorkspaceGit;
use tokio::process::Command;

pub use self::engine::{AGENT_LABEL, DAEMON_LABEL, TURN_LABEL};
use self::engine::{EngineCommand, EngineMount, Labels, TurnContainer};
pub(super) use self::sources::{check_workspace, check_workspace_place};
use super::launch::{Launch, agent_binds};
use super::{TurnConfig, TurnError};
use crate::broker::Broker;

/// The container engine the daemon runs turns through.
#[derive(Debug, Clone)]
pub struct ContainerEngine {
    pub kind: EngineKind,
    /// The engine's client: podman, or containerd's `ctr`.
    pub program: PathBuf,
    /// `substrat-oci`: podman's `--runtime`, the runc shim's runc binary.
    pub runtime: PathBuf,
    /// The containers of the turns running now (spared by a sweep).
    live: Arc<Mutex<Live>>,
}

/// The containers of the turns running now, and whether the daemon is
/// stopping (no turn claims a container any more).
#[derive(Debug, Default)]
struct Live {
    names: HashSet<String>,
    stopping: bool,
}

/// Which engine, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineKind {
    Podman,
    /// containerd at `address` (its gRPC socket), its containers in
    /// `namespace`.
    Containerd {
        address: PathBuf,
        namespace: String,
    },
}

impl ContainerEngine {
    pub fn new(kind: EngineKind, program: PathBuf, runtime: PathBuf) -> Self {
        Self {
            kind,
            program,
            runtime,
            live: Arc::default(),
        }
    }

    /// `podman` or `containerd`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            EngineKind::Podman => "podman",
            EngineKind::Containerd { .. } => "containerd",
        }
    }

    fn live_names(&self) -> HashSet<String> {
        self.live
            .lock()
            .map(|l| l.names.clone())
            .unwrap_or_default()
    }

    /// `name` is a live turn's, unless the daemon is stopping (checked
    /// under the lock `stop_claims` takes: a turn between its claim and
    /// its spawn is live, which the stopping daemon waits for, `idle`).
    fn claim(&self, name: &str) -> bool {
        self.live.lock().is_ok_and(|mut live| {
            if !live.stopping {
                live.names.insert(name.to_string());
            }
            !live.stopping
        })
    }

    fn set_ended(&self, name: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.names.remove(name);
        }
    }

    /// The daemon is stopping: no turn claims a container from now on.
    pub fn stop_claims(&self) {
        if let Ok(mut live) = self.live.lock() {
            live.stopping = true;
        }
    }

    /// No turn's container is live.
    pub fn idle(&self) -> bool {
        self.live.lock().map_or(true, |l| l.names.is_empty())
    }

    /// The daemon's variables the engine's client gets.
    fn client_env(&self) -> Vec<(String, String)> {
        engine::engine_env(&self.kind, &daemon_env())
    }
}

/// The daemon's environment (what is text of it).
fn daemon_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect()
}

/// A turn's container: the git repositories it looks after (their
/// `after_run` is due when it ends), and the container's name (live until
/// `ended`).
pub(super) struct ContainerTurn {
    pub git: WorkspaceGit,
    pub name: String,
    /// The agent's container directory (its env file, its reports).
    dir: PathBuf,
}

/// How many of an agent's run reports are kept (the newest).
const REPORTS_KEPT: usize = 20;

impl ContainerTurn {
    /// The container is no live turn's any more (a sweep may remove it);
    /// the plan's environment file removed (ctr read it at the start), the
    /// agent's oldest run reports beyond `REPORTS_KEPT` removed.
    pub(super) fn ended(&self, engine: &ContainerEngine) {
        engine.set_ended(&self.name);
        let _ = std::fs::remove_file(self.dir.join("env"));
        prune_reports(&self.dir.join("reports"), REPORTS_KEPT);
    }
}

/// Removes all but the `keep` newest files of `dir`.
fn prune_reports(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(std::fs::Metadata::is_file)?;
            Some((meta.modified().ok()?, e.path()))
        })
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(keep);
    for (_, path) in files.into_iter().take(excess) {
        let _ = std::fs::remove_file(path);
    }
}

/// The engine's client for one turn (see the module's doc), and the
/// turn's container.
pub(super) fn container_command(
    broker: &Broker,
    config: &TurnConfig,
    engine: &ContainerEngine,
    launch: &Launch<'_>,
    request: &TurnRequest<'_>,
    turn_id: &str,
) -> Result<(Command, ContainerTurn), TurnError> {
    let agent = launch.agent;
    let policy = broker
        .policy_of(agent)
        .ok_or_else(|| TurnError::NoPolicy(agent.role.clone()))?;
    let refused = |why: &str| Err(TurnError::Container(why.to_string()));
    if policy.policy.network == NetworkMode::Proxy {
        return refused("a role with network = \"proxy\" cannot run as a container yet");
    }
    if policy.policy.filesystem.workspace_mode == WorkspaceMode::Overlay {
        return refused("a role with workspace_mode = \"overlay\" cannot run as a container yet");
    }
    if launch.access.is_some() {
        return refused(
            "a provider that reaches its model through the gateway cannot run as a container yet",
        );
    }
    // Before anything is written there (the git repositories' care).
    sources::check_workspace(launch.workspace)?;
    let agent_dir = broker.state_dir().join("agents").join(&agent.id);
    let (plan, binds, git) = turn_plan(broker, config, policy, launch, request, &agent_dir)?;
    let dir = agent_dir.join("container");
    let (policy_name, policy_dir) = policy_name(policy)?;
    // Idmapped (container root acts as host root there): the agent's own
    // places only, as under substrat-run: its workspace, its directory in
    // the daemon's state (home, chats, configuration files, git state) and
    // its broker socket; every other source is shown as it is.
    let own = [
        launch.workspace.to_path_buf(),
        agent_dir.clone(),
        broker.socket_path(&agent.id),
    ];
    let granted = sources::granted_sources(&plan.mounts, launch.workspace, broker.state_dir())?;
    let runtime_config =
        write_runtime_config(&dir, policy_dir, &binds, &config.home, granted, &own)?;
    let name = container_name(turn_id);
    let daemon = broker.daemon_id();
    let run = TurnContainer {
        name: &name,
        labels: Labels {
            daemon: &daemon,
            agent: &agent.id,
            turn: turn_id,
        },
        runtime_config: &runtime_config,
        policy: &policy_name,
        network: policy.policy.network,
        workspace: launch.workspace,
        root: &empty_root(&dir)?,
        cgroup_parent: config.cgroup_parent.as_deref(),
        dir: &dir,
        mounts: &engine_mounts(&plan.mounts)?,
        cwd: &plan.cwd,
        // A read-only root as `substrat-run` makes it (the plan's last
        // mount step, which every role's plan has).
        read_only: plan
            .mounts
            .iter()
            .any(|m| matches!(m, MountStep::RootReadOnly)),
        env: &plan.env,
        argv: &plan.argv,
        rlimits: &plan.rlimits,
    };
    let planned = engine::turn_command(
        &engine.kind,
        &engine.program,
        &engine.runtime,
        &run,
        engine.client_env(),
    )?;
    let command = spawnable(planned)?;
    if !engine.claim(&name) {
        return refused("the daemon is stopping");
    }
    Ok((command, ContainerTurn { git, name, dir }))
}

/// The plan `substrat-run` would build for the turn, the agent's binds in
/// it, and the git repositories it looks after.
fn turn_plan(
    broker: &Broker,
    config: &TurnConfig,
    policy: &LoadedPolicy,
    launch: &Launch<'_>,
    request: &TurnRequest<'_>,
    agent_dir: &Path,
) -> Result<(LaunchPlan, Vec<AgentBind>, WorkspaceGit), TurnError> {
    let agent = launch.agent;
    let binds: Vec<AgentBind> = agent_binds(broker, config, launch)
        .into_iter()
        .map(|(mode, source, target)| AgentBind {
            source,
            target,
            access: if mode == "rw" { Access::Rw } else { Access::Ro },
        })
        .collect();
    let provider_env = launch.provider.env(launch.setup);
    let mut ctx = AgentContext {
        workspace: launch.workspace.to_path_buf(),
        home: config.home.clone(),
        agent_id: agent.id.clone(),
        host_env: host_env(config, &provider_env),
        uid: 0,
        gid: 0,
        argv: launch.provider.argv(request, launch.setup),
        agent_binds: binds,
        pass_env: provider_env.iter().map(|(name, _)| name.clone()).collect(),
        home_mount: HomeMount::Bind(launch.files.home.clone()),
        terminal: false,
        workspace_layer: None,
        landlock_abi: substrat_sandbox::landlock::kernel_abi(),
    };
    let plan_of = |ctx: &AgentContext| {
        build_plan(policy, ctx).map_err(|e| TurnError::Container(format!("the plan: {e}")))
    };
    let mut plan = plan_of(&ctx)?;
    // Git repositories wherever the turn can write, as substrat-run looks
    // after them: the workspace's `.git` the agent's own, the others
    // read-only, new ones made inert after the turn (`after_run`).
    let git = WorkspaceGit::prepare(&agent_dir.join("git"), &plan, launch.workspace)
        .map_err(|e| TurnError::Container(e.to_string()))?;
    if !git.is_empty() {
        let mut binds = git.binds();
        binds.append(&mut ctx.agent_binds);
        ctx.agent_binds = binds;
        plan = plan_of(&ctx)?;
    }
    Ok((plan, ctx.agent_binds, git))
}

/// A turn's container name: its turn's, and a part of its own (a turn run
/// again gets a new container).
fn container_name(turn_id: &str) -> String {
    let turn: String = turn_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    let own = uuid::Uuid::new_v4().simple().to_string();
    format!("substrat-{turn}-{}", &own[..8])
}

/// The engine's command, its files written (never through a link, only
/// the daemon's to read).
fn spawnable(planned: EngineCommand) -> Result<Command, TurnError> {
    for file in &planned.files {
        write_private(&file.path, &file.text, file.mode)?;
    }
    let mut command = Command::new(&planned.program);
    command
        .env_clear()
        .envs(planned.env)
        .args(planned.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(command)
}

/// Writes `text` to `path` with `mode`, by a rename (a reader sees the
/// old file or the new one).
fn write_private(path: &Path, text: &str, mode: u32) -> Result<(), TurnError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&partial)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|source| TurnError::File {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
}

/// Ends and removes a turn's container (a turn timed out: its engine
/// client is gone, the engine keeps the container).
pub(super) async fn remove(engine: &ContainerEngine, turn: &ContainerTurn) {
    turn.ended(engine);
    sweep::remove(engine, &turn.name).await;
}

/// The environment `substrat-run` would have been started with: the
/// daemon's without its keys, the provider's variables, HOME.
fn host_env(config: &TurnConfig, provider_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| !config.secret_env.contains(name) && name != "HOME")
        .collect();
    env.extend(provider_env.iter().cloned());
    env.push(("HOME".into(), config.home.display().to_string()));
    env
}

/// A policy's bind of a Unix socket not marked `socket = true` is refused,
/// as substrat-run refuses it (the engine would follow links the same way).
fn refuse_socket(source: &std::path::Path, socket: SocketUse) -> Result<(), TurnError> {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::metadata(source).is_ok_and(|m| m.file_type().is_socket());
    if socket == SocketUse::Refuse && is_socket {
        return Err(TurnError::Container(format!(
            "bind source {} is a Unix socket, which the command could connect to; refusing. \
             If the command should reach the service behind it, mark the bind `socket = true` in the policy",
            source.display()
        )));
    }
    Ok(())
}

/// The plan's binds and tmpfs mounts for an engine (podman and
/// containerd make /dev and /proc; protected paths are the layer's). An
/// optional bind whose source is absent is left out, as the sandbox
/// skips it.
fn engine_mounts(mounts: &[MountStep]) -> Result<Vec<EngineMount>, TurnError> {
    let mut out = Vec::new();
    for step in mounts {
        out.push(match step {
            MountStep::Bind {
                source,
                target,
                access,
                optional,
                socket,
            } => {
                if *optional && !source.exists() {
                    continue;
                }
                refuse_socket(source, *socket)?;
                EngineMount::Bind {
                    source: source.clone(),
                    target: target.clone(),
                    read_only: *access == Access::Ro,
                }
            }
            MountStep::Tmpfs { target, mode, size } => EngineMount::Tmpfs {
                target: target.clone(),
                mode: *mode,
                size: *size,
            },
            _ => continue,
        });
    }
    Ok(out)
}

/// The agent's empty root filesystem (the mount points substrat-oci makes
/// there are the only entries).
fn empty_root(dir: &Path) -> Result<PathBuf, TurnError> {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).map_err(|source| TurnError::File {
        action: "create",
        path: root.clone(),
        source,
    })?;
    Ok(root)
}

#[derive(Serialize)]
struct RuntimeFile {
    /// Where the role's policy file is (none for a built-in one).
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_dir: Option<PathBuf>,
    /// A run report per container (`reports/ID.json`).
    report_dir: PathBuf,
    agent_binds: Vec<GrantedBind>,
    /// The host places this turn's plan binds (its sockets, home, chats,
    /// git dirs, workspace, the role's binds), as given and each its own
    /// resolved path (`sources`; never where a link leads): substrat-oci
    /// refuses binds of system and engine places (`/var/lib`, `/run`)
    /// unless allowed, and the daemon's own state and runtime directories
    /// are there. The plan is the daemon's, as substrat-run would run it.
    allow_host_paths: Vec<PathBuf>,
    /// The agent's own places, idmapped: it acts on its workspace, home,
    /// chats, configuration files, git state and broker socket as under
    /// substrat-run. Not `/usr` or `/etc/ssl/certs`: substrat-oci shows
    /// any other host path as it is, the container a stranger there.
    idmap_host_paths: Vec<PathBuf>,
}

#[derive(Serialize)]
struct GrantedBind {
    target: PathBuf,
    mode: &'static str,
    /// The agent's broker socket: substrat-oci refuses any other socket.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    socket: bool,
    /// The socket granted at `target` (substrat-oci checks the bound one
    /// is this one: its device and inode).
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<PathBuf>,
}

/// The name substrat-oci finds the role's policy by, and the directory it
/// is in (none for a built-in policy).
fn policy_name(policy: &LoadedPolicy) -> Result<(String, Option<PathBuf>), TurnError> {
    if substrat_policy::builtin::is_builtin_label(&policy.path) {
        return Ok((policy.name.clone(), None));
    }
    // substrat-oci loads the policy again by name: it must be the file the
    // daemon loaded (an inline role's is the one written in the state
    // directory).
    if !policy.path.is_file() {
        return Err(TurnError::Container(format!(
            "the role's policy is not a file substrat-oci can load ({})",
            policy.path.display()
        )));
    }
    let stem = policy
        .path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let dir = policy.path.parent().map(Path::to_path_buf);
    if !substrat_policy::valid_role_name(stem) || dir.is_none() {
        return Err(TurnError::Container(format!(
            "the role's policy {} is not NAME.toml with a plain name",
            policy.path.display()
        )));
    }
    Ok((stem.to_string(), dir))
}

/// Writes `DIR/oci.toml`, substrat-oci's configuration for this agent's
/// containers: where the role's policy is, where reports go, and the
/// agent's binds and home, which the policy's Landlock rules allow as
/// under substrat-run; returns its path.
fn write_runtime_config(
    dir: &Path,
    policy_dir: Option<PathBuf>,
    binds: &[AgentBind],
    home: &Path,
    allow_host_paths: Vec<PathBuf>,
    own: &[PathBuf],
) -> Result<PathBuf, TurnError> {
    let mode = |access: Access| if access == Access::Rw { "rw" } else { "ro" };
    let mut agent_binds = vec![GrantedBind {
        target: home.to_path_buf(),
        mode: "rw",
        socket: false,
        source: None,
    }];
    agent_binds.extend(binds.iter().map(|b| {
        let socket = std::fs::metadata(&b.source)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        GrantedBind {
            target: b.target.clone(),
            mode: mode(b.access),
            socket,
            source: socket.then(|| b.source.clone()),
        }
    }));
    let file = RuntimeFile {
        policy_dir,
        report_dir: dir.join("reports"),
        agent_binds,
        // As given, and only where they resolve to themselves (never a
        // link's target: `sources`).
        idmap_host_paths: own
            .iter()
            .filter(|p| p.canonicalize().is_ok_and(|r| r == **p))
            .cloned()
            .collect(),
        allow_host_paths,
    };
    let path = dir.join("oci.toml");
    let text =
        toml::to_string(&file).map_err(|e| TurnError::Container(format!("oci.toml: {e}")))?;
    std::fs::create_dir_all(dir).map_err(|source| TurnError::File {
        action: "create",
        path: dir.to_path_buf(),
        source,
    })?;
    // Never through a link put at its place, only the daemon's to read.
    write_private(&path, &text, 0o600)?;
    Ok(path)
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
