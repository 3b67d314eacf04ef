//! Turns: the scheduler that runs queued turns in at most `slots` sandboxes
//! at once, and one turn's life: files prepared, the launcher started as a
//! separate process (`substrat-run`, the launcher, never a sandbox applied in
//! the daemon), the provider's stream read, the outcome recorded.
//!
//! Turns wait in the durable queue, never inside a tool call: every tool
//! returns at once, and a sync message's answer is the sender's next turn.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use substrat_provider::{Provider, Transcript};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::broker::{Broker, StopReason};
use crate::store::{ClaimedTurn, MessageKind, TurnFinish, TurnOutcome};

pub mod container;
mod failure;
mod files;
mod launch;
pub mod model;
pub mod pool;
pub mod warm;

use failure::ending;
pub use failure::{FailReason, Failure};
pub use model::{GATEWAY_PORT, GATEWAY_SOCKET_INSIDE};

/// Where an overlay role's agent keeps its workspace layer (a turn per
/// turn): `agent diff|apply|discard|rollback` read it there.
pub fn layer_dir(state_dir: &std::path::Path, agent_id: &str) -> std::path::PathBuf {
    state_dir.join("agents").join(agent_id).join("layer")
}

/// Longest stdout line read from a provider; longer ones are cut and noted.
pub const MAX_LINE: usize = 4 << 20;
/// How much of the launcher's stderr is kept for a failed turn's reason.
const STDERR_TAIL: usize = 2048;
/// Where the agent's socket and the relay appear inside the sandbox.
/// The sandbox lets the command connect there (`LAUNCHER_SOCKETS`).
pub const SOCKET_INSIDE: &str = substrat_sandbox::plan::BROKER_SOCKET_INSIDE;
pub const RELAY_INSIDE: &str = "/run/substrat/substrat-mcp-server";

#[derive(Debug, Clone)]
pub struct TurnConfig {
    /// The launcher (`substrat-run`, the same as `substrat-sandbox run`) that starts each turn's sandbox.
    pub launcher: PathBuf,
    /// The relay bound read-only into every sandbox.
    pub mcp_server: PathBuf,
    /// The agent CLIs turns can run, and the default one.
    pub providers: Providers,
    /// At most this many turns run at once.
    pub slots: usize,
    /// `auto`, `native` or `bwrap`.
    pub backend: String,
    pub cgroup_parent: Option<PathBuf>,
    /// A turn running longer is stopped and fails.
    pub timeout: Duration,
    /// The HOME the sandboxes see: each agent's own home is bound there.
    pub home: PathBuf,
    /// The model gateway's upstreams; none: CLIs that need a model fail
    /// their turns with a clear reason.
    pub gateway: Option<substrat_gateway::GatewayConfig>,
    /// Variables of the daemon's environment that hold its secrets: never
    /// passed to a launcher.
    pub secret_env: crate::secret_env::SecretEnv,
    /// The operator's destinations file (private endpoints the proxies of
    /// `network = "proxy"` roles may reach), passed to every launch.
    pub destinations: Option<PathBuf>,
    /// Keep each agent's sandbox between its turns (`warm`), releasing it
    /// after this long without a turn; None: every turn is a cold launch.
    pub warm_idle: Option<Duration>,
    /// With `warm_idle`: how many sandboxes to build ahead per role and
    /// workspace in use, for agents not made yet (`daemon --warm-pool`).
    pub warm_pool: std::collections::BTreeMap<String, usize>,
    /// Run each turn as a container through this engine instead of
    /// `launcher` (`daemon --engine podman`).
    pub engine: Option<container::ContainerEngine>,
}

/// The agent CLIs this daemon can run, by name, and the default one.
#[derive(Debug, Clone)]
pub struct Providers {
    default: String,
    by_name: std::collections::BTreeMap<String, Arc<dyn Provider>>,
}

impl Providers {
    pub fn new(default: Arc<dyn Provider>) -> Self {
        let name = default.name().to_string();
        Self {
            default: name.clone(),
            by_name: [(name, default)].into(),
        }
    }

