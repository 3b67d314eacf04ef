//! One turn's launch: the agent's provider and its setup (relay, persona,
//! tools, model access), the files, the launcher's command line with the
//! agent's binds and the provider's environment, then the run itself.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use substrat_provider::{AgentSetup, ModelAccess, Provider, RelayEntry, Transcript, TurnRequest};
use tokio::process::Command;

use super::container::{ContainerEngine, ContainerTurn};
use super::files::{AgentFiles, Inside, prepare_files};
use super::model::AgentAccess;
use super::warm::{WarmEnd, WarmLaunch, WarmSandboxes, send_turn, wait_end};
use super::{
    Ended, FailReason, Failure, GATEWAY_PORT, GATEWAY_SOCKET_INSIDE, RELAY_INSIDE, SOCKET_INSIDE,
    TurnConfig, TurnError, TurnRunner, ending, read_stream, stderr_tail, terminate, turn_prompt,
};
use crate::broker::Broker;
use crate::store::{Agent, ClaimedTurn};

/// What every launch of an agent is made of, before its files: its
/// workspace, CLI, model access, persona, relay and tools.
pub(super) struct Prepared {
    pub(super) workspace: PathBuf,
    pub(super) provider: Arc<dyn Provider>,
    access: Option<AgentAccess>,
    persona: Option<String>,
    relay: RelayEntry,
    /// The broker's MCP endpoint inside, when the sandbox bridges it (a
    /// loopback of its own); none on the host's network (the relay).
    mcp_url: Option<String>,
    tools: Vec<String>,
    model: Option<ModelAccess>,
}

impl Prepared {
    /// `persona`: the agent's (None: resolved as its first turn does).
    pub(super) async fn of(
        broker: &Arc<Broker>,
        runner: &TurnRunner,
        agent: &Agent,
        persona: Option<Option<String>>,
    ) -> Result<Self, TurnError> {
        let workspace = agent
            .workspace
            .as_deref()
            .map(PathBuf::from)
            .ok_or(TurnError::NoWorkspace)?;
        if let Some(why) = broker
            .placed_workspace_refusal(agent)
            .map_err(TurnError::Placement)?
        {
            return Err(TurnError::PlacedWorkspace(why));
        }
        let provider = provider_of(&runner.config, agent)?;
        let policy = broker
            .policy_of(agent)
            .ok_or_else(|| TurnError::NoPolicy(agent.role.clone()))?;
        let access = model_access(runner, provider.as_ref(), &agent.id, &policy.policy.model)?;
        let persona = match persona {
            Some(given) => given,
            None => persona_of(broker, agent, &policy.policy).await?,
        };
        let relay = RelayEntry {
            command: RELAY_INSIDE.into(),
            args: vec!["--agent-id".into(), agent.id.clone()],
            env: vec![("SUBSTRAT_SOCKET".into(), SOCKET_INSIDE.into())],
        };
        let tools: Vec<String> = broker
            .menu(agent)
            .entries
            .iter()
            .map(|e| e.name.clone())
            .collect();
        let model = access.as_ref().map(|a| ModelAccess {
            base_url: format!("http://127.0.0.1:{GATEWAY_PORT}"),
            placeholder_key: a.placeholder.clone(),
            hosted_tools: policy.policy.model.hosted_tools.clone(),
            chosen: agent.model.clone(),
        });
        let mcp_url = substrat_sandbox::plan::mcp_url(policy.policy.network)
            .filter(|_| provider.takes_mcp_url());
        Ok(Self {
            workspace,
            provider,
            access,
            persona,
            relay,
            mcp_url,
            tools,
            model,
        })
    }

