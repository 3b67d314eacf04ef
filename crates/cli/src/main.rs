#![forbid(unsafe_code)]
//! The `substrat-sandbox` command. Thin: parses arguments, calls the
//! libraries, prints, and maps outcomes to exit codes (0 ok, 1 findings at
//! or above --fail-on, 2 usage or input errors).

mod agent_args;
mod agent_cert;
mod agent_layer;
mod agent_text;
mod check;
mod cli_args;
mod cli_docs;
mod conformance;
mod daemon;
mod demo;
mod demo_cli;
mod prove;
mod providers;
mod proxy;
mod role_cli;
mod team_cli;
mod team_plan;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

pub use agent_args::{AgentArgs, AgentCommand};
use clap::{Parser, Subcommand, ValueEnum};
use cli_args::{parse_pool_size, parse_role_arg};
use substrat_cli::launch::{self, BackendArg, RunArgs};

const ABOUT: &str =
    "Run untrusted AI agent teams in per-agent sandboxes, and audit the policies that build them.";

const LONG_ABOUT: &str = "\
substrat-sandbox runs each AI agent inside its own sandbox (namespaces, seccomp, \
Landlock, resource limits) built from a TOML policy, and audits those policies.

Start here:
  substrat-sandbox check --host              what this machine can enforce
  substrat-sandbox check policies/           audit the shipped policies
  substrat-sandbox check --fail-on high P    fail CI when policy P has a high finding

Policies are documented in docs/policy.md, the audit rules in docs/check.md.";

