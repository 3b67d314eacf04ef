//! Script roles evaluated in a process of their own (issue 39). Lua's
//! instruction hook never fires inside a C function: a pattern that
//! backtracks (`("a*"):rep(30) .. "b"` over 30 `a`s), or an error handler
//! Lua calls again and again, ran on past the time limit and held a
//! daemon thread and a CPU until it ended. Each evaluation now runs in
//! `substrat-sandbox __role-eval`, a fresh process the daemon kills at the
//! limit: it reads one request on stdin, asks the daemon for `context`
//! answers over its stdout and stdin (each counted by the daemon too), and
//! writes its answer on stdout. At most `MAX_PROCESSES` run at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::lua::{LuaLimits, LuaRole};
use super::{RoleArgs, RoleError, RoleInfo, RolePrompt, TeamContext};

/// At most this many evaluations run at once; more wait (at most their
/// time limit) for one to end, then are refused as busy. The daemon's
/// callers are admitted first (`gate`): agents' and the operator's places
/// together fit.
pub const MAX_PROCESSES: usize = super::gate::AGENT_EVALS + super::gate::OPERATOR_EVALS;
/// What the evaluator's start and its kill may add to the time limit.
pub const START_SLACK: Duration = Duration::from_millis(250);
/// How long a launcher has to end its sandbox after SIGTERM.
const KILL_GRACE: Duration = Duration::from_millis(250);
/// The address space the evaluator gets on top of the script's memory
/// limit (the program itself, its stacks, copies of the answer).
const AS_HEADROOM: u64 = 512 << 20;
/// The longest line either side reads (a request holds a script of at
/// most 1 MiB, an answer at most `lua::MAX_RESULT_BYTES` of text, each
/// escaped as JSON).
const MAX_LINE: u64 = 8 << 20;

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
static SANDBOX: OnceLock<EvalSandbox> = OnceLock::new();

/// The program whose `__role-eval` evaluates scripts: the daemon's and
/// the CLI's own binary, set once at its start.
pub fn set_program(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// How the daemon's launches are made (its upstream servers' and turns'
/// launcher), for the evaluators' sandboxes.
#[derive(Debug, Clone)]
pub struct EvalLaunch {
    pub launcher: PathBuf,
    pub backend: String,
    pub cgroup_parent: Option<PathBuf>,
}

/// Each evaluator in a sandbox of the `upstream` kind: through the
/// launcher, with a policy extending `upstream` that binds the program
/// read-only, in a workspace of their own.
#[derive(Debug)]
struct EvalSandbox {
    launch: EvalLaunch,
    policy: PathBuf,
    workspace: PathBuf,
}

/// Writes `STATE/role-eval/policy.toml` (mode 0600) and makes the
/// evaluators' workspace, then runs every later evaluation of this
/// process in a sandbox (the daemon; `role test` and `check` run the
/// operator's scripts without one).
pub fn sandbox_in(state_dir: &std::path::Path, launch: EvalLaunch) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let program = PROGRAM
        .get()
        .ok_or_else(|| std::io::Error::other("no evaluator program is set"))?;
    let dir = state_dir.join("role-eval");
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let workspace = workspace.canonicalize()?;
    let source = toml::Value::String(program.display().to_string());
    let text = format!(
        "# Written by the daemon at each start: the sandbox of script roles' evaluators.\n\
         version = 1\nextends = \"upstream\"\n\n[filesystem]\n\
         binds_add = [{{ source = {source}, mode = \"ro\" }}]\n\n\
         # Its own RLIMIT_CPU and RLIMIT_AS and the daemon's kill bound it\n\
         # where the host gives the launcher no cgroups.\n\
         [cgroup]\nenforcement = \"best-effort\"\n"
    );
    let policy = dir.join("policy.toml");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&policy)?;
    file.write_all(text.as_bytes())?;
    let _ = SANDBOX.set(EvalSandbox {
        launch,
        policy,
        workspace,
    });
    Ok(())
}