    pub(super) fn setup<'a>(&'a self, agent: &'a Agent, config: &'a TurnConfig) -> AgentSetup<'a> {
        AgentSetup {
            agent_id: &agent.id,
            home: &config.home,
            workspace: &self.workspace,
            relay: &self.relay,
            mcp_url: self.mcp_url.as_deref(),
            persona: self.persona.as_deref(),
            tools: &self.tools,
            model: self.model.as_ref(),
        }
    }

    /// The turn's files written, with the CLI's configuration for `setup`.
    pub(super) fn files(
        &self,
        broker: &Broker,
        agent: &Agent,
        config: &TurnConfig,
        setup: &AgentSetup<'_>,
    ) -> Result<AgentFiles, TurnError> {
        let inside = Inside {
            workspace: &self.workspace,
            home: &config.home,
        };
        prepare_files(broker, agent, &inside, self.provider.config_files(setup))
    }

    pub(super) fn launch<'a>(
        &'a self,
        agent: &'a Agent,
        files: &'a AgentFiles,
        setup: &'a AgentSetup<'a>,
    ) -> Launch<'a> {
        Launch {
            agent,
            workspace: &self.workspace,
            files,
            provider: self.provider.as_ref(),
            setup,
            access: self.access.as_ref(),
        }
    }
}

pub(super) async fn launch(
    broker: &Arc<Broker>,
    runner: &TurnRunner,
    turn: &ClaimedTurn,
) -> Result<(Ended, Transcript), TurnError> {
    let config = &runner.config;
    let agent = &turn.agent;
    let policy = broker
        .policy_of(agent)
        .ok_or_else(|| TurnError::NoPolicy(agent.role.clone()))?;
    let prepared = Prepared::of(broker, runner, agent, None).await?;
    if config.engine.is_some() {
        // Before the provider's files are put there (substrat-run checks
        // its own turns' workspace itself, --workspace-judged).
        super::container::check_workspace(&prepared.workspace)?;
        super::container::check_workspace_place(
            &prepared.workspace,
            policy.policy.filesystem.allow_workspace_risk,
        )?;
    }
    let setup = prepared.setup(agent, config);
    let files = prepared.files(broker, agent, config, &setup)?;
    let (workspace, provider) = (&prepared.workspace, prepared.provider.clone());
    let mut prompt = turn_prompt(turn);
    // A model's re-run does not repeat its calls in order: it is told
    // what the interrupted run did (position-based dedupe still catches
    // the very same call made again).
    if turn.attempt > 1 && !provider.replays_exactly() {
        let effects = broker
            .effects_of_turn(&turn.id)
            .map_err(TurnError::Effects)?;
        prompt = super::interrupted_note(&effects) + &prompt;
    }
    broker
        .set_turn_prompt(&turn.id, &prompt)
        .map_err(TurnError::RecordPrompt)?;
    let request = TurnRequest {
        model: agent.model.as_deref(),
        workspace,
        resume: turn.session_id.as_deref(),
        prompt: &prompt,
    };
    if let Some(models) = &runner.models {
        models.gateway().ledger().begin_turn(&agent.id);
        // The failed requests the turn is told of are its own.
        models.gateway().take_errors(&agent.id);
    }
    let launch = prepared.launch(agent, &files, &setup);
    let (command, container) = match &config.engine {
        Some(engine) => {
            let (command, turn) = super::container::container_command(
                broker, config, engine, &launch, &request, &turn.id,
            )?;
            (command, Some((engine, turn)))
        }
        None => (turn_command(broker, config, &launch, &request)?, None),
    };
    if let Some(warm) = warm_for(runner, agent, &policy.policy) {
        let bound = files.configs.iter().map(|(host, _)| host.clone()).collect();
        if let Some(split) = WarmLaunch::from_command(&command, bound) {
            let socket = super::warm::turns_socket(broker.state_dir(), &agent.id);
            match warm.sandbox_for(&agent.id, &split, &socket).await {
                Ok((pid, control)) => {
                    let turn = WarmTurn {
                        pid,
                        control,
                        argv: &split.argv,
                    };
                    return Ok(run_warm(broker, config, agent, turn, provider, warm).await);
                }
                Err(why) => tracing::warn!(
                    agent = %agent.name, reason = %why,
                    "no warm sandbox: this agent's turns run cold"
                ),
            }
        }
    }
    let ended = run(broker, config, agent, command, provider, container.as_ref()).await;
    // A container's turn: its repositories looked after as substrat-run
    // does after its command (a turn through substrat-run does it itself).
    if let Some((engine, mut turn)) = container {
        turn.ended(engine);
        for warning in turn.git.after_run() {
            tracing::warn!(agent = %agent.name, "{warning}");
        }
    }
    ended
}

