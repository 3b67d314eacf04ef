//! The helper bwrap runs inside its sandbox (`substrat-init`): its
//! arguments and configuration (from descriptors the launcher passes), and
//! what it does there: Landlock after bwrap's mounts, rlimits, a report to
//! the launcher, the proxy bridge, then the command.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use serde::{Deserialize, Serialize};

use crate::inside::{SetupError, apply_rlimits, errno, exec_command, setup_report};
use crate::mounts::MountReport;
use crate::plan::{LandlockPlan, LaunchPlan, RlimitSetting};
use crate::supervise::{RlimitFallback, SETUP_FAILED, SetupReport, Status, send};
use crate::sys;

use super::argv::BwrapFeatures;

/// The helper's file name, looked up beside the launcher's own executable.
pub const HELPER_NAME: &str = "substrat-init";

/// The version both of the launcher/helper pair must have. Together with
/// the configuration's strict fields (an added or removed field fails to
/// parse), a helper from another build refuses instead of applying part of
/// a plan.
pub const HELPER_BUILD: &str = env!("CARGO_PKG_VERSION");

/// The helper's command line: `--status-fd FD --config-fd FD -- COMMAND...`,
/// exactly as `bwrap_argv` writes it. The configuration comes through a
/// descriptor, not an argument: bwrap's pid 1 shows its own command line,
/// the helper's included, to every process in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperArgs {
    pub status_fd: i32,
    pub config_fd: i32,
    pub command: Vec<String>,
}

impl HelperArgs {
    /// Parses the helper's arguments (without the program name). Strict:
    /// the launcher is the only caller, anything else is a mistake.
    pub fn parse(args: &[String]) -> Result<Self, HelperArgsError> {
        let number = |flag: &str, fd: &str| {
            fd.parse().map_err(|_| HelperArgsError::Descriptor {
                flag: flag.to_string(),
                value: fd.to_string(),
            })
        };
        match args {
            [
                flag_status,
                status,
                flag_config,
                config,
                dashes,
                command @ ..,
            ] if flag_status == "--status-fd" && flag_config == "--config-fd" && dashes == "--" => {
                if command.is_empty() {
                    return Err(HelperArgsError::NoCommand);
                }
                Ok(Self {
                    status_fd: number(flag_status, status)?,
                    config_fd: number(flag_config, config)?,
                    command: command.to_vec(),
                })
            }
            _ => Err(HelperArgsError::Shape),
        }
    }
}

/// Why the helper's command line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelperArgsError {
    #[error("{flag}: `{value}` is not a descriptor number")]
    Descriptor { flag: String, value: String },
    #[error("no command after `--`")]
    NoCommand,
    #[error("arguments are not `--status-fd FD --config-fd FD -- COMMAND...`")]
    Shape,
}

/// What the helper needs to do its part, passed as one JSON argument.
/// Strict both ways: the launcher and the helper are separate files, and a
/// helper from another build must refuse, not apply part of a plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperConfig {
    /// The launcher's `HELPER_BUILD`; the helper checks it is its own.
    pub build: String,
    pub landlock: LandlockPlan,
    pub rlimits: Vec<RlimitSetting>,
    /// Rlimits standing in for cgroup limits that could not be applied.
    pub fallback: RlimitFallback,
    /// bwrap was told to disable (and assert disabled) nested user
    /// namespaces; it does so in a parent namespace, so the sysctl inside
    /// does not show it.
    pub userns_disabled_by_bwrap: bool,
    /// The loopback ports bridged to sockets outside (proxy, gateway);
    /// bwrap has brought loopback up.
    #[serde(default)]
    pub bridges: Vec<crate::plan::BridgePlan>,
    /// The command takes its stdin, a pseudo-terminal, as its controlling
    /// terminal (`run -t`; bwrap's --new-session made it a session leader).
    #[serde(default)]
    pub terminal: bool,
    /// A warm sandbox: the descriptor of the control socket on which the
    /// helper serves turns (`turns`) instead of running the command.
    #[serde(default)]
    pub turns_fd: Option<i32>,
    /// The sandbox has an ipc namespace of its own: a warm sandbox's
    /// System V objects are removed after each turn.
    #[serde(default)]
    pub own_ipc: bool,
}

