//! The launcher: one command in a sandbox built from a policy. Shared by
//! `substrat-sandbox run` and `substrat-run` (the same launcher in a small
//! binary, which starts faster: docs/benchmarks.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use substrat_policy::load::named_policy_file;
use substrat_policy::model::NetworkMode;
use substrat_policy::{LoadOptions, LoadedPolicy, load_builtin, load_file};
use substrat_sandbox::backend::{self, BackendChoice};
use substrat_sandbox::bwrap::BwrapFeatures;
use substrat_sandbox::hostid::HostIds;
use substrat_sandbox::plan::{LaunchPlan, PROXY_SOCKET_INSIDE};

use substrat_sandbox::report::{RunReport, weaker_than_asked};
use substrat_sandbox::{
    Access, AgentBind, AgentContext, HomeMount, LaunchError, ProbeOptions, RunOptions, RunOutcome,
    build_plan, probe_host,
};

use crate::explain::Explanation;
use crate::terminal::{Terminal, TtyMode};
use crate::workspace_guard::{guard_workspace, home_mount, resolve_workspace};
use crate::workspace_layer::{LayerRequest, WorkspaceMode};

use clap::ValueEnum;

pub const LONG_HELP: &str = "\
Run one command inside a sandbox built from a policy: new user, mount, pid, \
ipc, uts (and, with network = \"none\", network) namespaces; only the \
policy's binds visible; protected paths read-only; Landlock, no \
capabilities, no_new_privs, rlimits, cgroup limits, and the seccomp filter \
last.

stdin, stdout and stderr pass through, or, when all three are terminals \
(or with -t), the command gets a pseudo-terminal of its own with job \
control: Ctrl-C then reaches its foreground job. The exit status is the \
command's (128+N when it dies of signal N), 127 when the command is not \
found, 2 when the sandbox cannot be built as the policy asks (nothing is \
run then). Without a terminal, Ctrl-C or SIGTERM ends the whole sandboxed \
tree; so does the launcher's death.

Examples:
  substrat-sandbox run --policy worker -- sh -c 'id; ls /'
  substrat-sandbox run --policy strict --workspace ~/proj --report - -- make test";