    pub fn add(&mut self, provider: Arc<dyn Provider>) {
        self.by_name.insert(provider.name().to_string(), provider);
    }

    /// The agent's provider: the one it names, else the default.
    pub fn get(&self, name: Option<&str>) -> Option<&Arc<dyn Provider>> {
        self.by_name.get(name.unwrap_or(&self.default))
    }

    pub fn default_name(&self) -> &str {
        &self.default
    }

    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }
}

/// What the scheduler runs turns with: the configuration, and the model
/// gateway's access points when there is a gateway.
#[derive(Debug)]
pub struct TurnRunner {
    pub config: TurnConfig,
    pub models: Option<model::ModelAccessPoints>,
    pub warm: Option<Arc<warm::WarmSandboxes>>,
}

impl TurnRunner {
    /// The gateway (if configured) with its audit log in the state
    /// directory and usage recorded in the store.
    pub fn new(config: TurnConfig, broker: &Arc<Broker>) -> Result<Self, std::io::Error> {
        let models = match &config.gateway {
            None => None,
            Some(gateway) => {
                use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
                let audit = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(broker.state_dir().join("gateway.log"))?;
                let sink = Arc::new(model::StoreUsage(broker.clone()));
                // Request bodies wait in the state directory's filesystem,
                // not in a /tmp that may be memory.
                let mut gateway = gateway.clone();
                gateway.spool.dir = broker.state_dir().join("gateway-spool");
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&gateway.spool.dir)?;
                let gateway = substrat_gateway::Gateway::new(gateway, Box::new(audit), Some(sink))
                    .map_err(std::io::Error::other)?;
                // A restart does not renew a day's token budgets.
                let today = broker
                    .store()
                    .model_tokens_today()
                    .map_err(std::io::Error::other)?;
                for (agent, tokens) in today {
                    gateway.ledger().carry_over_today(&agent, tokens);
                }
                // Other daemons may serve the team: its budget is counted
                // where they all see it.
                if broker.store().engine() == crate::store::Engine::Postgres {
                    gateway.set_team_meter(Arc::new(model::StoreTeamMeter(broker.clone())));
                }
                let dir = model::gateway_dir(broker.runtime_dir());
                Some(model::ModelAccessPoints::new(Arc::new(gateway), dir))
            }
        };
        let warm = pool::warm_sandboxes(&config, broker)?;
        Ok(Self {
            config,
            models,
            warm,
        })
    }
}