/// The helper's configuration for `plan`: what it needs to do its part.
pub fn helper_config(
    plan: &LaunchPlan,
    features: BwrapFeatures,
    fallback: RlimitFallback,
) -> HelperConfig {
    HelperConfig {
        build: HELPER_BUILD.into(),
        landlock: plan.landlock.clone(),
        rlimits: plan.rlimits.clone(),
        fallback,
        userns_disabled_by_bwrap: !plan.namespaces.nested_userns && features.disable_userns,
        bridges: plan.bridges().cloned().collect(),
        terminal: plan.terminal,
        turns_fd: None,
        own_ipc: plan.namespaces.ipc,
    }
}

/// Where the helper of the launcher at `program` is (`check --host` looks
/// there too).
pub fn helper_beside(program: &Path) -> PathBuf {
    program.with_file_name(HELPER_NAME)
}

/// What bwrap can exec: a regular file with an execute bit.
pub fn is_executable_file(metadata: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
}

/// The helper inside the bwrap sandbox (`substrat-init`):
/// Landlock after bwrap's mounts, no_new_privs, rlimits, a report to the
/// launcher, then the command. Never returns.
pub fn helper_main(args: &HelperArgs) -> ! {
    // Run as /proc/self/fd/N, the process would be named "N" in ps (and so
    // would the proxy bridge forked from it).
    let _ = nix::sys::prctl::set_name(c"substrat-init");
    // The command's environment (bwrap set it) is taken first: with a proxy
    // bridge, setup blanks this process's environment in memory.
    let env: Vec<(String, String)> = std::env::vars().collect();
    // The configuration is read before the descriptors are closed; an
    // error is reported once the status pipe is ours.
    let config = read_helper_config(args.config_fd);
    let parsed = config
        .as_ref()
        .ok()
        .and_then(|c| parse_helper_config(c).ok());
    let turns_fd = parsed.as_ref().and_then(|c| c.turns_fd);
    let own_ipc = parsed.is_some_and(|c| c.own_ipc);
    // Then keep nothing but the status pipe (and a warm sandbox's control
    // socket): the descriptor this helper was run from (a host file) and
    // anything else bwrap passed on must reach neither the proxy bridge
    // forked below nor the command.
    let status_fd = args.status_fd;
    let keep: Vec<i32> = std::iter::once(status_fd).chain(turns_fd).collect();
    if let Err(e) = sys::close_fds_except(&keep) {
        eprintln!("substrat-init: cannot close inherited descriptors: {e}");
        sys::exit_now(SETUP_FAILED)
    }
    let status = match sys::inherited_fd(status_fd) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("substrat-init: status descriptor {status_fd}: {e}");
            sys::exit_now(SETUP_FAILED)
        }
    };
    let _ = fcntl(status.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    let setup = config.and_then(|config| helper_setup(&config));
    let (bridges, terminal) = match setup {
        Ok((setup, bridges, terminal)) => {
            send(&status, &Status::Ready(Box::new(setup)));
            (bridges, terminal)
        }
        Err(e) => {
            send(&status, &Status::Failed(e.to_string()));
            sys::exit_now(SETUP_FAILED)
        }
    };
    drop(status);
    if let Some(fd) = turns_fd {
        serve_turns(fd, &env, &bridges, own_ipc)
    }
    // The bridges after Landlock (bwrap applied seccomp before us), each
    // forked twice so the command does not find an unknown child of its
    // own: a bridge is reparented to bwrap's pid 1 and ends with the
    // namespace.
    for (listener, socket) in bridges {
        use nix::unistd::ForkResult;
        match sys::fork() {
            Ok(ForkResult::Child) => match sys::fork() {
                Ok(ForkResult::Child) => crate::bridge::run(listener, socket, false),
                _ => sys::exit_now(0),
            },
            Ok(ForkResult::Parent { child }) => {
                let _ = nix::sys::wait::waitpid(child, None);
            }
            Err(e) => {
                eprintln!("substrat-init: bridge: fork: {e}");
                sys::exit_now(SETUP_FAILED)
            }
        }
    }
    exec_command(&args.command, &env, terminal, None)
}