/// The daemon's warm sandboxes, when this agent's turns can use one.
fn warm_for<'a>(
    runner: &'a TurnRunner,
    agent: &Agent,
    policy: &substrat_policy::model::Policy,
) -> Option<&'a WarmSandboxes> {
    let warm = runner.warm.as_deref()?;
    let eligible = warm_eligible(&runner.config, policy) && warm.wants(&agent.id);
    eligible.then_some(warm)
}

/// Whether a role's turns can run in a warm sandbox: a pid namespace
/// (each turn ends by killing every process of it), a direct workspace
/// (a layer's turn is one launch), and no container engine.
pub(super) fn warm_eligible(config: &TurnConfig, policy: &substrat_policy::model::Policy) -> bool {
    config.engine.is_none()
        && policy.namespaces.pid
        && policy.filesystem.workspace_mode != substrat_policy::model::WorkspaceMode::Overlay
}

/// A turn sent to a warm sandbox.
struct WarmTurn<'a> {
    /// The sandbox's launcher (what a stop signals).
    pid: u32,
    control: Arc<std::os::fd::OwnedFd>,
    argv: &'a [String],
}

/// A turn in the agent's warm sandbox: its output read into a transcript,
/// bounded in time; a timeout or a lost sandbox ends the sandbox.
async fn run_warm(
    broker: &Broker,
    config: &TurnConfig,
    agent: &Agent,
    turn: WarmTurn<'_>,
    provider: Arc<dyn Provider>,
    warm: &WarmSandboxes,
) -> (Ended, Transcript) {
    let failed = |reason, why: String| {
        (
            Ended::Failed(Failure::new(reason, why)),
            Transcript::default(),
        )
    };
    if broker.turn_started(&agent.id, turn.pid).is_some() {
        warm.release(&agent.id).await;
        return failed(FailReason::Killed, "stopped before it started".into());
    }
    let (stdout, stderr) = match send_turn(&turn.control, turn.argv) {
        Ok(pipes) => pipes,
        Err(e) => {
            warm.release(&agent.id).await;
            let why = format!("the warm sandbox did not take the turn: {e}");
            return failed(FailReason::SandboxLost, why);
        }
    };
    let stderr_task = tokio::spawn(stderr_tail(stderr));
    let mut transcript = Transcript::default();
    let reading = read_stream(stdout, provider, broker, agent, &mut transcript);
    let done = tokio::time::timeout(config.timeout, async {
        reading.await;
        wait_end(turn.control.clone()).await
    })
    .await;
    let Ok(end) = done else {
        warm.release(&agent.id).await;
        return (timed_out(config), transcript);
    };
    let stderr = stderr_task.await.unwrap_or_default();
    match end {
        WarmEnd::Ended(code) => {
            warm.turn_ended(&agent.id).await;
            (ending(&transcript, &code.to_string(), &stderr), transcript)
        }
        WarmEnd::Lost(why) => {
            warm.release(&agent.id).await;
            let failure = Failure::new(FailReason::SandboxLost, format!("{why}: {stderr}"));
            (Ended::Failed(failure), transcript)
        }
    }
}

/// A turn stopped at the daemon's timeout (its transcript keeps the last
/// events it wrote).
fn timed_out(config: &TurnConfig) -> Ended {
    let why = format!("timed out after {} s", config.timeout.as_secs());
    Ended::Failed(Failure::new(FailReason::Timeout, why))
}

/// The agent's CLI, if this daemon runs it and its version is one the
/// provider is written for.
fn provider_of(config: &TurnConfig, agent: &Agent) -> Result<Arc<dyn Provider>, TurnError> {
    let provider = config
        .providers
        .get(agent.provider.as_deref())
        .ok_or_else(|| TurnError::UnknownProvider(agent.provider.clone().unwrap_or_default()))?;
    substrat_provider::version::check_version(provider.as_ref())?;
    Ok(provider.clone())
}

/// The agent's gateway socket and placeholder when its CLI talks to a
/// model; an error when it does and the daemon has no gateway.
fn model_access(
    runner: &TurnRunner,
    provider: &dyn Provider,
    agent_id: &str,
    budget: &substrat_policy::model::ModelBudget,
) -> Result<Option<AgentAccess>, TurnError> {
    let Some(api) = provider.model_api() else {
        return Ok(None);
    };
    let models = runner
        .models
        .as_ref()
        .ok_or_else(|| TurnError::NoGateway(provider.name().to_string()))?;
    models
        .for_agent(agent_id, api, budget)
        .map(Some)
        .map_err(TurnError::GatewaySocket)
}