#[derive(Debug, Parser)]
#[command(name = "substrat-sandbox", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Audit policies (and the host) for weaknesses; exit 1 on findings at or above --fail-on.
    #[command(long_about = check::LONG_HELP)]
    Check(CheckArgs),
    /// Run a command inside a sandbox built from a policy.
    #[command(long_about = launch::LONG_HELP)]
    Run(RunArgs),
    /// What `run` would do with these arguments, in words (or --json): every mount, Landlock, seccomp, limits and whether this host enforces them, the audit's findings. Nothing is started: `run --dry-run`.
    #[command(
        long_about = "What `run` would do with these arguments, in words (or --json): every \
mount with its mode, Landlock and this kernel's ABI, the seccomp profile's notable denials, limits \
and whether this host enforces them, the environment's names, the audit's findings. Nothing is \
started; the same as `run --dry-run`.\n\n\
Examples:\n  substrat-sandbox explain --policy worker\n  \
substrat-sandbox explain --policy strict --workspace ~/proj --json -- make test"
    )]
    Explain(RunArgs),
    /// Learn the least policy a command needs: run it observed in a sandbox, extend a base policy with what it used, check and replay before writing.
    #[command(long_about = substrat_cli::learn::LONG_HELP)]
    Learn(substrat_cli::learn::LearnArgs),
    /// Run the broker: agents' MCP tools on their own sockets, team rules, limits, durable state.
    #[command(
        long_about = "Run the broker: each agent's MCP tools on its own socket, the team's rules and \
limits, durable state in --state-dir, and the agents' turns in sandboxes built from their roles.\n\n\
Examples:\n  substrat-sandbox daemon &                                  # turns run cursor-agent when on PATH\n  \
substrat-sandbox daemon --provider stand-in --slots 4 &    # the scripted stand-in\n  \
substrat-sandbox daemon --policies ./roles --upstreams mcp.json &"
    )]
    Daemon(DaemonArgs),
    /// Spawn, list, inspect, message, suspend, resume, kill and remove agents (talks to the daemon).
    #[command(
        long_about = "Spawn, list, inspect, message, suspend, resume, kill and remove agents: \
requests to the daemon of --state-dir. Text for people; --json for programs.\n\n\
Examples:\n  substrat-sandbox agent spawn lead --workspace ~/proj \"Plan the refactor\"\n  \
substrat-sandbox agent list\n  substrat-sandbox agent inspect lead\n  \
substrat-sandbox agent send lead \"Also update the docs\"\n  substrat-sandbox agent inspect lead --json"
    )]
    Agent(AgentArgs),
    /// A live view of the team: agents, their turns, tokens, layers, upstreams; keys to suspend, resume, kill and read a diff.
    #[command(
        long_about = "A live view of the team the daemon of --state-dir serves, on a terminal: the \
agents as a tree with their state, the turn each is in and for how long, model tokens today against \
their role's budget, layer sizes and where each runs; the upstream servers' health; the selected \
agent's reasons, recent turns, last tool calls and messages (enter). Keys: arrows select, s \
suspends, r resumes, K kills (after y), d shows its diff, q quits.\n\n\
Examples:\n  substrat-sandbox top\n  substrat-sandbox top --state-dir /var/lib/substrat --interval 500"
    )]
    Top(top::TopArgs),
    /// Upstream MCP servers' tools: list them with their pins, approve a quarantined one, enable or disable a server.
    #[command(
        long_about = "Upstream MCP servers' tools (the daemon's --upstreams): list them with \
their pins, approve a quarantined one after reviewing its new definition, \
enable or disable a server (core servers are always loaded).\n\n\
Examples:\n  substrat-sandbox tools list\n  substrat-sandbox tools approve everything echo 3f9a1c0b27de\n  \
substrat-sandbox tools disable everything"
    )]
    Tools(ToolsArgs),
    /// Roles (seed 004's agents): list them, resolve one with arguments, write a template.
    #[command(
        long_about = "Roles are policies with a persona: a static system prompt, or a Lua script that \
resolves it from arguments and the team (docs/roles.md). `list` shows each role's description, \
tools, arguments and source; `test` resolves one as `prompts/get` would (with no team); `init` writes \
a commented template that passes `check`.\n\n\
Examples:\n  substrat-sandbox role list --policies ./roles\n  \
substrat-sandbox role test responder --policies ./roles --arg service=db\n  \
substrat-sandbox role init triage --lua --dir ./roles"
    )]
    Role(role_cli::RoleCliArgs),
    /// The team key and the team's certificate authority for relays on other hosts: `team key new FILE`, `team ca show|rotate|retire`.
    #[command(
        long_about = "The team key (every daemon of a team is given it, `daemon --team-key FILE`) and \
the team's certificate authority, held in the state database with its key sealed under the team key: \
relays on other hosts reach whichever daemon runs their agent with one certificate (docs/broker.md).\n\n\
Examples:\n  substrat-sandbox team key new /etc/substrat/team.key\n  \
substrat-sandbox team ca show\n  substrat-sandbox team ca rotate      # new certificates from a new authority; both trusted\n  \
substrat-sandbox team ca retire      # the old one refused, its certificates revoked"
    )]
    Team(team_cli::TeamArgs),
    /// Review, apply, discard or roll back a workspace layer (`run --workspace-mode overlay --keep-layer DIR`).
    #[command(
        long_about = "A workspace layer holds what a command wrote over its workspace in overlay \
mode (`run --workspace-mode overlay --keep-layer DIR`); the workspace itself is not written. Review \
it, take it, throw it away, or undo its last turns (each run over the layer is a turn).\n\n\
Apply skips set-id files, FIFOs, sockets, device nodes, symlinks out of the workspace and anything \
under a `.git` directory, and refuses everything when a path changed on the host since the agent's \
base (--force takes the agent's side).\n\n\
Examples:\n  substrat-sandbox run --policy worker --workspace-mode overlay --keep-layer ~/layers/fix -- make fix\n  \
substrat-sandbox workspace diff ~/layers/fix --stat\n  \
substrat-sandbox workspace diff ~/layers/fix | git apply --check\n  \
substrat-sandbox workspace apply ~/layers/fix src/\n  \
substrat-sandbox workspace rollback ~/layers/fix --turn 3\n  \
substrat-sandbox workspace discard ~/layers/fix"
    )]
    Workspace(substrat_cli::layer_commands::WorkspaceArgs),
    /// A sandboxed agent team end to end, with the stand-in agent: exit 0 only if every step happened.
    #[command(
        long_about = "A sandboxed agent team end to end: a daemon, a lead that spawns workers, \
a sync question, a broadcast, attacks that must fail. Exit 0 only if every step happened.\n\n\
Examples:\n  substrat-sandbox demo\n  substrat-sandbox demo --provider codex --keep"
    )]
    Demo {
        /// Keep the demo's workspace and state directory.
        #[arg(long)]
        keep: bool,
        /// The agent CLI the team runs: the stand-in (default), or a real one (claude, codex, gemini), which talks to the real model when its key is in the environment and to the scripted model otherwise.
        #[arg(long, value_enum, default_value_t = DemoProvider::StandIn)]
        provider: DemoProvider,
        /// With a real CLI: the model endpoint its API's requests go to, `API=URL` (anthropic, openai or gemini), as the daemon's --model-upstream; its key from the environment, else a placeholder.
        #[arg(long, value_name = "API=URL")]
        model_upstream: Option<String>,
        /// With a real CLI: the model the team asks for.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    #[command(
        long_about = "Print the shell completion script for SHELL.\n\nExamples:\n  substrat-sandbox completions bash > ~/.local/share/bash-completion/completions/substrat-sandbox\n  substrat-sandbox completions zsh > ~/.zfunc/_substrat-sandbox\n  substrat-sandbox completions fish > ~/.config/fish/completions/substrat-sandbox.fish\n\nscripts/install-shell-files installs them (and the man pages) where each shell looks."
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one page per command into --dir.
    Man {
        /// Write substrat-sandbox.1, substrat-sandbox-run.1... into DIR (e.g. /usr/local/share/man/man1).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Internal: the egress proxy of one `network = "proxy"` sandbox (started by the launcher).
    #[command(name = "__proxy", hide = true)]
    Proxy {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        agent: String,
        /// The rules as JSON (substrat_proxy::ProxyRules).
        #[arg(long)]
        rules: String,
        /// Append audit lines here (default: stderr).
        #[arg(long)]
        audit: Option<PathBuf>,
        /// Exit when this process (the launcher) is gone.
        #[arg(long)]
        parent: i32,
    },
    /// Internal: the first process of a `learn` run: loads the observing seccomp filter, hands its listener to the observer, executes the launcher.
    #[command(name = "__learn-exec", hide = true)]
    LearnExec {
        socket: PathBuf,
        #[arg(last = true, required = true)]
        program: Vec<std::ffi::OsString>,
    },
    /// Internal: the relay between the real terminal and a `run -t` command's pseudo-terminal (started by the launcher).
    #[command(name = "__tty-relay", hide = true)]
    TtyRelay,
    /// Internal: try to create a user namespace in this fresh process (used by `check --host`).
    #[command(name = "__probe-userns", hide = true)]
    ProbeUserns {
        /// Drop to the nobody user first when running as root.
        #[arg(long)]
        as_nobody: bool,
    },
    /// Internal: try to make an idmapped copy of the mounts at PATH in this
    /// fresh process (used by `check --host` as root).
    #[command(name = "__probe-idmap", hide = true)]
    ProbeIdmap { path: PathBuf },
    /// Internal: evaluate one script role request (stdin) in this fresh
    /// process, limited, and answer on stdout (started by the daemon).
    #[command(name = "__role-eval", hide = true)]
    RoleEval,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Policy files, directories of *.toml policies, or built-in policy names (worker, reviewer, strict).
    #[arg(value_name = "POLICY|DIR")]
    pub paths: Vec<PathBuf>,
    /// Also report what this host can enforce, and whether each policy can be enforced here.
    #[arg(long)]
    pub host: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Exit with 1 when a finding is at or above this severity.
    #[arg(long, value_enum, value_name = "SEVERITY")]
    pub fail_on: Option<FailOn>,
    /// Extra directory to look up `extends = "NAME"` in (after the policy's own directory).
    #[arg(long = "policy-dir", value_name = "DIR", env = "SUBSTRAT_POLICY_DIR")]
    pub policy_dirs: Vec<PathBuf>,
    /// Directory to look up seccomp profile names in before the built-in ones.
    #[arg(long = "seccomp-dir", value_name = "DIR", env = "SUBSTRAT_SECCOMP_DIR")]
    pub seccomp_dirs: Vec<PathBuf>,
    /// The daemon's upstream servers file: validate it, and with --state-dir judge each role's menu (UPS rules).
    #[arg(long, value_name = "FILE")]
    pub upstreams: Option<PathBuf>,
    /// A daemon's state directory: the upstream servers' tools as it last listed them.
    #[arg(long, value_name = "DIR", requires = "upstreams")]
    pub state_dir: Option<PathBuf>,
    /// Build each policy's sandbox on this host as `run` would and attack it from inside (substrat-probe battery): each attack held, escaped or not applicable; escapes and errors are findings (PRV rules) next to the static ones.
    #[arg(long)]
    pub prove: bool,
    /// With --prove: the backend to build the sandbox with.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// With --prove: attack a warm sandbox, as the daemon's warm turns run: the battery runs as a first turn (leaving its processes behind), then is judged as the second turn of the same sandbox.
    #[arg(long, requires = "prove")]
    pub warm: bool,
}

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// State directory (created with mode 0700). Default: ~/.substrat (with no home directory: daemon in $XDG_STATE_HOME/substrat, $XDG_RUNTIME_DIR/substrat or $TMPDIR/substrat-UID).
    #[arg(long, value_name = "DIR", env = "SUBSTRAT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Where the control socket and the agents' sockets live instead of the state directory (made 0700; the system unit's /run/substrat). The state directory records it: clients naming only --state-dir find the sockets.
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// The state database: `sqlite:PATH`, or `postgres://USER@HOST/DB` for PostgreSQL (docs/broker.md). Default: the configuration file's `state`, else sqlite:STATE_DIR/state.db. A password is better given in the environment (SUBSTRAT_STATE) than on the command line, which every user of the host can read.
    #[arg(
        long,
        value_name = "URL",
        env = "SUBSTRAT_STATE",
        hide_env_values = true
    )]
    pub state: Option<String>,
    /// With several daemons on one PostgreSQL database: how long this daemon's running turns stay its own without its heartbeat (given every third of it). After that the others fail them and adopt its agents (seconds; at least 5, the bound on one call to the database).
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease: u64,
    /// The log on stderr: lines for people (`text`), or one JSON object per line (`json`) with the agent, agent_id and turn of the turn an event happened in (`span`), the ids the audit log uses.
    #[arg(long, value_enum, default_value_t = substrat_cli::term::LogFormat::Text, env = "SUBSTRAT_LOG_FORMAT")]
    pub log_format: substrat_cli::term::LogFormat,
    /// Directory of role policies (*.toml; a file's stem is its role name). Default: ./policies when present, plus the built-in roles.
    #[arg(long, value_name = "DIR")]
    pub policies: Option<PathBuf>,
    /// The daemon's configuration file (TOML): roles written inline, [roles.NAME] and [roles.script.NAME] (docs/roles.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The agent CLI that runs an agent's turns unless it names another (`agent spawn --provider`): `auto` is cursor-agent when it is on PATH (else turns stay queued); `stand-in` is the scripted stand-in used by tests and the demo. Every CLI found on PATH (claude, codex, gemini, cursor-agent) can run agents' turns.
    #[arg(long, value_enum, default_value_t = ProviderArg::Auto)]
    pub provider: ProviderArg,
    /// Where the model gateway sends one API's requests: `anthropic=URL`, `openai=URL` or `gemini=URL` (repeatable). Default for each API whose key the daemon has: its public endpoint. The key is the daemon's ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY; it never enters a sandbox.
    #[arg(long, value_name = "API=URL")]
    pub model_upstream: Vec<String>,
    /// A host the gateway may reach over plain http although it is not this machine's loopback (a model server on a private network the operator vouches for). Only the operator can allow one: policies cannot.
    #[arg(long, value_name = "HOST")]
    pub model_destination: Vec<String>,
    /// The operator's private endpoints (TOML, `[[destination]]` with name, host, networks; docs/policy.md): names the proxies of `network = "proxy"` roles may reach although they resolve to the private addresses listed. Only the operator can name these: policies cannot.
    #[arg(long, value_name = "FILE")]
    pub destinations: Option<PathBuf>,
    /// The whole team's model requests per minute, through the gateway.
    #[arg(long, value_name = "N")]
    pub team_requests_per_minute: Option<u32>,
    /// The whole team's model tokens per day (UTC), through the gateway.
    #[arg(long, value_name = "N")]
    pub team_tokens_per_day: Option<u64>,
    /// The whole team's model requests at once, through the gateway (default 64); more wait for none: they are refused with 429.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub team_concurrent_model_requests: Option<u32>,
    /// With several daemons on one PostgreSQL database: the slots this daemon offers for placement (docs/broker.md#several-daemons): other daemons place new agents here only while fewer than N agents not failed run here. An offer, not a cap: agents made or adopted here count but are not refused. Without it, it takes no agents made elsewhere.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub max_agents: Option<u32>,
    /// A directory this daemon reaches as the team's other daemons do (a shared filesystem, at the same path): a new agent whose workspace is under one goes to the daemon with the most free slots among those declaring it (repeatable; resolved at start).
    #[arg(long, value_name = "DIR")]
    pub shared_path: Vec<PathBuf>,
    /// At most this many turns run at once; the others wait in the durable queue.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub slots: u16,
    /// Sandbox backend of every turn.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// A turn running longer is stopped and fails (seconds).
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub turn_timeout: u64,
    /// Keep each agent's sandbox between its turns and run each turn's provider inside it, confined as a cold launch (roles with a pid namespace and a direct workspace; others run cold). Its /tmp and what its processes wrote outside binds last until it is released.
    #[arg(long)]
    pub warm: bool,
    /// With --warm: release a sandbox after this long without a turn (seconds).
    #[arg(long, default_value_t = 300, value_name = "SECONDS", requires = "warm")]
    pub warm_idle: u64,
    /// With --warm: build COUNT sandboxes ahead for agents of ROLE, per workspace in use (the workspace of each agent able to spawn whose turn starts), so a new agent's first turn is warm too; repeat for several roles (docs/agents.md).
    #[arg(long, value_name = "ROLE=COUNT", value_parser = parse_pool_size, requires = "warm")]
    pub warm_pool: Vec<(String, usize)>,
    /// Run each turn as a container: `podman` or `containerd` with substrat-oci as its runtime and the role's policy on top (docs/oci.md); the same binds and confinement as substrat-run; its containers labelled with this daemon's id and removed at its start and stop. Default: substrat-run.
    #[arg(long, value_enum, value_name = "ENGINE", conflicts_with = "warm")]
    pub engine: Option<EngineArg>,
    /// With --engine containerd: containerd's socket.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub containerd_address: PathBuf,
    /// With --engine containerd: the containerd namespace of the turns' containers.
    #[arg(long, value_name = "NAME", default_value = "substrat")]
    pub containerd_namespace: String,
    /// Create the cgroups of the sandboxes it launches (turns, upstream servers) below this group.
    #[arg(long, value_name = "GROUP", env = "SUBSTRAT_CGROUP_PARENT")]
    pub cgroup_parent: Option<PathBuf>,
    /// Upstream MCP servers (mcp.json format with category, enabled, env_allow, policy, timeout_ms; docs/upstreams.md).
    #[arg(long, value_name = "FILE")]
    pub upstreams: Option<PathBuf>,
    /// Serve the roles' HTTP endpoints (GET /agents/list, POST /agents/NAME/prompt; docs/roles.md) on a loopback HOST:PORT or unix:PATH. Off by default; needs --roles-http-token-env.
    #[arg(long, value_name = "ADDR", requires = "roles_http_token_env")]
    pub roles_http: Option<String>,
    /// The variable of the daemon's environment holding the endpoints' bearer token.
    #[arg(long, value_name = "VAR", requires = "roles_http")]
    pub roles_http_token_env: Option<String>,
    /// Serve relays on other hosts over mutual TLS on HOST:PORT (docs/broker.md): each agent's relay shows the certificate `agent cert` issued it. Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen_tls: Option<std::net::SocketAddr>,
    /// A name (DNS or IP address) the relays reach this daemon by, for its certificate; repeat for more. The --listen-tls address counts unless it is 0.0.0.0 or ::.
    #[arg(long, value_name = "NAME", requires = "listen_tls")]
    pub tls_name: Vec<String>,
    /// The team key (`team key new FILE`; 0600, this account's): the relays' certificate authority is then the team's, in the state database with its key sealed, shared by every daemon given the key.
    #[arg(long, value_name = "FILE")]
    pub team_key: Option<PathBuf>,
}