/// A warm sandbox under bwrap: the helper, confined like the command it
/// would have run, serves turns (`turns::serve`) as native init does. It
/// hides itself (the control socket is out of the commands' reach) and is
/// a subreaper, so the processes a turn leaves come to it to be reaped.
fn serve_turns(fd: i32, env: &[(String, String)], bridges: &Bridges, own_ipc: bool) -> ! {
    let control = match sys::inherited_fd(fd) {
        Ok(control) => control,
        Err(e) => {
            eprintln!("substrat-init: control descriptor {fd}: {e}");
            sys::exit_now(SETUP_FAILED)
        }
    };
    let _ = fcntl(control.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    let ready = sys::conceal_process()
        .and_then(|()| nix::sys::prctl::set_child_subreaper(true))
        .map_err(|e| e.to_string());
    if let Err(e) = ready {
        eprintln!("substrat-init: cannot serve turns: {e}");
        sys::exit_now(SETUP_FAILED)
    }
    let context = crate::turns::TurnContext {
        env: env.to_vec(),
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        own_ipc,
        mqueue: None,
    };
    sys::exit_now(crate::turns::serve(&control, &context, bridges))
}

/// The configuration from its descriptor (at most 1 MiB: the launcher
/// writes a few kilobytes).
fn read_helper_config(fd: i32) -> Result<String, SetupError> {
    use std::io::Read;
    let fd = sys::inherited_fd(fd).map_err(|errno| SetupError::ConfigFd { fd, errno })?;
    let mut config = String::new();
    fs::File::from(fd)
        .take(1 << 20)
        .read_to_string(&mut config)
        .map_err(SetupError::ReadConfig)?;
    Ok(config)
}

type Bridges = Vec<(std::net::TcpListener, std::path::PathBuf)>;

/// The helper's configuration, refused when it comes from another build.
pub(super) fn parse_helper_config(config: &str) -> Result<HelperConfig, SetupError> {
    let config: HelperConfig =
        serde_json::from_str(config).map_err(|source| SetupError::ConfigJson {
            helper: HELPER_NAME,
            source,
        })?;
    if config.build != HELPER_BUILD {
        return Err(SetupError::OtherBuild {
            helper: HELPER_NAME,
            ours: HELPER_BUILD,
            theirs: config.build,
        });
    }
    Ok(config)
}

/// The setup, the bridges to fork, and whether the command takes the terminal.
fn helper_setup(config: &str) -> Result<(SetupReport, Bridges, bool), SetupError> {
    let config = parse_helper_config(config)?;
    let kernel_abi = sys::landlock_abi_version().unwrap_or(0);
    // The bridges' listeners before Landlock and before the command.
    let bridges = config
        .bridges
        .iter()
        .map(|b| Ok((crate::bridge::listen(b)?, b.socket.clone())))
        .collect::<Result<Bridges, SetupError>>()?;
    // The bridge must be out of the command's reach from its first
    // instruction: this process hides itself before forking it (the exec
    // of the command makes it an ordinary process again). Here, before the
    // report, so a failure is a failed setup.
    if !bridges.is_empty() {
        sys::conceal_process().map_err(errno("hide the helper and its bridges"))?;
    }
    // Landlock after every mount: bwrap has made them all.
    let landlock = crate::landlock::apply(&config.landlock, kernel_abi)?;
    nix::sys::prctl::set_no_new_privs().map_err(errno("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let rlimits = apply_rlimits(&config.rlimits, config.fallback);
    let nested_userns_blocked = config.userns_disabled_by_bwrap
        || fs::read_to_string("/proc/sys/user/max_user_namespaces").is_ok_and(|v| v.trim() == "0");
    // The launcher fills in the mounts: it made them, bwrap applied them.
    let report = setup_report(
        MountReport::default(),
        landlock,
        nested_userns_blocked,
        rlimits,
    );
    Ok((report, bridges, config.terminal))
}
