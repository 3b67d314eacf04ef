//! Warm sandboxes for the daemon's turns: each agent's sandbox is kept
//! between its turns (`substrat-run --serve-turns`, substrat_sandbox::turns)
//! and each turn's provider runs inside it as a cold launch would run it.
//!
//! A sandbox is reused only for a launch that would be built the same: the
//! launcher's whole command line (policy, binds, environment) is its
//! fingerprint; any difference (another provider, another bind) ends it and
//! builds a new one. The configuration files it binds are rewritten in
//! place before each turn (turns::files), so it sees each turn's own.
//! A turn that times out or is stopped ends its sandbox. Sandboxes idle
//! longer than the configured time are released. Where a warm sandbox
//! cannot be built (the bwrap backend, a policy without a pid namespace,
//! an overlay workspace), the turn runs cold and the agent stays cold.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use substrat_sandbox::cgroup::Freezer;
use substrat_sandbox::turns::{self, Hello, TurnReply, TurnRequest};
use tokio::process::{Child, Command};

/// How long a launcher may take to connect (it connects before it builds).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The daemon's warm sandboxes, by agent id.
#[derive(Debug, Default)]
pub struct WarmSandboxes {
    /// A sandbox is released after this long without a turn.
    pub idle: Duration,
    by_agent: tokio::sync::Mutex<HashMap<String, Warm>>,
    /// Agents whose sandbox could not be built warm: they run cold.
    cold: std::sync::Mutex<HashSet<String>>,
    /// Sandboxes built ahead for agents not made yet (`daemon --warm-pool`).
    pub(super) pool: super::pool::WarmPool,
}

#[derive(Debug)]
pub(super) struct Warm {
    fingerprint: [u8; 32],
    launcher: Child,
    control: Arc<OwnedFd>,
    socket: PathBuf,
    last_turn: Instant,
    /// Frozen between turns, when the launcher made a freezer group.
    freezer: Option<Freezer>,
}

impl Drop for Warm {
    fn drop(&mut self) {
        self.signal_end();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Where an agent's warm sandbox serves its turns.
pub(super) fn turns_socket(state_dir: &Path, agent_id: &str) -> PathBuf {
    state_dir.join("agents").join(agent_id).join("turns.sock")
}

/// One turn's launch split for a warm sandbox: the launcher's command line
/// without its command, the command, and what the sandbox binds.
pub(super) struct WarmLaunch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub envs: Vec<(OsString, Option<OsString>)>,
    pub argv: Vec<String>,
    pub bound_files: Vec<PathBuf>,
}

impl WarmLaunch {
    /// Splits a cold launch's command at its `--`; None when it has none
    /// or its command line is not text.
    pub fn from_command(command: &Command, bound_files: Vec<PathBuf>) -> Option<Self> {
        let std = command.as_std();
        let all: Vec<OsString> = std.get_args().map(OsString::from).collect();
        let split = all.iter().position(|a| a == "--")?;
        let argv = all[split + 1..]
            .iter()
            .map(|a| a.clone().into_string().ok())
            .collect::<Option<Vec<String>>>()?;
        Some(Self {
            program: PathBuf::from(std.get_program()),
            args: all[..split].to_vec(),
            envs: std
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(OsString::from)))
                .collect(),
            argv,
            bound_files,
        })
    }

    /// What makes two launches the same sandbox.
    fn fingerprint(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        let mut add = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        use std::os::unix::ffi::OsStrExt;
        add(self.program.as_os_str().as_bytes());
        for arg in &self.args {
            add(arg.as_bytes());
        }
        for (name, value) in &self.envs {
            add(name.as_bytes());
            add(value
                .as_deref()
                .map_or(b"\0unset".as_slice(), |v| v.as_bytes()));
        }
        for file in &self.bound_files {
            add(file.as_os_str().as_bytes());
        }
        hash.finalize().into()
    }
}

/// The end of a warm turn.
pub(super) enum WarmEnd {
    /// The command ended with this code.
    Ended(i32),
    /// The sandbox ended or refused: why (the agent's next turn builds a
    /// new one).
    Lost(String),
}