const EXIT_SETUP: u8 = 2;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Policy file or built-in policy name (worker, reviewer, strict).
    #[arg(long, value_name = "POLICY")]
    pub policy: String,
    /// The agent's workspace: bound at the same path, the command starts there. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Agent id (expands `${AGENT_ID}` in the policy; names the sandbox's cgroups).
    #[arg(long, value_name = "ID")]
    pub agent_id: Option<String>,
    /// Sandbox backend: `auto` uses native where this user can create user namespaces, else bwrap.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Create the sandbox's cgroups below this group (relative to each cgroup hierarchy), e.g. one delegated to you.
    #[arg(long, value_name = "GROUP", env = "SUBSTRAT_CGROUP_PARENT")]
    pub cgroup_parent: Option<PathBuf>,
    /// Write a JSON report of what was enforced to FILE (`-` for stderr).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Where `--policy NAME` and `extends = "NAME"` look for NAME.toml before the built-in policies (repeatable).
    #[arg(long = "policy-dir", value_name = "DIR", env = "SUBSTRAT_POLICY_DIR")]
    pub policy_dirs: Vec<PathBuf>,
    /// Where seccomp profile names are looked up before the built-in ones (repeatable).
    #[arg(long = "seccomp-dir", value_name = "DIR", env = "SUBSTRAT_SECCOMP_DIR")]
    pub seccomp_dirs: Vec<PathBuf>,
    /// The command's home (at $HOME inside, read-write, kept): default an empty private tmpfs, so tools that write ~/.cache or ~/.config work and the real home stays out. What the policy binds from the real home (`${HOME}/.gitconfig`...) appears inside it.
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Give the command a pseudo-terminal with job control: Ctrl-C reaches its foreground job (not the whole sandbox) and the window size follows. `auto`: when stdin and stdout are terminals.
    #[arg(long, value_enum, default_value_t = TtyMode::Auto, value_name = "WHEN")]
    pub tty: TtyMode,
    /// The same as `--tty always` (`-t`, `-i`, `-it`, as container tools spell it).
    #[arg(short = 't', short_alias = 'i', action = clap::ArgAction::Count)]
    pub terminal: u8,
    /// Run even in a workspace (or with a --home) that exposes more than a project (`/`, a home directory, a system directory, or one holding SSH keys, cloud credentials or shell startup files), which is refused otherwise.
    #[arg(long)]
    pub allow_workspace_risk: bool,
    /// How the command sees its workspace: `direct` (the host tree, read-write) or `overlay` (through a layer of its own: the host tree is not written until `workspace apply`; native backend only). Default: the policy's `filesystem.workspace_mode`.
    #[arg(long, value_enum, value_name = "MODE")]
    pub workspace_mode: Option<WorkspaceMode>,
    /// With `--workspace-mode overlay`: keep the layer in DIR (made if absent; each run over it is a turn), for `workspace diff|apply|discard|rollback DIR`. Without it the layer is thrown away after the run.
    #[arg(long, value_name = "DIR")]
    pub keep_layer: Option<PathBuf>,
    /// Print the policy's exposure score and its findings (as `check` would) before running. Without it, a high or critical finding still gets a one-line warning.
    #[arg(long)]
    pub explain: bool,
    /// Print what the launch would do (every mount with its mode, Landlock, seccomp, limits and whether this host enforces them, the environment's names, the audit's findings) and start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run (or `explain`): print JSON instead of words.
    #[arg(long)]
    pub json: bool,
    /// Internal (the daemon's turns): the workspace's contents were judged when the agent was made; its place never is waived and its path must still resolve to itself.
    #[arg(long, hide = true)]
    pub workspace_judged: bool,
    /// Internal (the daemon's turns): bind SOURCE at TARGET (MODE ro or rw) on top of the policy's mounts.
    #[arg(long = "agent-bind", hide = true, num_args = 3, value_names = ["MODE", "SOURCE", "TARGET"], action = clap::ArgAction::Append)]
    pub agent_binds: Vec<String>,
    /// With `network = "proxy"`: append the proxy's audit lines (one JSON object per decision) to FILE (default: stderr).
    #[arg(long, value_name = "FILE")]
    pub proxy_audit: Option<PathBuf>,
    /// With `network = "proxy"`: the operator's private endpoints (TOML, `[[destination]]` with name, host, networks; docs/policy.md) whose names may resolve to the private addresses listed. Policies cannot name these.
    #[arg(long, value_name = "FILE")]
    pub destinations: Option<PathBuf>,
    /// Internal (tests): the proxy lets loopback and private addresses through. A switch for tests, never taken from a policy.
    #[arg(long, hide = true)]
    pub proxy_test_allow_private: bool,
    /// Internal (tests): the proxy resolves NAME to ADDR instead of asking DNS. A switch for tests, never taken from a policy.
    #[arg(long = "proxy-test-host", hide = true, value_name = "NAME=ADDR", value_parser = crate::proxy_process::test_host)]
    pub proxy_test_hosts: Vec<(String, std::net::IpAddr)>,
    /// Internal (upstream servers): pass variable NAME from this environment besides the policy's allowlist.
    #[arg(long = "pass-env", hide = true, value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Internal (the daemon's turns): end the sandbox when process PID (the daemon) dies.
    #[arg(long, hide = true, value_name = "PID")]
    pub die_with_parent: Option<i32>,
    /// Where the command's own git directory is kept (the workspace's `.git` inside; default: $XDG_STATE_HOME/substrat/git/<hash of the workspace>, or ~/.local/state/..., or with no home $XDG_RUNTIME_DIR/substrat/... or $TMPDIR/substrat-UID/...). Take its commits with `git fetch DIR/repo BRANCH`.
    #[arg(long, value_name = "DIR")]
    pub git_state: Option<PathBuf>,
    /// Internal (scripts/bench-launch): print the configuration the bwrap backend would give its helper for this launch (as when every cgroup limit could be applied) and exit without running anything.
    #[arg(long, hide = true)]
    pub print_helper_config: bool,
    /// Internal (the daemon's warm sandboxes): connect to the SOCK_SEQPACKET socket SOCKET and, once the sandbox is built, run one command per turn request read from it (no COMMAND); the sandbox ends when SOCKET's side hangs up. Needs a pid namespace.
    #[arg(long, hide = true, value_name = "SOCKET")]
    pub serve_turns: Option<PathBuf>,
    /// The command and its arguments (with --dry-run: default `sh`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Auto,
    Native,
    Bwrap,
}