/// The launcher run, its output read into a transcript, bounded in time.
async fn run(
    broker: &Broker,
    config: &TurnConfig,
    agent: &Agent,
    mut command: Command,
    provider: Arc<dyn Provider>,
    container: Option<&(&ContainerEngine, ContainerTurn)>,
) -> Result<(Ended, Transcript), TurnError> {
    let mut child = command.spawn().map_err(|source| TurnError::Start {
        launcher: container.map_or_else(|| config.launcher.clone(), |(e, _)| e.program.clone()),
        source,
    })?;
    if let Some(pid) = child.id()
        && broker.turn_started(&agent.id, pid).is_some()
    {
        terminate(pid);
    }
    let stdout = child.stdout.take().ok_or(TurnError::NoPipe("stdout"))?;
    let stderr = child.stderr.take().ok_or(TurnError::NoPipe("stderr"))?;
    let stderr_task = tokio::spawn(stderr_tail(stderr));
    let mut transcript = Transcript::default();
    let reading = read_stream(stdout, provider, broker, agent, &mut transcript);
    let status = match tokio::time::timeout(config.timeout, async {
        reading.await;
        child.wait().await
    })
    .await
    {
        Ok(done) => done,
        Err(_) => {
            if let Some(pid) = child.id() {
                terminate(pid);
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            let _ = child.start_kill();
            // A container outlives its engine's client: removed by name.
            if let Some((engine, turn)) = container {
                super::container::remove(engine, turn).await;
            }
            return Ok((timed_out(config), transcript));
        }
    };
    let stderr = stderr_task.await.unwrap_or_default();
    let code = status
        .map(|s| {
            s.code()
                .map(|c| c.to_string())
                .unwrap_or_else(|| "killed".into())
        })
        .unwrap_or_else(|e| e.to_string());
    Ok((ending(&transcript, &code, &stderr), transcript))
}

/// What one turn's command line is made of.
pub(super) struct Launch<'a> {
    pub(super) agent: &'a Agent,
    pub(super) workspace: &'a Path,
    pub(super) files: &'a AgentFiles,
    pub(super) provider: &'a dyn Provider,
    pub(super) setup: &'a AgentSetup<'a>,
    pub(super) access: Option<&'a AgentAccess>,
}

/// How a launcher names the role's policy: a built-in by name, a file by
/// its path.
pub(super) fn policy_arg(policy: &substrat_policy::LoadedPolicy) -> String {
    if substrat_policy::builtin::is_builtin_label(&policy.path) {
        policy.name.clone()
    } else {
        policy.path.display().to_string()
    }
}