impl Warm {
    /// A sandbox for `launch`, built now, serving turns on `socket`.
    pub(super) async fn start(launch: &WarmLaunch, socket: &Path) -> Result<Self, String> {
        let (launcher, control, freezer) = start(launch, socket).await?;
        Ok(Self {
            fingerprint: launch.fingerprint(),
            launcher,
            control: Arc::new(control),
            socket: socket.to_path_buf(),
            last_turn: Instant::now(),
            freezer,
        })
    }

    /// Ends the sandbox (as dropping it does) and waits, a while, for its
    /// launcher to be gone.
    pub(super) async fn end(mut self) {
        self.signal_end();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.launcher.wait()).await;
    }

    /// Tells the launcher to end the sandbox: thawed first, so that its
    /// init sees the hang-up (the launcher's cleanup thaws too, should
    /// this fail); SIGTERM, on which the launcher ends the sandbox and
    /// removes its cgroups (a SIGKILL would leave them to the next
    /// launch's sweep).
    fn signal_end(&self) {
        if let Some(freezer) = &self.freezer {
            let _ = freezer.thaw();
        }
        if let Some(pid) = self.launcher.id() {
            super::terminate(pid);
        }
    }

    /// Counted idle from now.
    pub(super) fn touch(&mut self) {
        self.last_turn = Instant::now();
    }

    /// Whether its last turn (or its start) was `idle` ago or longer.
    pub(super) fn idle_for(&self, idle: Duration) -> bool {
        self.last_turn.elapsed() >= idle
    }
}

impl WarmSandboxes {
    pub fn new(idle: Duration, pool: super::pool::WarmPool) -> Self {
        Self {
            idle,
            pool,
            ..Self::default()
        }
    }

    /// How many sandboxes are kept: agents' warm ones, the pool's ready
    /// and being built.
    pub async fn counts(&self) -> (usize, usize, usize) {
        let warm = self.by_agent.lock().await.len() + self.pool.claimed_count();
        let (ready, building) = self.pool.counts();
        (warm, ready, building)
    }

    /// Whether the agent's turns should try a warm sandbox.
    pub fn wants(&self, agent_id: &str) -> bool {
        !self
            .cold
            .lock()
            .map(|c| c.contains(agent_id))
            .unwrap_or(true)
    }

    /// Ends the agent's sandbox (stopped turn, suspend, removal).
    pub async fn release(&self, agent_id: &str) {
        self.by_agent.lock().await.remove(agent_id);
        self.pool.take_claimed(agent_id);
    }

    /// The agent's turn has ended: its sandbox frozen until the next one.
    /// A sandbox that cannot be frozen is released (it was announced as
    /// freezable: something is wrong with it).
    pub async fn turn_ended(&self, agent_id: &str) {
        let mut by_agent = self.by_agent.lock().await;
        let failed = by_agent.get_mut(agent_id).and_then(|w| {
            // A launcher ending (stopped) is left to end.
            if !matches!(w.launcher.try_wait(), Ok(None)) {
                return None;
            }
            w.freezer.as_ref()?.freeze().err()
        });
        if let Some(e) = failed {
            tracing::warn!(agent = %agent_id, error = %e, "cannot freeze the warm sandbox: released");
            by_agent.remove(agent_id);
        }
    }

    /// Releases every sandbox idle for longer than `idle`.
    pub async fn release_idle(&self) {
        let idle = self.idle;
        self.by_agent
            .lock()
            .await
            .retain(|_, w| w.last_turn.elapsed() < idle);
        self.pool.release_idle_claimed(idle);
    }