/// A container engine turns can run through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    Podman,
    Containerd,
}

#[derive(Debug, clap::Args)]
pub struct ToolsArgs {
    /// The daemon's state directory. Default: ~/.substrat (with no home directory: as `daemon --help` says).
    #[arg(long, global = true, value_name = "DIR", env = "SUBSTRAT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ToolsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// Upstream servers (status, restarts), their tools and pins.
    List,
    /// Pin a quarantined tool's current definition, so it is listed again. HASH: the definition's hash as `tools list` shows it (at least 12 characters), so a definition that changed since it was reviewed is not approved.
    Approve {
        /// The upstream server, as named in the --upstreams file.
        server: String,
        /// The tool's name on that server.
        tool: String,
        /// The definition's hash (at least 12 characters).
        hash: String,
    },
    /// Start a disabled server now; remembered across daemon restarts (over the file's `enabled`).
    Enable {
        /// The upstream server, as named in the --upstreams file.
        server: String,
    },
    /// Stop a server now (its tools leave every menu); remembered across daemon restarts. A core server cannot be disabled.
    Disable {
        /// The upstream server, as named in the --upstreams file.
        server: String,
    },
    /// Authorize the daemon at a remote server with an `oauth` entry (grant authorization_code): prints the URL to open in a browser, waits (10 minutes at most) for the redirect to the daemon's loopback listener; the daemon stores the tokens (STATE/oauth/SERVER.json, readable by it only) and uses them at its next connect.
    Login {
        /// The upstream server, as named in the --upstreams file.
        server: String,
    },
    /// Revoke a server's OAuth tokens at its authorization server (where it has a revocation endpoint) and delete them.
    Logout {
        /// The upstream server, as named in the --upstreams file.
        server: String,
    },
    /// The broker's remote-server client as the MCP conformance suite's client under test (scripts/conformance): connects to URL as the daemon would, lists and calls tools as MCP_CONFORMANCE_SCENARIO expects.
    #[command(hide = true)]
    ConformanceClient {
        /// The scenario server's URL (the suite appends it).
        url: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoProvider {
    StandIn,
    Claude,
    Codex,
    Gemini,
}

impl DemoProvider {
    /// The real CLI's command name; none for the stand-in.
    fn cli(self) -> Option<&'static str> {
        match self {
            DemoProvider::StandIn => None,
            DemoProvider::Claude => Some("claude"),
            DemoProvider::Codex => Some("codex"),
            DemoProvider::Gemini => Some("gemini"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderArg {
    Auto,
    CursorAgent,
    Claude,
    Codex,
    Gemini,
    StandIn,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
    Sarif,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Script roles run in `__role-eval` of this same program.
    if let Ok(program) = std::env::current_exe() {
        substrat_broker::roles::eval::set_program(program);
    }
    if cli.command.prints_and_ends() {
        // Best effort: a failure leaves Rust's default (writes fail).
        let _ = substrat_sandbox::pipe_signal_default();
    }
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Run(args) => launch::run(&args, "substrat-sandbox run"),
        Command::Explain(args) => launch::run(
            &RunArgs {
                dry_run: true,
                ..args
            },
            "substrat-sandbox explain",
        ),
        Command::Learn(args) => substrat_cli::learn::learn(&args),
        Command::LearnExec { socket, program } => {
            match substrat_cli::learn::exec::main(&socket, &program) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("substrat-sandbox __learn-exec: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Daemon(args) => daemon::daemon(&args),
        Command::Agent(args) => daemon::agent(&args),
        Command::Top(args) => top::top(&args),
        Command::Demo {
            keep,
            provider,
            model_upstream,
            model,
        } => demo::exit_code(match provider.cli() {
            None if model_upstream.is_some() || model.is_some() => Err(anyhow::anyhow!(
                "--model-upstream and --model are for a real CLI (--provider claude, codex or gemini): the stand-in asks no model"
            )),
            None => demo::demo(keep),
            Some(cli) => demo_cli::demo(
                cli,
                &demo_cli::DemoOptions {
                    keep,
                    model_upstream,
                    model,
                },
            ),
        }),
        Command::Tools(ToolsArgs {
            command: ToolsCommand::ConformanceClient { url },
            ..
        }) => conformance::main(&url),
        Command::Tools(args) => daemon::tools(&args),
        Command::Role(args) => role_cli::role(&args),
        Command::Team(args) => team_cli::team(&args),
        Command::Workspace(args) => {
            let program = "substrat-sandbox workspace";
            match substrat_cli::layer_commands::workspace_main(args, program) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("{program}: {}", substrat_cli::term::error_text(&e));
                    ExitCode::from(2)
                }
            }
        }
        Command::Completions { shell } => cli_docs::completions(shell),
        Command::Man { dir } => cli_docs::man(dir.as_deref()),
        Command::Proxy {
            socket,
            agent,
            rules,
            audit,
            parent,
        } => proxy::main(&socket, &agent, &rules, audit.as_deref(), parent),
        Command::TtyRelay => substrat_cli::terminal::relay_main(),
        Command::ProbeUserns { as_nobody } => {
            probe_outcome(substrat_sandbox::userns_probe_child(as_nobody))
        }
        Command::ProbeIdmap { path } => {
            probe_outcome(substrat_sandbox::stage::idmap_probe_child(&path))
        }
        Command::RoleEval => ExitCode::from(substrat_broker::roles::eval::serve_stdio()),
    }
}

/// A probe child's result for its parent: success, or the reason on stdout.
fn probe_outcome<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            println!("{reason}");
            ExitCode::FAILURE
        }
    }
}