/// The evaluator's command: in its sandbox when the daemon set one.
fn command(program: &std::path::Path) -> Command {
    let Some(sandbox) = SANDBOX.get() else {
        let mut command = Command::new(program);
        command.arg("__role-eval").env_clear();
        return command;
    };
    let launch = &sandbox.launch;
    let mut command = Command::new(&launch.launcher);
    command
        .arg("--policy")
        .arg(&sandbox.policy)
        .args(["--backend", &launch.backend, "--agent-id", "role-eval"])
        .arg("--workspace")
        .arg(&sandbox.workspace)
        .args(["--tty", "never"])
        .args(["--die-with-parent", &std::process::id().to_string()]);
    if let Some(parent) = &launch.cgroup_parent {
        command.arg("--cgroup-parent").arg(parent);
    }
    command
        .arg("--")
        .arg(program)
        .arg("__role-eval")
        .env_clear();
    command
}

/// One evaluation, as the daemon sends it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub role: String,
    pub source: String,
    pub config: Value,
    pub timeout_ms: u64,
    pub memory_bytes: usize,
    pub context_calls: u32,
    pub job: Job,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Job {
    /// Run the top level; answer what it declares.
    Load,
    Resolve {
        args: RoleArgs,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Info(RoleInfo),
    Prompt(RolePrompt),
}

/// A line the evaluator writes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FromChild {
    Context(Call),
    Done(Result<Answer, RoleError>),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Call {
    Team,
    Inbox,
    Inspect(String),
}

impl Request {
    fn limits(&self) -> LuaLimits {
        LuaLimits {
            timeout: Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_bytes,
            context_calls: self.context_calls,
        }
    }

    fn timeout(&self) -> RoleError {
        RoleError::Timeout {
            role: self.role.clone(),
            ms: self.timeout_ms,
        }
    }
}

/// Evaluations running now, and the wait for one to end.
static RUNNING: Mutex<usize> = Mutex::new(0);
static ENDED: Condvar = Condvar::new();

/// A place among the `MAX_PROCESSES`, given back when dropped.
struct Place;

impl Place {
    fn take(role: &str, wait: Duration) -> Result<Self, RoleError> {
        let until = Instant::now() + wait;
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        while *running >= MAX_PROCESSES {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RoleError::Busy {
                    role: role.to_string(),
                });
            }
            running = ENDED
                .wait_timeout(running, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *running += 1;
        Ok(Place)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        *running = running.saturating_sub(1);
        ENDED.notify_one();
    }
}

/// Evaluates `request` in a process of its own, `team` answering its
/// context calls. Returns within its time limit (after a wait of at most
/// that long for a place), `START_SLACK` and the kill's `KILL_GRACE`,
/// whatever the script does.
pub fn evaluate(
    request: &Request,
    team: Option<Arc<dyn TeamContext>>,
) -> Result<Answer, RoleError> {
    let failed = |message: String| RoleError::Script {
        role: request.role.clone(),
        message,
    };
    let program = PROGRAM
        .get()
        .ok_or_else(|| failed("no evaluator for script roles is set".into()))?;
    let limit = Duration::from_millis(request.timeout_ms);
    let _place = Place::take(&request.role, limit)?;
    // One socket for both directions: written with MSG_NOSIGNAL, an
    // evaluator killed mid-request is an error here, never a SIGPIPE.
    let start = |e: std::io::Error| failed(format!("cannot start the evaluator: {e}"));
    let (ours, theirs) = UnixStream::pair().map_err(start)?;
    // Past the kill and its grace, whatever still holds the other end.
    let bound = limit + START_SLACK + 2 * KILL_GRACE;
    ours.set_read_timeout(Some(bound)).map_err(start)?;
    ours.set_write_timeout(Some(bound)).map_err(start)?;
    let theirs = OwnedFd::from(theirs);
    let mut child = command(program)
        .process_group(0)
        .stdin(Stdio::from(theirs.try_clone().map_err(start)?))
        .stdout(Stdio::from(theirs))
        .stderr(Stdio::piped())
        .spawn()
        .map_err(start)?;
    let said = child.stderr.take().map(first_words);
    let killed = Arc::new(AtomicBool::new(false));
    let stop = watchdog(&child, limit + START_SLACK, killed.clone());
    let outcome = converse(request, team, &ours);
    // Waited for before the watchdog stops: an evaluator that answered
    // and lingers is still ended at the limit.
    let status = child.wait();
    drop(stop);
    match outcome {
        Some(done) => done,
        None if killed.load(Ordering::Acquire) => Err(request.timeout()),
        None => {
            let e = ended(request, status);
            // For the operator: what the evaluator or its launcher said
            // (it may name host paths, so never in the error itself),
            // escaped as Debug text for a terminal.
            let said = said.and_then(|rx| rx.recv_timeout(Duration::from_millis(100)).ok());
            tracing::warn!(role = %request.role, error = %e, said = ?said.unwrap_or_default(), "a script role's evaluator ended without an answer");
            Err(e)
        }
    }
}

/// The first 4 KiB the evaluator (or its launcher) writes on stderr, read
/// on a thread of its own (a descendant may hold the pipe open).
fn first_words(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.take(4096).read_to_end(&mut bytes);
        let _ = tx.send(String::from_utf8_lossy(&bytes).trim().to_string());
    });
    rx
}

