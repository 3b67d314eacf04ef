//! `substrat-oci exec`: another process in a running container, confined
//! as its own process is (`substrat_sandbox::join`). With `--detach`, a
//! launcher of its own (this program again, `exec-launch`) runs it and its
//! pid is the exec's, whose exit code is the process's.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use anyhow::{Context, Result, bail};
use substrat_oci::exec::{exec_request, parse_process};
use substrat_oci::state::{self, Status};
use substrat_oci::translate::HostIds;

use crate::argv::flag;
use crate::launch::{translated, wait_for_answer, write_pid_file};
use crate::operator::Operator;

#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// The process to run (runtime-spec process JSON); without it, the
    /// command after the id, with the container's environment.
    #[arg(long, short)]
    process: Option<PathBuf>,
    /// Return once the process runs; its pid goes to --pid-file.
    #[arg(long, short)]
    detach: bool,
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// Where the terminal's master goes (SCM_RIGHTS, as for `create`).
    #[arg(long)]
    console_socket: Option<PathBuf>,
    /// A terminal (the command-line form; with --process, its
    /// `terminal` must say so too).
    #[arg(long, short)]
    tty: bool,
    /// The working directory (command-line form).
    #[arg(long)]
    cwd: Option<String>,
    /// NAME=VALUE added to the container's environment (command-line form).
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Refused when not 0: extra descriptors are not passed in.
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
    /// Accepted: no_new_privs is always set.
    #[arg(long)]
    no_new_privs: bool,
    /// Refused: the process gets no capability.
    #[arg(long = "cap", short = 'c')]
    caps: Vec<String>,
    id: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ExecLaunchArgs {
    #[command(flatten)]
    exec: ExecArgs,
    /// Where `exec --detach` waits for `ready`.
    #[arg(long)]
    notify: PathBuf,
}

fn refuse_unsupported(args: &ExecArgs) -> Result<()> {
    if args.preserve_fds > 0 {
        bail!("--preserve-fds: extra descriptors are not passed into the container");
    }
    if !args.caps.is_empty() {
        bail!("--cap: an exec gets no capability");
    }
    Ok(())
}