    /// The agent's sandbox for `launch`, built if needed: its launcher's pid
    /// and control socket. Err: it could not be built warm (the agent's
    /// turns run cold from now on), with the launcher's words.
    pub(super) async fn sandbox_for(
        &self,
        agent_id: &str,
        launch: &WarmLaunch,
        socket: &Path,
    ) -> Result<(u32, Arc<OwnedFd>), String> {
        let fingerprint = launch.fingerprint();
        // Taken out of the pool while it is looked at or built, so other
        // agents' sandboxes are not held up by this one's start (one turn
        // per agent runs at a time: nothing else takes this entry).
        // An agent's first turn: its sandbox may have been built ahead.
        let kept = match self.by_agent.lock().await.remove(agent_id) {
            Some(warm) => Some((warm, false)),
            None => self.pool.take_claimed(agent_id).map(|warm| (warm, true)),
        };
        if let Some((mut warm, built_ahead)) = kept {
            let alive = matches!(warm.launcher.try_wait(), Ok(None));
            // A sandbox that cannot be thawed would never answer: released.
            let thawed = match warm.freezer.as_ref().map(Freezer::thaw) {
                Some(Err(e)) => {
                    tracing::warn!(agent = %agent_id, error = %e, "cannot thaw the warm sandbox: released");
                    false
                }
                _ => true,
            };
            if let (true, true, true, Some(pid)) = (
                alive,
                thawed,
                warm.fingerprint == fingerprint,
                warm.launcher.id(),
            ) {
                if built_ahead {
                    tracing::info!(agent = %agent_id, launcher = pid, "first turn in a sandbox built ahead (warm pool)");
                }
                warm.last_turn = Instant::now();
                let control = warm.control.clone();
                self.by_agent
                    .lock()
                    .await
                    .insert(agent_id.to_string(), warm);
                return Ok((pid, control));
            }
            // Ended, or built for another launch: released here.
            if built_ahead {
                tracing::warn!(agent = %agent_id, "the sandbox built ahead does not fit its first turn: built again");
            }
        }
        match Warm::start(launch, socket).await {
            Ok(warm) => {
                let pid = warm.launcher.id().unwrap_or(0);
                let control = warm.control.clone();
                self.by_agent
                    .lock()
                    .await
                    .insert(agent_id.to_string(), warm);
                Ok((pid, control))
            }
            Err(why) => {
                if let Ok(mut cold) = self.cold.lock() {
                    cold.insert(agent_id.to_string());
                }
                Err(why)
            }
        }
    }
}

/// Starts the launcher serving turns on `socket`, takes its connection and
/// its `Hello` (the freezer group). Spawned from the async context (a
/// runtime worker thread, which lives as long as the daemon): the
/// launcher's parent-death signal follows the thread that spawned it.
async fn start(
    launch: &WarmLaunch,
    socket: &Path,
) -> Result<(Child, OwnedFd, Option<Freezer>), String> {
    let _ = std::fs::remove_file(socket);
    let listener =
        turns::listen(socket).map_err(|e| format!("listen on {}: {e}", socket.display()))?;
    rustix::net::sockopt::set_socket_timeout(
        &listener,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(100)),
    )
    .map_err(|e| format!("socket timeout: {e}"))?;
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .arg("--serve-turns")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in &launch.envs {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    let mut launcher = command
        .spawn()
        .map_err(|e| format!("cannot start the launcher: {e}"))?;
    let control = match accept_launcher(&listener, &mut launcher).await {
        Ok(control) => control,
        Err(why) => {
            let _ = launcher.start_kill();
            return Err(why);
        }
    };
    let freezer = match hello(&control).await {
        Ok(freezer) => freezer,
        Err(why) => {
            // SIGTERM: it may have made its groups, which it removes then.
            if let Some(pid) = launcher.id() {
                super::terminate(pid);
            }
            return Err(format!("{why}: {}", launcher_words(&mut launcher).await));
        }
    };
    // Drained for the sandbox's life (a full pipe would stop the
    // launcher), its last words logged.
    if let Some(stderr) = launcher.stderr.take() {
        tokio::spawn(async move {
            let words = super::stderr_tail(stderr).await;
            if !words.is_empty() {
                tracing::info!(launcher = %words, "a warm sandbox ended");
            }
        });
    }
    Ok((launcher, control, freezer))
}

/// The launcher's connection, once it has made it (it connects before it
/// builds the sandbox).
async fn accept_launcher(listener: &OwnedFd, launcher: &mut Child) -> Result<OwnedFd, String> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        let accepted = tokio::task::spawn_blocking({
            let listener = listener.try_clone().map_err(|e| e.to_string())?;
            move || turns::accept(&listener)
        })
        .await
        .map_err(|e| e.to_string())?;
        match accepted {
            Ok(control) => return Ok(control),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        if let Ok(Some(status)) = launcher.try_wait() {
            return Err(format!(
                "the launcher ended before it connected ({status}): {}",
                launcher_words(launcher).await
            ));
        }
        if Instant::now() > deadline {
            return Err("the launcher did not connect".into());
        }
    }
}