/// What an evaluator that ended without an answer ran into: its signal,
/// or the launcher's status for it (128 + the signal).
fn ended(request: &Request, status: std::io::Result<std::process::ExitStatus>) -> RoleError {
    use nix::sys::signal::Signal;
    let signal = status
        .as_ref()
        .ok()
        .and_then(|s| s.signal().or_else(|| s.code().map(|c| c - 128)));
    match signal {
        // RLIMIT_CPU.
        Some(n) if n == Signal::SIGXCPU as i32 => request.timeout(),
        // An allocation over RLIMIT_AS aborts.
        Some(n) if n == Signal::SIGABRT as i32 => RoleError::Memory {
            role: request.role.clone(),
            bytes: request.memory_bytes,
        },
        _ => RoleError::Script {
            role: request.role.clone(),
            message: format!(
                "the evaluator ended without an answer ({}; the daemon's log says more)",
                match &status {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                }
            ),
        },
    }
}

/// At `after`, unless the returned sender is dropped first: SIGTERM to
/// the evaluator (a launcher then ends its sandbox and removes its
/// groups), and SIGKILL to its process group if it has not ended within
/// `KILL_GRACE`.
fn watchdog(
    child: &Child,
    after: Duration,
    killed: Arc<AtomicBool>,
) -> std::sync::mpsc::Sender<()> {
    use nix::sys::signal::{Signal, kill, killpg};
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(after) {
            killed.store(true, Ordering::Release);
            let _ = kill(pid, Signal::SIGTERM);
            if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(KILL_GRACE) {
                let _ = killpg(pid, Signal::SIGKILL);
            }
        }
    });
    tx
}

/// Sends the request, answers context calls, reads the answer; None when
/// the evaluator ended (or was killed) first.
fn converse(
    request: &Request,
    team: Option<Arc<dyn TeamContext>>,
    socket: &UnixStream,
) -> Option<Result<Answer, RoleError>> {
    let mut lines = BufReader::new(socket);
    let line = serde_json::to_string(request).ok()?;
    send_line(socket, &line).ok()?;
    let mut calls = 0u32;
    loop {
        let line = read_line(&mut lines)?;
        match serde_json::from_str::<FromChild>(&line).ok()? {
            FromChild::Done(done) => return Some(done),
            FromChild::Context(call) => {
                calls += 1;
                if calls > request.context_calls {
                    return Some(Err(RoleError::Script {
                        role: request.role.clone(),
                        message: format!(
                            "more than {} context calls (the role's mcp.tool_steps_per_turn)",
                            request.context_calls
                        ),
                    }));
                }
                let answer = answer(team.as_deref(), call);
                send_line(socket, &answer.to_string()).ok()?;
            }
        }
    }
}