impl BackendArg {
    pub fn choice(self) -> BackendChoice {
        match self {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Native => BackendChoice::Native,
            BackendArg::Bwrap => BackendChoice::Bwrap,
        }
    }
}

/// Runs the launch; `program` prefixes its messages (`substrat-sandbox run`
/// or `substrat-run`).
pub fn run(args: &RunArgs, program: &str) -> ExitCode {
    match run_inner(args, program) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("{program}: {}", crate::term::error_text(&err));
            ExitCode::from(EXIT_SETUP)
        }
    }
}

/// A file, else `NAME.toml` in a `--policy-dir`, else a built-in name.
pub fn load_policy(spec: &str, options: &LoadOptions) -> Result<LoadedPolicy> {
    // A bare name is a name, never a file of the current directory (often
    // the agent's workspace, where it may have left one).
    let path = Path::new(spec);
    let is_path = spec.contains('/') || spec.ends_with(".toml");
    let loaded = if is_path {
        load_file(path, options)
    } else if let Some(file) = named_policy_file(spec, &options.policy_dirs) {
        load_file(&file, options)
    } else {
        match load_builtin(spec, options) {
            Some(loaded) => loaded,
            None => bail!(
                "policy {spec}: no such file, no {spec}.toml in a --policy-dir ({}), and not a \
                 built-in policy name (worker, reviewer, strict)",
                if options.policy_dirs.is_empty() {
                    "none given".to_string()
                } else {
                    options
                        .policy_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        }
    };
    loaded.map_err(|errors| anyhow::anyhow!("{errors}"))
}

/// `--agent-bind MODE SOURCE TARGET`, flattened by clap into triples.
fn agent_binds_from_args(flat: &[String]) -> Result<Vec<AgentBind>> {
    flat.chunks(3)
        .map(|triple| match triple {
            [mode, source, target] => {
                let access = match mode.as_str() {
                    "ro" => Access::Ro,
                    "rw" => Access::Rw,
                    other => bail!("--agent-bind: mode `{other}` is neither ro nor rw"),
                };
                let (source, target) = (PathBuf::from(source), PathBuf::from(target));
                if !source.is_absolute() || !target.is_absolute() {
                    bail!(
                        "--agent-bind: {} and {} must be absolute",
                        source.display(),
                        target.display()
                    );
                }
                Ok(AgentBind {
                    source,
                    target,
                    access,
                })
            }
            _ => bail!("--agent-bind takes MODE SOURCE TARGET"),
        })
        .collect()
}

/// The daemon's turns must not outlive it: the launcher asks for SIGKILL
/// when its parent dies (the sandbox follows the launcher), and checks the
/// parent is still the one named, in case it died before the request. A
/// warm sandbox's launcher asks for SIGTERM: between turns its sandbox is
/// frozen, and a frozen (v1) process dies of SIGKILL only once thawed,
/// which the launcher does on SIGTERM before it kills the sandbox.
fn die_with_parent(pid: i32, serves_turns: bool) -> Result<()> {
    use nix::sys::signal::Signal;
    let signal = if serves_turns {
        Signal::SIGTERM
    } else {
        Signal::SIGKILL
    };
    nix::sys::prctl::set_pdeathsig(signal).context("cannot set the parent-death signal")?;
    if nix::unistd::getppid().as_raw() != pid {
        bail!("the parent process {pid} is gone");
    }
    Ok(())
}

fn run_inner(args: &RunArgs, program: &str) -> Result<ExitCode> {
    check_launcher_args(args)?;
    let options = LoadOptions {
        policy_dirs: args.policy_dirs.clone(),
        seccomp_dirs: args.seccomp_dirs.clone(),
    };
    let policy = load_policy(&args.policy, &options)?;
    let workspace = resolve_workspace(args)?;
    guard_workspace(args, &policy, &workspace, program)?;
    let home_mount = home_mount(args)?;
    let agent_id = args.agent_id.clone().unwrap_or_else(default_agent_id);
    let mut agent_binds = agent_binds_from_args(&args.agent_binds)?;
    if args.dry_run {
        return dry_run(args, &policy, workspace, &agent_id, agent_binds, home_mount);
    }
    // The daemon audits its roles itself; its turns are not told each time.
    if args.die_with_parent.is_none() {
        crate::findings::tell(&policy, args.explain, program);
    }
    // Proxy mode: the proxy runs beside the sandbox, its socket bound in.
    let _proxy = start_proxy(args, &policy, &agent_id, &mut agent_binds)?;
    // Never host root: launched by root, the sandbox runs as a subordinate
    // id claimed for this launch (root inside maps to it).
    let host_ids = substrat_sandbox::hostid::for_this_launch()?;
    // The layer (overlay mode) locked for the run and its turn made; the
    // host tree is never written through it.
    let mut layer = crate::workspace_layer::prepare(LayerRequest {
        mode: WorkspaceMode::chosen(args.workspace_mode, &policy),
        keep: args.keep_layer.as_deref(),
        workspace: &workspace,
        quota: policy.policy.filesystem.layer_quota.map(|q| q.0),
        // The daemon's turns wait while an operator applies.
        wait: args.workspace_judged,
    })?;
    let mut ctx = agent_context(args, workspace, &agent_id, agent_binds, &host_ids);
    ctx.home_mount = home_mount;
    ctx.workspace_layer = layer.as_ref().map(|l| l.dirs());
    let mut plan = build_plan(&policy, &ctx)?;
    // Git repositories wherever the command can write: the workspace's own
    // `.git` replaced, the others read-only (crate::workspace_git).
    let mut git = crate::workspace_git::prepare(args.git_state.as_deref(), &plan, &ctx.workspace)?;
    if !git.is_empty() {
        let mut binds = git.binds();
        binds.append(&mut ctx.agent_binds);
        ctx.agent_binds = binds;
        plan = build_plan(&policy, &ctx)?;
    }
    if let Some(layer) = &mut layer {
        layer.refuse_if_visible(&plan)?;
        // A layer's turn is one launch; a warm sandbox would make its
        // turns one layer turn (rollback could not tell them apart).
        if args.serve_turns.is_some() {
            bail!(
                "--serve-turns does not serve an overlay workspace yet: its turns would be one layer turn"
            );
        }
    }
    if args.print_helper_config {
        return print_helper_config(&plan);
    }
    // Unprivileged: the files the overlay cannot change (crate::overlay_ids).
    if let Some(layer) = &mut layer {
        layer.tell_unmapped(&ctx.workspace, &host_ids, program);
    }
    let turns =
        match &args.serve_turns {
            Some(socket) => Some(substrat_sandbox::turns::connect(socket).with_context(|| {
                format!("--serve-turns: cannot connect to {}", socket.display())
            })?),
            None => None,
        };
    let options = RunOptions {
        name: agent_id.clone(),
        cgroup_parent: args
            .cgroup_parent
            .clone()
            .map(substrat_sandbox::cgroup::CgroupParent::Delegated),
        mount_point_record: git.mount_point_record(),
        host_ids,
        turns,
        ready: None,
        start_gate: None,
        share_namespaces: false,
        console: None,
        bind_judge: None,
    };
    // The pty last before the launch: from here the launcher's own stdio
    // is the command's terminal, until `finish` gives the real one back.
    let terminal = start_terminal(args, &mut plan, program)?;
    let launched = backend::launch(&plan, &options, args.backend.choice());
    if let Some(terminal) = terminal {
        terminal.finish();
    }
    crate::workspace_git::after_run(&mut git, program);
    // The turn kept, unless the launch failed (RunLayer::after_launch).
    if let Some(layer) = layer {
        layer.after_launch(&launched, git.agent_repo().as_deref(), program)?;
    }
    conclude(args, &plan, &ctx.home, launched, &options.host_ids, program)
}

/// `--print-helper-config` (scripts/bench-launch): the bwrap helper's
/// configuration for this plan, nothing run.
fn print_helper_config(plan: &LaunchPlan) -> Result<ExitCode> {
    let features = BwrapFeatures {
        disable_userns: true,
    };
    let config = substrat_sandbox::bwrap::helper_config(plan, features, Default::default());
    println!("{}", serde_json::to_string(&config)?);
    Ok(ExitCode::SUCCESS)
}

/// After the sandbox has ended: why it could not start, or its warnings,
/// the hint for a command only the host has, the report, the exit code.
fn conclude(
    args: &RunArgs,
    plan: &LaunchPlan,
    home: &Path,
    launched: Result<(RunOutcome, String), LaunchError>,
    host_ids: &HostIds,
    program: &str,
) -> Result<ExitCode> {
    let (outcome, backend_reason) = match launched {
        Ok(done) => done,
        Err(LaunchError::Setup(message) | LaunchError::UsernsUnavailable(message)) => {
            bail!("cannot build the sandbox: {message}")
        }
        // As a shell reports a command ended by a signal: 128 + it.
        Err(LaunchError::Terminated(signal)) => {
            eprintln!("{program}: stopped by signal {signal} before the sandbox was built");
            return Ok(ExitCode::from(u8::try_from(128 + signal).unwrap_or(255)));
        }
        Err(err) => return Err(err.into()),
    };
    for warning in weaker_than_asked(plan, &outcome) {
        let warning = substrat_policy::text::escape_text(&warning);
        eprintln!("{program}: warning: {warning}");
    }
    if outcome.exit_code == 127 {
        hint_not_found(args, plan, home, program);
    }
    if let Some(target) = &args.report {
        let report = RunReport::new(plan, &outcome, &backend_reason, host_ids);
        write_report(target, &report)?;
    }
    Ok(ExitCode::from(
        u8::try_from(outcome.exit_code).unwrap_or(255),
    ))
}

/// With `network = "proxy"`, the proxy beside the sandbox and its socket
/// bound in. The operator's destinations are read even when the policy has
/// no proxy: a bad file is an error the operator sees at once.
fn start_proxy(
    args: &RunArgs,
    policy: &LoadedPolicy,
    agent_id: &str,
    agent_binds: &mut Vec<AgentBind>,
) -> Result<Option<crate::proxy_process::ProxyProcess>> {
    let destinations = match &args.destinations {
        Some(path) => substrat_proxy::destinations::load(path)?,
        None => Vec::new(),
    };
    if policy.policy.network != NetworkMode::Proxy {
        return Ok(None);
    }
    let rules = policy.policy.proxy.clone().unwrap_or_default();
    let switches = substrat_proxy::TestSwitches {
        allow_private: args.proxy_test_allow_private,
        hosts: args.proxy_test_hosts.iter().cloned().collect(),
    };
    let audit = args.proxy_audit.as_deref();
    let proxy = crate::proxy_process::start(&rules, destinations, switches, agent_id, audit)?;
    agent_binds.push(AgentBind {
        source: proxy.socket.clone(),
        target: PROXY_SOCKET_INSIDE.into(),
        access: Access::Ro,
    });
    Ok(Some(proxy))
}

/// The command's pty when the plan asks for one: asked for (`-t`,
/// `--tty always`), failing to make it is an error; only guessed (`auto`),
/// the launch goes on without one, saying so.
fn start_terminal(
    args: &RunArgs,
    plan: &mut LaunchPlan,
    program: &str,
) -> Result<Option<Terminal>> {
    match Terminal::start_if(plan.terminal) {
        Ok(terminal) => Ok(terminal),
        Err(e) if args.terminal > 0 || args.tty == TtyMode::Always => {
            Err(e).context("cannot make a pseudo-terminal (--tty)")
        }
        Err(e) => {
            eprintln!("{program}: warning: running without a pseudo-terminal: {e}");
            plan.terminal = false;
            Ok(None)
        }
    }
}

/// Exit 127: the bind that would show a command only the host has.
fn hint_not_found(args: &RunArgs, plan: &LaunchPlan, home: &Path, program: &str) {
    let Some(name) = args.command.first() else {
        return;
    };
    let host_path = std::env::var_os("PATH");
    if let Some(hint) = crate::not_found::hint(plan, name, host_path.as_deref(), home) {
        eprintln!("{program}: {hint}");
    }
}

/// `--dry-run`: the plan `run` would launch, explained; nothing started
/// (the proxy's socket and the workspace's git directory are made at launch).
fn dry_run(
    args: &RunArgs,
    policy: &LoadedPolicy,
    workspace: PathBuf,
    agent_id: &str,
    mut agent_binds: Vec<AgentBind>,
    home_mount: HomeMount,
) -> Result<ExitCode> {
    if policy.policy.network == NetworkMode::Proxy {
        agent_binds.push(AgentBind {
            source: std::env::temp_dir().join("substrat-proxy-AT-LAUNCH/proxy.sock"),
            target: PROXY_SOCKET_INSIDE.into(),
            access: Access::Ro,
        });
    }
    let host_ids = substrat_sandbox::hostid::for_this_launch()?;
    let mut ctx = agent_context(args, workspace, agent_id, agent_binds, &host_ids);
    ctx.home_mount = home_mount;
    if ctx.argv.is_empty() {
        ctx.argv = vec!["sh".into()];
    }
    let plan = build_plan(policy, &ctx)?;
    let facts = probe_exe().map(|exe| probe_host(&ProbeOptions { probe_exe: exe }));
    let explanation = Explanation::new(&plan, policy, facts.as_ref(), &ctx.workspace);
    // Paths a policy names may come from a role, a script or an agent's
    // id: shown with their control characters escaped.
    if args.json {
        let json = serde_json::to_string_pretty(&explanation)?;
        println!("{}", substrat_policy::text::json_safe(json));
    } else {
        print!(
            "{}",
            substrat_policy::text::escape_lines(&explanation.to_text())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The program whose `__probe-*` commands probe this host: this one, or
/// `substrat-sandbox` beside it (substrat-run has no probes).
fn probe_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    if exe.file_name().is_some_and(|n| n == "substrat-sandbox") {
        return Some(exe);
    }
    let sibling = exe.with_file_name("substrat-sandbox");
    sibling.is_file().then_some(sibling)
}

/// What must hold before anything is read: no `..` in `--cgroup-parent`,
/// and a parent still alive when `--die-with-parent` names one.
fn check_launcher_args(args: &RunArgs) -> Result<()> {
    if args.serve_turns.is_some() {
        if !args.command.is_empty() || args.dry_run {
            bail!(
                "--serve-turns takes its commands from the turn requests: give no COMMAND and no --dry-run"
            );
        }
    } else if args.command.is_empty() && !args.dry_run {
        bail!("no command given: put it after `--` (e.g. `-- sh -c 'make test'`)");
    }
    if args.json && !args.dry_run {
        bail!("--json goes with --dry-run (run's own output is the command's)");
    }
    if let Some(parent) = &args.cgroup_parent
        && parent
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        bail!(
            "--cgroup-parent {}: `..` is not allowed (groups stay below the cgroup mount)",
            parent.display()
        );
    }
    if let Some(pid) = args.die_with_parent {
        die_with_parent(pid, args.serve_turns.is_some())?;
    }
    Ok(())
}

/// The agent's context for the plan: root inside maps to `host_ids`'
/// subordinate ids, or to the launching user.
fn agent_context(
    args: &RunArgs,
    workspace: PathBuf,
    agent_id: &str,
    agent_binds: Vec<AgentBind>,
    host_ids: &HostIds,
) -> AgentContext {
    let (uid, gid) = match host_ids.subordinate() {
        Some(ids) => (ids.uid, ids.gid),
        None => (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        ),
    };
    AgentContext {
        workspace,
        // A HOME that is not absolute (empty, relative) counts as none.
        home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/")),
        agent_id: agent_id.to_string(),
        host_env: std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
        uid,
        gid,
        // A warm sandbox's commands come with its turns; this names them
        // in its report.
        argv: match args.serve_turns {
            Some(_) => vec!["(the commands of its turns)".into()],
            None => args.command.clone(),
        },
        agent_binds,
        pass_env: args.pass_env.clone(),
        home_mount: HomeMount::None,
        workspace_layer: None,
        landlock_abi: substrat_sandbox::landlock::kernel_abi(),
        terminal: args.serve_turns.is_none() && (args.terminal > 0 || args.tty.wanted()),
    }
}

/// The run report to `target` (`-`: stderr).
fn write_report(target: &Path, report: &RunReport<'_>) -> Result<()> {
    // The report names what the command left (paths of its layer).
    let text = substrat_policy::text::json_safe(serde_json::to_string_pretty(report)?) + "\n";
    if target.as_os_str() == "-" {
        eprint!("{text}");
        return Ok(());
    }
    std::fs::write(target, text)
        .with_context(|| format!("cannot write report {}", target.display()))
}

/// A name for the sandbox's cgroups when no agent id is given.
fn default_agent_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("run-{}-{nanos:x}", std::process::id())
}