/// The launcher's `Hello`: the sandbox's freezer group, checked to be one
/// (None: it cannot be frozen, logged with the launcher's reason). Read
/// with a deadline: the launcher sends it once the sandbox's groups are
/// made.
async fn hello(control: &OwnedFd) -> Result<Option<Freezer>, String> {
    let timeout = rustix::net::sockopt::Timeout::Recv;
    rustix::net::sockopt::set_socket_timeout(control, timeout, Some(CONNECT_TIMEOUT))
        .map_err(|e| format!("socket timeout: {e}"))?;
    let read = tokio::task::spawn_blocking({
        let control = control.try_clone().map_err(|e| e.to_string())?;
        move || {
            // SO_RCVTIMEO reads are not restarted after a signal handler.
            let deadline = Instant::now() + CONNECT_TIMEOUT;
            loop {
                match turns::read_hello(&control) {
                    Err(e)
                        if e.kind() == std::io::ErrorKind::Interrupted
                            && Instant::now() < deadline => {}
                    other => return other,
                }
            }
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    rustix::net::sockopt::set_socket_timeout(control, timeout, None)
        .map_err(|e| format!("socket timeout: {e}"))?;
    match read {
        Ok(Some(Hello::Freezer(freezer))) => match freezer.checked() {
            Ok(freezer) => Ok(Some(freezer)),
            Err(e) => Err(format!("the launcher's freezer: {e}")),
        },
        Ok(Some(Hello::NoFreezer { reason })) => {
            tracing::info!(%reason, "a warm sandbox that cannot be frozen between turns");
            Ok(None)
        }
        Ok(None) => Err("the launcher ended before the sandbox was built".into()),
        Err(e) => Err(format!("the launcher's hello: {e}")),
    }
}

/// The end of what a launcher that has exited (or was told to) wrote to
/// stderr; bounded, since a process of its sandbox may still hold the pipe.
async fn launcher_words(launcher: &mut Child) -> String {
    let Some(stderr) = launcher.stderr.take() else {
        return String::new();
    };
    tokio::time::timeout(Duration::from_secs(5), super::stderr_tail(stderr))
        .await
        .unwrap_or_else(|_| "(its stderr still open after 5 s)".into())
}

/// Sends one turn: the command with /dev/null for stdin and new pipes for
/// stdout and stderr (their read ends returned), then waits for its end
/// in the background (`wait_end`).
pub(super) fn send_turn(
    control: &OwnedFd,
    argv: &[String],
) -> std::io::Result<(
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Receiver,
)> {
    let (out_read, out_write) = std::io::pipe()?;
    let (err_read, err_write) = std::io::pipe()?;
    let null = std::fs::File::open("/dev/null")?;
    let request = TurnRequest {
        argv: argv.to_vec(),
        env: Vec::new(),
    };
    turns::send_request(
        control,
        &request,
        [null.as_fd(), out_write.as_fd(), err_write.as_fd()],
    )?;
    drop((out_write, err_write));
    Ok((
        tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(out_read))?,
        tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(err_read))?,
    ))
}

/// The answer to the turn sent on `control` (a blocking read, off the
/// runtime's threads).
pub(super) async fn wait_end(control: Arc<OwnedFd>) -> WarmEnd {
    let reply = tokio::task::spawn_blocking(move || turns::read_reply(control.as_fd())).await;
    match reply {
        Ok(Ok(Some(TurnReply::Ended { code }))) => WarmEnd::Ended(code),
        Ok(Ok(Some(TurnReply::Refused { reason }))) => WarmEnd::Lost(format!("refused: {reason}")),
        Ok(Ok(None)) => WarmEnd::Lost("the warm sandbox ended during the turn".into()),
        Ok(Err(e)) => WarmEnd::Lost(format!("the warm sandbox's socket: {e}")),
        Err(e) => WarmEnd::Lost(e.to_string()),
    }
}
