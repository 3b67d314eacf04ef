//! `substrat-oci`: the runtime-spec's command line (`create`, `start`,
//! `state`, `kill`, `delete`, `features`) over substrat's native sandbox.
//!
//! `create` checks the bundle, then starts a launcher (this program again,
//! `launch`), which builds the sandbox and waits for it; `create` returns
//! once the sandbox is built and its command waits at the gate. `start`
//! opens the gate. The launcher's pid is the container's: its exit code is
//! the command's, so an engine that waits for it (conmon, a containerd
//! shim) sees the container end.

#![forbid(unsafe_code)]

mod argv;
mod exec_cmd;
mod launch;
mod launcher;
mod lifecycle;
mod log;
mod operator;
mod orphan;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "substrat-oci",
    version,
    about = "An OCI runtime over substrat's sandbox: podman --runtime, containerd's runc shim (BinaryName), Kubernetes RuntimeClass"
)]
struct Cli {
    /// Where containers' records are kept.
    #[arg(long, global = true, default_value = substrat_oci::state::DEFAULT_ROOT)]
    root: PathBuf,
    /// Errors also go to this file (engines read it).
    #[arg(long, global = true)]
    log: Option<PathBuf>,
    /// `text` or `json` (one object per line, as runc writes).
    #[arg(long, global = true, default_value = "text")]
    log_format: log::Format,
    /// The operator's configuration: policies on top of every container,
    /// run reports (docs/oci.md). Default /etc/substrat/oci.toml,
    /// when present.
    #[arg(long, global = true, env = "SUBSTRAT_OCI_CONFIG")]
    config: Option<PathBuf>,
    /// Accepted for engines that always pass it; changes nothing.
    #[arg(long, global = true)]
    debug: bool,
    /// The systemd cgroup driver: not supported (refused at create).
    #[arg(long, global = true)]
    systemd_cgroup: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a container from a bundle; its process waits for `start`.
    Create(launch::CreateArgs),
    /// Start a created container's process.
    Start { id: String },
    /// Print a container's state (runtime-spec JSON).
    State { id: String },
    /// Signal a container: TERM, KILL, INT and QUIT end all of its
    /// processes (SIGKILL); any other is delivered to its process.
    Kill {
        /// A delivered signal goes to every process of the container; with
        /// `--all`, a stopped container is no error (as runc: nothing is
        /// left to end).
        #[arg(long, short)]
        all: bool,
        id: String,
        /// A signal by name (with or without SIG) or number, 1 to 31.
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Remove a stopped container's record (`--force`: end it first).
    Delete {
        #[arg(long, short)]
        force: bool,
        id: String,
    },
    /// New cgroup limits for a running container (runc's flags).
    Update(lifecycle::UpdateArgs),
    /// Freeze every process of a container.
    Pause { id: String },
    /// Thaw a paused container.
    Resume { id: String },
    /// Run another process in a running container, confined as its own.
    Exec(exec_cmd::ExecArgs),
    /// The launcher `exec --detach` starts (internal).
    #[command(hide = true)]
    ExecLaunch(exec_cmd::ExecLaunchArgs),
    /// The container's processes (host pids), as runc prints them.
    Ps {
        /// `table` (a PID column) or `json` (an array of pids).
        #[arg(long, short, default_value = "table")]
        format: launch::PsFormat,
        id: String,
    },
    /// What this runtime supports (runtime-spec features document).
    Features,
    /// What ends a launcher whose `create` died (internal).
    #[command(hide = true)]
    CreateWatch { id: String },
    /// The launcher `create` starts (internal).
    #[command(hide = true)]
    Launch(launch::LaunchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logger = log::Logger::new(cli.log.clone(), cli.log_format);
    logger.log_panics();
    if matches!(cli.command, Command::Launch(_) | Command::ExecLaunch(_)) {
        // A launcher outlives the engine's call: a descriptor the engine
        // leaked into it (a pipe's write end) would keep the engine from
        // its end of file for the container's life. None is passed on
        // purpose but the create watcher's pipe, which the launcher names
        // itself on (`--watch-fd`): create and exec reach it by path.
        let keep: Vec<i32> = match &cli.command {
            Command::Launch(args) => args.watch_fd.into_iter().collect(),
            _ => Vec::new(),
        };
        if let Err(e) = substrat_sandbox::close_inherited_fds(&keep) {
            logger.error(&format!(
                "launcher: cannot close inherited descriptors: {e}"
            ));
            return ExitCode::from(125);
        }
    }
    // Read only by the commands that build a plan: a broken configuration
    // never stops `state`, `kill` or `delete` of what already runs.
    let operator = || operator::Operator::load(cli.config.as_deref());
    let result = match &cli.command {
        Command::Create(args) => operator().and_then(|operator| {
            for note in &operator.skipped {
                logger.info(note);
            }
            launch::create(&cli.root, args, cli.systemd_cgroup, &operator, &logger)
        }),
        Command::Start { id } => launch::start(&cli.root, id),
        Command::State { id } => launch::state(&cli.root, id),
        Command::Kill { id, signal, all } => lifecycle::kill(&cli.root, id, signal, *all),
        Command::Delete { id, force } => launch::delete(&cli.root, id, *force),
        Command::Update(args) => operator().and_then(|o| lifecycle::update(&cli.root, args, &o)),
        Command::Pause { id } => lifecycle::pause(&cli.root, id),
        Command::Resume { id } => lifecycle::resume(&cli.root, id),
        Command::Ps { id, format } => launch::ps(&cli.root, id, *format),
        Command::Exec(args) => {
            match operator().and_then(|o| exec_cmd::exec(&cli.root, args, &o, &logger)) {
                Ok(code) => return code,
                Err(e) => Err(e),
            }
        }
        Command::ExecLaunch(args) => {
            return exec_cmd::exec_launch(&cli.root, args, cli.config.as_deref(), &logger);
        }
        Command::Features => launch::features(),
        Command::CreateWatch { id } => {
            orphan::watch(&cli.root, id);
            return ExitCode::SUCCESS;
        }
        Command::Launch(args) => {
            return launcher::launch(&cli.root, args, cli.config.as_deref(), &logger);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logger.error(&format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