/// Runs queued turns until the task is dropped.
pub async fn schedule(broker: Arc<Broker>, runner: Arc<TurnRunner>) {
    let slots = Arc::new(Semaphore::new(runner.config.slots.max(1)));
    loop {
        let free = slots.available_permits();
        match broker.claim_turns(free) {
            Ok(turns) => {
                for turn in turns {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        break;
                    };
                    // The agents it may spawn find their sandboxes built.
                    pool::refill_near(&broker, &runner, &turn.agent);
                    let (broker, runner) = (broker.clone(), runner.clone());
                    // Spawned from a runtime worker thread, which lives as long as
                    // the daemon: the launcher's parent-death signal follows the
                    // spawning thread.
                    // Every event of the turn carries its ids (`--log-format
                    // json`: `span`), the audit log's agent_id among them.
                    let span = tracing::info_span!("turn", agent = %turn.agent.name,
                        agent_id = %turn.agent.id, turn = %turn.id);
                    tokio::spawn(
                        async move {
                            run_turn(&broker, &runner, turn).await;
                            drop(permit);
                        }
                        .instrument(span),
                    );
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot take turns from the queue"),
        }
        if let Some(warm) = &runner.warm {
            let (kept, ready, building) = warm.counts().await;
            broker.metrics.sandboxes(kept, ready, building);
            for agent in broker.take_released() {
                warm.release(&agent).await;
            }
            warm.release_idle().await;
            for reserved in warm.pool.release_idle(warm.idle) {
                if let Some(models) = &runner.models {
                    models.forget(&reserved);
                }
            }
        }
        tokio::select! {
            _ = broker.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The prompt a turn delivers (seed 000's wording for replies).
pub fn turn_prompt(turn: &ClaimedTurn) -> String {
    let Some(m) = &turn.message else {
        return turn.prompt.clone().unwrap_or_default();
    };
    match m.kind {
        MessageKind::Reply => format!(
            "Reply from {} (to message {}):\n{}",
            m.from_name, m.thread, m.text
        ),
        MessageKind::NoReply => format!(
            "No reply from {} (to message {}): {}",
            m.from_name, m.thread, m.text
        ),
        MessageKind::Message => format!(
            "Message from {} (message {}). Your final answer is sent back to {} as the reply.\n{}",
            m.from_name, m.thread, m.from_name, m.text
        ),
        MessageKind::Broadcast => format!(
            "Broadcast from {} to the team (message {}). Your final answer is sent back to {} as the reply.\n{}",
            m.from_name, m.thread, m.from_name, m.text
        ),
        MessageKind::Instructions | MessageKind::Report | MessageKind::Operator => m.text.clone(),
    }
}

async fn run_turn(broker: &Arc<Broker>, runner: &TurnRunner, turn: ClaimedTurn) {
    let agent = turn.agent.name.clone();
    tracing::info!(agent = %agent, turn = %turn.id, attempt = turn.attempt, "turn starts");
    let started = std::time::Instant::now();
    let provider = runner.config.providers.get(turn.agent.provider.as_deref());
    let cli = provider.map(|p| json!({"name": p.name(), "version": p.version()}));
    let provider_name = provider.map_or("none", |p| p.name()).to_string();
    let launched = launch::launch(broker, runner, &turn).await;
    let launch_ok = launched.is_ok();
    let (outcome, transcript) = match launched {
        Ok(done) => done,
        Err(e) => {
            let failure = Failure::new(FailReason::LaunchFailed, e.to_string());
            (Ended::Failed(failure), Transcript::default())
        }
    };
    // The gateway's failed requests of this turn (the agent's own socket).
    let model_errors = runner
        .models
        .as_ref()
        .map(|m| m.gateway().take_errors(&turn.agent.id))
        .unwrap_or_default();
    let seen = broker.turn_ended(&turn.agent.id);
    let to_output = seen
        .as_ref()
        .and_then(|s| s.first_output)
        .map(|at| at.saturating_duration_since(started));
    let (backend, warm) = (&runner.config.backend, runner.warm.is_some());
    broker.metrics.launch(backend, warm, launch_ok, to_output);
    let outcome = match (seen.as_ref().and_then(|s| s.stop.clone()), outcome) {
        // A daemon that lost its database puts the turn back (fenced: one
        // another daemon failed meanwhile stays failed); its agent did
        // nothing wrong.
        (Some(StopReason::Suspend | StopReason::LeaseLost | StopReason::Shutdown), _) => {
            tracing::info!(agent = %agent, turn = %turn.id, "turn stopped (suspend, the state database lost, or the daemon stops); queued again");
            if let Err(e) = broker.requeue_turn(&turn.id) {
                tracing::error!(error = %e, "cannot queue the turn again");
            }
            let end = crate::metrics::TurnEnd::Requeued;
            broker.metrics.turn(&provider_name, end, started.elapsed());
            return;
        }
        (Some(StopReason::Kill), _) => {
            Err(Failure::new(FailReason::Killed, "killed by the operator"))
        }
        (None, Ended::Failed(failure)) => Err(failure.with_model_errors(&model_errors)),
        (None, Ended::Answer(result)) => Ok(result),
    };
    let mut notes = json!({"notes": transcript.notes, "total": transcript.notes_total,
                      "reported_tool_calls": transcript.tool_calls,
                      "reported_tool_calls_total": transcript.tool_calls_total, "cli": cli,
                      "tokens": transcript.tokens, "model": transcript.model});
    let (outcome, end) = match outcome {
        Ok(result) => {
            tracing::info!(agent = %agent, turn = %turn.id, "turn done");
            (TurnOutcome::Done { result }, crate::metrics::TurnEnd::Done)
        }
        Err(failure) => {
            tracing::warn!(agent = %agent, turn = %turn.id, reason = failure.reason.as_str(),
                error = %failure.message, "turn failed");
            notes["failure"] = failure.record(&transcript, &model_errors);
            let end = crate::metrics::TurnEnd::Failed(failure.reason);
            let reason = failure.message;
            (TurnOutcome::Failed { reason }, end)
        }
    };
    broker.metrics.turn(&provider_name, end, started.elapsed());
    let calls = seen.map(|s| s.calls).unwrap_or_default();
    let finish = TurnFinish {
        turn_id: &turn.id,
        session_id: transcript.session_id.as_deref(),
        outcome,
        tool_calls: json!(calls).to_string(),
        notes: notes.to_string(),
    };
    record_end(broker, &finish, &agent).await;
}

/// Records a turn's end, trying again while the state database is
/// unreachable (up to a minute). A turn whose end cannot be recorded stays
/// running in the database until its lease runs out; it is then failed,
/// and whoever waits for it told.
async fn record_end(broker: &Broker, finish: &TurnFinish<'_>, agent: &str) {
    for attempt in 1..=30 {
        match broker.finish_turn(finish) {
            Ok(()) => return,
            Err(crate::BrokerError::Store(e)) if e.is_retryable() && attempt < 30 => {
                tracing::warn!(agent, turn = %finish.turn_id, error = %e, "cannot record the turn's end yet; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => {
                tracing::error!(agent, turn = %finish.turn_id, error = %e, "cannot record the turn's end");
                return;
            }
        }
    }
}

pub(super) enum Ended {
    Answer(String),
    Failed(Failure),
}

/// Why a turn could not be run at all (its outcome is then a failure
/// with this text).
#[derive(Debug, thiserror::Error)]
enum TurnError {
    #[error("the agent has no workspace")]
    NoWorkspace,
    #[error("{0}")]
    PlacedWorkspace(String),
    #[error("cannot read where the agent was placed: {0}")]
    Placement(#[source] crate::broker::BrokerError),
    #[error("the agent's provider `{0}` is not one this daemon runs")]
    UnknownProvider(String),
    #[error(
        "{0} reaches its model through the gateway, and this daemon has no model upstream \
         (give the daemon a key: ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY, or --model-upstream)"
    )]
    NoGateway(String),
    #[error("{0}")]
    Version(#[from] substrat_provider::version::VersionProblem),
    #[error("the agent's gateway socket: {0}")]
    GatewaySocket(#[source] std::io::Error),
    #[error("role `{0}` has no policy")]
    NoPolicy(String),
    #[error("{0}")]
    Role(#[from] crate::roles::RoleError),
    #[error("cannot resolve the role: {0}")]
    RoleThread(String),
    #[error("cannot record the prompt: {0}")]
    RecordPrompt(#[source] crate::broker::BrokerError),
    #[error("cannot read what the interrupted run did: {0}")]
    Effects(#[source] crate::broker::BrokerError),
    #[error("cannot start {}: {source}", launcher.display())]
    Start {
        launcher: PathBuf,
        source: std::io::Error,
    },
    #[error("the launcher has no {0} pipe")]
    NoPipe(&'static str),
    #[error("cannot {action} {path}: {source}")]
    File {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {action}: {}{}", errno.desc(), if *errno == nix::Error::ELOOP { " (a symlink; refusing)" } else { "" })]
    MountPoint {
        path: PathBuf,
        action: String,
        errno: nix::Error,
    },
    #[error("{0} is not a regular file; refusing")]
    NotRegular(PathBuf),
    #[error("cannot run the turn as a container: {0}")]
    Container(String),
}

/// Reads the provider's stdout to its end into `transcript` (which keeps
/// what came when the reading is stopped: a timeout); odd lines are
/// logged and kept, never fatal.
pub(super) async fn read_stream(
    stdout: impl tokio::io::AsyncRead + Unpin,
    provider: Arc<dyn substrat_provider::Provider>,
    broker: &Broker,
    agent: &crate::store::Agent,
    transcript: &mut Transcript,
) {
    let agent_name = &agent.name;
    use substrat_provider::{Line, StreamEvent};
    let mut reader = BufReader::new(stdout);
    let mut kept = false;
    let mut first = true;
    while let Ok(Some((line, cut))) = read_line_bounded(&mut reader, MAX_LINE).await {
        if std::mem::take(&mut first) {
            broker.turn_output(&agent.id);
        }
        let text = String::from_utf8_lossy(&line);
        if cut {
            transcript.push(Line::Malformed {
                excerpt: text.chars().take(200).collect(),
                error: format!("line longer than {MAX_LINE} bytes, cut"),
            });
            continue;
        }
        let parsed = provider.parse_line(&text);
        match &parsed {
            Line::Malformed { error, .. } => {
                tracing::warn!(agent = %agent_name, error = %error, "malformed stream line");
            }
            Line::Event(StreamEvent::Unknown { kind, .. }) => {
                tracing::info!(agent = %agent_name, kind = %kind, "unknown stream event kept");
            }
            _ => {}
        }
        transcript.push(parsed);
        // The session is kept once the CLI has made a tool call in it (it
        // has then written the session: a turn cut off from here on is
        // resumed in it, and told what it did). Not before: a CLI killed
        // while starting may never have written the session it named.
        if !kept
            && !transcript.tool_calls.is_empty()
            && let Some(session) = &transcript.session_id
        {
            kept = true;
            if let Err(e) = broker.set_agent_session(&agent.id, session) {
                tracing::warn!(agent = %agent_name, error = %e, "cannot keep the session id");
            }
        }
    }
}

/// What an interrupted turn's re-run is told before its prompt: that it
/// runs again, and what of it already took effect (not to be redone).
pub(super) fn interrupted_note(effects: &[crate::store::TurnEffect]) -> String {
    use crate::store::TurnEffect;
    let mut note = String::from(
        "[substrat] This turn was interrupted (the daemon stopped) and runs again, in the same \
         session.",
    );
    if effects.is_empty() {
        note.push_str(" None of its tool calls took effect.\n");
    } else {
        note.push_str(" These of its tool calls already took effect; do not make them again:\n");
        for effect in effects {
            let line = match effect {
                TurnEffect::Message { kind, to, text } => {
                    let excerpt: String = text.chars().take(200).collect();
                    format!("- {kind} to {to}: {excerpt}")
                }
                TurnEffect::Spawned { name } => format!("- spawn_agent: {name}"),
            };
            note.push_str(&line);
            note.push('\n');
        }
    }
    note.push_str("Files it changed in the workspace are as it left them.\n\n");
    note
}

pub(super) fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// Reads one line of at most `max` bytes (the rest of a longer line is
/// skipped; the flag says so). `None` at the end of the stream.
pub async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<(Vec<u8>, bool)>> {
    let mut line = Vec::new();
    let mut cut = false;
    let mut any = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(any.then_some((line, cut)));
        }
        any = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1),
            None => (buf, 0),
        };
        let room = max.saturating_sub(line.len());
        cut |= chunk.len() > room;
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = if done > 0 { done } else { chunk.len() };
        reader.consume(used);
        if done > 0 {
            return Ok(Some((line, cut)));
        }
    }
}

/// The last `STDERR_TAIL` bytes the launcher wrote to stderr.
pub(super) async fn stderr_tail(mut stderr: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        // In the turn's span: the launcher's words followed with its turn.
        tracing::debug!(
            target: "substrat::launcher",
            stderr = %String::from_utf8_lossy(&buf[..n]),
            "launcher"
        );
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
    String::from_utf8_lossy(&tail).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_lines_are_cut_and_flagged() {
        let input = b"short\n0123456789abc\n\nlast".to_vec();
        let mut reader = BufReader::with_capacity(4, &input[..]);
        let mut lines = Vec::new();
        while let Some((line, cut)) = read_line_bounded(&mut reader, 10).await.unwrap() {
            lines.push((String::from_utf8(line).unwrap(), cut));
        }
        assert_eq!(
            lines,
            [
                ("short".to_string(), false),
                ("0123456789".to_string(), true),
                (String::new(), false),
                ("last".to_string(), false),
            ]
        );
    }
}