/// Writes `line` and a newline without SIGPIPE.
fn send_line(socket: &UnixStream, line: &str) -> std::io::Result<()> {
    use rustix::net::{SendFlags, send};
    let mut bytes = format!("{line}\n").into_bytes();
    let mut rest = bytes.as_mut_slice();
    while !rest.is_empty() {
        match send(socket, &*rest, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &mut rest[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn answer(team: Option<&dyn TeamContext>, call: Call) -> Value {
    let Some(team) = team else {
        return Value::Null;
    };
    match call {
        Call::Team => team.team(),
        Call::Inbox => team.inbox(),
        Call::Inspect(name) => team.inspect(&name).unwrap_or(Value::Null),
    }
}

/// One line of at most `MAX_LINE` bytes; None at its end or past the bound.
fn read_line(input: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    let read = input.by_ref().take(MAX_LINE).read_line(&mut line).ok()?;
    (read > 0 && line.ends_with('\n')).then_some(line)
}

/// `__role-eval`: the evaluator's side. Reads one request on stdin, limits
/// its own process (RLIMIT_CPU, RLIMIT_AS, no core dump), evaluates, writes
/// the answer on stdout. Only ever run in a process of its own: never call
/// it in the daemon's.
pub fn serve_stdio() -> u8 {
    let mut input = BufReader::new(std::io::stdin());
    let Some(line) = read_line(&mut input) else {
        return 2;
    };
    let Ok(request) = serde_json::from_str::<Request>(&line) else {
        return 2;
    };
    if limit_self(&request).is_err() {
        return 2;
    }
    let output = Arc::new(Mutex::new(std::io::stdout()));
    let team = Arc::new(PipeTeam {
        input: Mutex::new(input),
        output: output.clone(),
    });
    let done = run(&request, team);
    let Ok(line) = serde_json::to_string(&FromChild::Done(done)) else {
        return 2;
    };
    let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        return 2;
    }
    0
}

fn run(request: &Request, team: Arc<PipeTeam>) -> Result<Answer, RoleError> {
    let role = LuaRole::from_source(
        &request.role,
        request.source.as_str().into(),
        request.config.clone(),
        request.limits(),
    )?;
    match &request.job {
        Job::Load => Ok(Answer::Info(role.info)),
        Job::Resolve { args } => role.resolve(args, team).map(Answer::Prompt),
    }
}

/// The evaluator's own limits: CPU seconds past the time limit end it
/// (SIGXCPU), its address space is the script's memory limit and room
/// for the program, it writes no core.
fn limit_self(request: &Request) -> nix::Result<()> {
    use nix::sys::resource::{Resource, setrlimit};
    let cpu = request.timeout_ms.div_ceil(1000) + 1;
    setrlimit(Resource::RLIMIT_CPU, cpu, cpu + 1)?;
    let bytes = u64::try_from(request.memory_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(AS_HEADROOM);
    setrlimit(Resource::RLIMIT_AS, bytes, bytes)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
}

/// The team, asked of the daemon over the pipes.
struct PipeTeam {
    input: Mutex<BufReader<std::io::Stdin>>,
    output: Arc<Mutex<std::io::Stdout>>,
}

impl PipeTeam {
    fn ask(&self, call: Call) -> Option<Value> {
        let line = serde_json::to_string(&FromChild::Context(call)).ok()?;
        {
            let mut out = self.output.lock().unwrap_or_else(|p| p.into_inner());
            writeln!(out, "{line}").and_then(|()| out.flush()).ok()?;
        }
        let mut input = self.input.lock().unwrap_or_else(|p| p.into_inner());
        let reply = read_line(&mut *input)?;
        serde_json::from_str(&reply).ok()
    }
}

impl TeamContext for PipeTeam {
    fn team(&self) -> Value {
        self.ask(Call::Team).unwrap_or(Value::Array(Vec::new()))
    }
    fn inbox(&self) -> Value {
        self.ask(Call::Inbox).unwrap_or(Value::Null)
    }
    fn inspect(&self, name: &str) -> Option<Value> {
        self.ask(Call::Inspect(name.to_string()))
            .filter(|v| !v.is_null())
    }
}