/// `substrat-run` for one turn: the role's policy, the agent's binds on
/// top, the provider's environment and command line.
pub(super) fn turn_command(
    broker: &Broker,
    config: &TurnConfig,
    launch: &Launch<'_>,
    request: &TurnRequest<'_>,
) -> Result<Command, TurnError> {
    let agent = launch.agent;
    let policy = broker
        .policy_of(agent)
        .ok_or_else(|| TurnError::NoPolicy(agent.role.clone()))?;
    let policy_arg = policy_arg(policy);
    let agent_dir = broker.state_dir().join("agents").join(&agent.id);
    let mut command = Command::new(&config.launcher);
    command
        .args(["--policy", &policy_arg, "--agent-id", &agent.id])
        .args(["--backend", &config.backend])
        .arg("--workspace")
        .arg(launch.workspace)
        // The agent's own git dir (its workspace's `.git` inside).
        .arg("--git-state")
        .arg(agent_dir.join("git"))
        .args(["--die-with-parent", &std::process::id().to_string()])
        // The workspace's contents were judged when the agent was made
        // (what the agent writes there since must not end its turns); its
        // place is checked again, and a link put on its way refused.
        .arg("--workspace-judged")
        // Its stdio is the daemon's pipes: never a terminal.
        .args(["--tty", "never"])
        // The agent's own home at HOME, below the policy's binds there.
        .arg("--home")
        .arg(&launch.files.home)
        // Used only by roles with network = "proxy".
        .arg("--proxy-audit")
        .arg(agent_dir.join("proxy.log"));
    // An overlay role: every turn is a turn of the agent's own layer.
    if policy.policy.filesystem.workspace_mode == substrat_policy::model::WorkspaceMode::Overlay {
        command
            .args(["--workspace-mode", "overlay", "--keep-layer"])
            .arg(super::layer_dir(broker.state_dir(), &agent.id));
    }
    if let Some(parent) = &config.cgroup_parent {
        command.arg("--cgroup-parent").arg(parent);
    }
    if let Some(destinations) = &config.destinations {
        command.arg("--destinations").arg(destinations);
    }
    for (mode, source, target) in agent_binds(broker, config, launch) {
        command
            .arg("--agent-bind")
            .arg(mode)
            .arg(source)
            .arg(target);
    }
    // The daemon's secrets stay in the daemon: never in a launcher's
    // environment (the provider's placeholders are set again below).
    for name in config.secret_env.present() {
        command.env_remove(name);
    }
    for (name, value) in launch.provider.env(launch.setup) {
        command.arg("--pass-env").arg(&name).env(&name, value);
    }
    command
        .arg("--")
        .args(launch.provider.argv(request, launch.setup))
        .env("HOME", &config.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(command)
}

/// The agent's binds: its chats (read-write), its broker
/// socket, the relay, the provider's program and configuration, and its
/// gateway socket (read-only).
pub(super) fn agent_binds(
    broker: &Broker,
    config: &TurnConfig,
    launch: &Launch<'_>,
) -> Vec<(&'static str, PathBuf, PathBuf)> {
    let files = launch.files;
    let mut binds: Vec<(&str, PathBuf, PathBuf)> = vec![
        ("rw", files.chats.clone(), config.home.join(".cursor/chats")),
        (
            "ro",
            broker.socket_path(&launch.agent.id),
            SOCKET_INSIDE.into(),
        ),
        ("ro", config.mcp_server.clone(), RELAY_INSIDE.into()),
    ];
    for m in launch.provider.mounts() {
        binds.push(("ro", m.source, m.target));
    }
    for (source, target) in &files.configs {
        binds.push(("ro", source.clone(), target.clone()));
    }
    if let Some(access) = launch.access {
        binds.push(("ro", access.socket.clone(), GATEWAY_SOCKET_INSIDE.into()));
    }
    binds
}

/// How many times a first turn waits 200 ms for a role evaluation slot.
const BUSY_WAITS: u32 = 50;

/// The agent's system prompt: resolved once for its role (at spawn, with
/// the operator's `--arg`s, or here at its first turn with the arguments
/// its parent gave spawn_agent) and kept;
/// a static role's is its policy's.
async fn persona_of(
    broker: &Arc<Broker>,
    agent: &Agent,
    policy: &substrat_policy::model::Policy,
) -> Result<Option<String>, TurnError> {
    if let Some(kept) = broker.agent_persona(&agent.id) {
        return Ok(Some(kept));
    }
    if !broker.is_resolved_role(&agent.role) {
        return Ok(policy.persona.system_prompt.clone());
    }
    let args: crate::roles::RoleArgs = broker
        .agent_role_args(&agent.id)
        .and_then(|json| serde_json::from_str(&json).ok())
        .unwrap_or_default();
    // Busy is momentary (other evaluations hold the slots): waited out
    // rather than failing the agent's first turn.
    let mut waits = 0;
    let prompt = loop {
        let (b, role, caller) = (broker.clone(), agent.role.clone(), agent.clone());
        let given = args.clone();
        let outcome =
            tokio::task::spawn_blocking(move || b.resolve_role(&role, given, Some(caller)))
                .await
                .map_err(|e| TurnError::RoleThread(e.to_string()))?;
        match outcome {
            Err(crate::roles::RoleError::Busy { .. }) if waits < BUSY_WAITS => {
                waits += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Its own evaluations over the gate's (`roles::gate`): the
            // same wait, counted alike.
            Err(crate::roles::RoleError::Limited { .. }) if waits < BUSY_WAITS => {
                waits += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => break other?,
        }
    };
    let persona = crate::roles::persona_text(&prompt);
    broker.keep_agent_persona(&agent.id, &persona);
    Ok(Some(persona))
}