/// `exec`: in the foreground (this process waits and exits with the
/// process's code), or detached (a launcher does, its pid in --pid-file).
pub fn exec(
    root: &Path,
    args: &ExecArgs,
    operator: &Operator,
    logger: &crate::log::Logger,
) -> Result<ExitCode> {
    refuse_unsupported(args)?;
    if !args.detach {
        let code = run(root, args, operator, None)?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(125)));
    }
    let (dir, _) = running(root, &args.id)?;
    let socket = dir.join(format!("exec-{}.sock", std::process::id()));
    let listener =
        substrat_oci::sockets::bind(&socket).context("cannot listen for the exec's launcher")?;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    // Each option and its value one argument (`crate::argv`).
    if let Some(config) = &operator.path {
        command.arg(flag("--config", config));
    }
    command.arg(flag("--root", root)).args(logger.forward());
    command.arg("exec-launch").arg(flag("--notify", &socket));
    forward_args(&mut command, args);
    if args.console_socket.is_some() {
        // The process's stdio is its terminal: the launcher keeps none of
        // the engine's, whose end containerd's shim reads to the end of
        // file (runc exec's output) before it takes the terminal's master.
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    }
    let mut child = command
        .spawn()
        .context("cannot start the exec's launcher")?;
    let answer = wait_for_answer(&listener, &mut child);
    let _ = std::fs::remove_file(&socket);
    match answer {
        Ok(line) if line == "ready" => {}
        Ok(line) => {
            let _ = child.wait();
            bail!("{}", line.strip_prefix("failed: ").unwrap_or(&line));
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    }
    if let Some(pid_file) = &args.pid_file {
        write_pid_file(pid_file, i32::try_from(child.id())?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The arguments `exec-launch` needs to build the same request.
fn forward_args(command: &mut std::process::Command, args: &ExecArgs) {
    if let Some(process) = &args.process {
        command.arg(flag("--process", process));
    }
    if let Some(cwd) = &args.cwd {
        command.arg(flag("--cwd", cwd));
    }
    if let Some(socket) = &args.console_socket {
        command.arg(flag("--console-socket", socket));
    }
    if args.tty {
        command.arg("--tty");
    }
    for env in &args.env {
        command.arg(flag("--env", env));
    }
    command.arg("--").arg(&args.id).args(&args.command);
}

/// The detached exec's launcher: runs the process, says `ready` (or why
/// not) on the socket, exits with its code.
pub fn exec_launch(
    root: &Path,
    args: &ExecLaunchArgs,
    config: Option<&Path>,
    logger: &crate::log::Logger,
) -> ExitCode {
    let _ = nix::unistd::setsid();
    let mut notify = match substrat_oci::sockets::connect(&args.notify) {
        Ok(stream) => stream,
        Err(e) => {
            logger.error(&format!("exec launcher: cannot reach exec: {e}"));
            return ExitCode::from(125);
        }
    };
    match Operator::load(config)
        .and_then(|operator| run(root, &args.exec, &operator, Some(&notify)))
    {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(125)),
        Err(e) => {
            use std::io::Write;
            // Every error comes before `ready`: exec says it, unless it
            // cannot be told.
            if writeln!(notify, "failed: {e:#}").is_err() {
                logger.error(&format!("{e:#}"));
            }
            ExitCode::from(125)
        }
    }
}

fn running(root: &Path, id: &str) -> Result<(PathBuf, state::Record)> {
    let (dir, record) = state::load(root, id)?;
    let status = state::status(&dir, &record);
    if status != Status::Running {
        bail!("container `{id}` is not running");
    }
    Ok((dir, record))
}

/// Builds the request and runs it in the container's sandbox.
fn run(
    root: &Path,
    args: &ExecArgs,
    operator: &Operator,
    notify: Option<&UnixStream>,
) -> Result<i32> {
    let (_, record) = running(root, &args.id)?;
    // The container's plan with the same policies on top: the exec is
    // confined as the container's own process.
    let prepared = translated(
        root,
        &record.bundle,
        &record.id,
        HostIds { uid: 0, gid: 0 },
        operator,
        false,
    )?;
    if prepared.policies != record.policies {
        bail!(
            "container `{}` was created under the policies {:?}, and the operator's configuration \
             now names {:?}: an exec would not be confined as the container's process; refused",
            args.id,
            record.policies,
            prepared.policies
        );
    }
    let plan = prepared.translated.plan;
    let process = match &args.process {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let process = parse_process(&bytes)?;
            if args.tty && !process.terminal {
                bail!("--tty, and {} says terminal: false", path.display());
            }
            process
        }
        None => from_command_line(&record.bundle, args)?,
    };
    let request = exec_request(
        &process,
        &plan,
        args.console_socket.is_some(),
        &mut Vec::new(),
    )?;
    let init = state::first_child(record.pid)
        .and_then(state::first_child)
        .with_context(|| format!("container `{}`: its sandbox's init is gone", args.id))?;
    let ready = notify
        .map(|stream| stream.try_clone())
        .transpose()?
        .map(std::os::fd::OwnedFd::from);
    let console = match &args.console_socket {
        Some(path) => Some(crate::launcher::console(
            path,
            process.console_size.as_ref(),
        )?),
        None => None,
    };
    Ok(substrat_sandbox::join::exec_in(
        &plan,
        nix::unistd::Pid::from_raw(init),
        &request,
        console.as_ref(),
        ready.as_ref(),
    )?)
}

/// The container's own process with this command, working directory and
/// added variables.
fn from_command_line(bundle: &Path, args: &ExecArgs) -> Result<substrat_oci::spec::Process> {
    if args.command.is_empty() {
        bail!("exec needs --process FILE or a command after the container id");
    }
    let bytes = std::fs::read(bundle.join("config.json"))?;
    let mut process = substrat_oci::spec::parse(&bytes)?
        .process
        .context("the container's configuration has no process")?;
    process.args = args.command.clone();
    // The container's own terminal and size are not the exec's.
    process.terminal = args.tty;
    process.console_size = None;
    if let Some(cwd) = &args.cwd {
        process.cwd = cwd.clone();
    }
    for entry in &args.env {
        let name = entry.split_once('=').map_or(entry.as_str(), |(n, _)| n);
        process
            .env
            .retain(|e| e.split_once('=').map_or(e.as_str(), |(n, _)| n) != name);
        process.env.push(entry.clone());
    }
    Ok(process)
}
