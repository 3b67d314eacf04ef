//! Another process in a running native sandbox (`substrat-oci exec`),
//! confined exactly as its command was: the sandbox's cgroups and every one
//! of its namespaces (user last: the host's ones it shares belong to the
//! host's user namespace), its ids inside, no capability, then in a child
//! (the only one inside its pid namespace) Landlock, no_new_privs, rlimits
//! and seccomp from the same plan, in the order init applies them.
//!
//! The calling process (a fresh one, never a daemon's) joins everything
//! but the pid namespace itself and stays outside the sandbox's view: it
//! waits for the child, passes it the signals it gets, and returns its
//! exit code.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, pipe2};

use crate::console::Console;
use crate::inside::{SetupError, apply_rlimits, errno, exec_command};
use crate::landlock::RulePaths;
use crate::plan::LaunchPlan;
use crate::supervise::{LaunchError, RlimitFallback};
use crate::sys;

/// What to run in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// A terminal of the sandbox's devpts as its stdio and controlling
    /// terminal, its master sent to the console given to `exec_in`
    /// (`substrat-oci exec --tty --console-socket`).
    pub terminal: bool,
}

/// The namespaces joined, in order: the user namespace last.
const NAMESPACES: [(&str, CloneFlags); 7] = [
    ("net", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("mnt", CloneFlags::CLONE_NEWNS),
    ("user", CloneFlags::CLONE_NEWUSER),
];

/// Signals passed to the child as they come.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Runs `request` in the sandbox whose init is `init` (a host pid), built
/// from `plan`; `ready` is told `ready` once the program was executed.
/// A request for a terminal needs `console`, and only it has one.
/// Returns its exit code (128 + N for signal N).
pub fn exec_in(
    plan: &LaunchPlan,
    init: Pid,
    request: &ExecRequest,
    console: Option<&Console>,
    ready: Option<&OwnedFd>,
) -> Result<i32, LaunchError> {
    sys::require_single_thread().map_err(LaunchError::Threads)?;
    let setup = |e: SetupError| LaunchError::Setup(e.to_string());
    if request.terminal != console.is_some() {
        return Err(LaunchError::Setup(
            "a terminal for an exec needs a console socket, and a console socket a terminal".into(),
        ));
    }
    // Compiled on the host, as a launch compiles it; loaded last.
    let programs = crate::seccomp::export_plan(plan)
        .map_err(|e| LaunchError::Setup(e.to_string()))?
        .0;
    join_cgroups_of(init).map_err(setup)?;
    let namespaces = NAMESPACES
        .iter()
        .map(|(name, flag)| {
            let path = format!("/proc/{init}/ns/{name}");
            nix::fcntl::open(
                path.as_str(),
                nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map(|fd| (fd, *flag))
            .map_err(errno("open the sandbox's namespaces"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(setup)?;
    // No group of the host's: setgroups is denied in the sandbox's user
    // namespace, so they could not be dropped once inside.
    nix::unistd::setgroups(&[])
        .map_err(errno("setgroups"))
        .map_err(setup)?;
    for (fd, flag) in namespaces {
        setns(fd, flag)
            .map_err(errno("join the sandbox's namespaces"))
            .map_err(setup)?;
    }
    become_inside(plan).map_err(setup)?;
    run_child(plan, request, &programs, console, ready)
}

/// The ids inside, and no capability: the bounding set while CAP_SETPCAP is
/// held (joining the user namespace gave every capability in it), then the
/// ids, then every other set.
fn become_inside(plan: &LaunchPlan) -> Result<(), SetupError> {
    use caps::CapSet;
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(|source| SetupError::Capabilities {
            what: format!("drop {cap} from the bounding set:"),
            source,
        })?;
    }
    let gid = Gid::from_raw(plan.gid_map.inside);
    let uid = Uid::from_raw(plan.uid_map.inside);
    nix::unistd::setresgid(gid, gid, gid).map_err(errno("setresgid"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(errno("setresuid"))?;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|source| SetupError::Capabilities {
            what: format!("clear {set:?}"),
            source,
        })?;
    }
    Ok(())
}

/// Moves this process into every cgroup `init` is in (the sandbox's).
fn join_cgroups_of(init: Pid) -> Result<(), SetupError> {
    let io = |what| move |source| SetupError::Io { what, source };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(io("read mountinfo"))?;
    let mounts = crate::cgroupfs::parse_cgroup_mounts(&mountinfo);
    let groups = fs::read_to_string(format!("/proc/{init}/cgroup"))
        .map_err(io("read the sandbox's cgroups"))?;
    let me = std::process::id().to_string();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let mount = mounts.iter().find(|m| {
            if controllers.is_empty() {
                m.v2
            } else {
                !m.v2
                    && controllers
                        .split(',')
                        .any(|c| m.controllers.iter().any(|mc| mc == c))
            }
        });
        if let Some(mount) = mount {
            let group = mount.mount_point.join(path.trim_start_matches('/'));
            fs::write(group.join("cgroup.procs"), &me).map_err(io("join the sandbox's cgroups"))?;
        }
    }
    Ok(())
}

/// Forks the child that is confined and runs the program; passes it the
/// signals this process gets and waits for it.
fn run_child(
    plan: &LaunchPlan,
    request: &ExecRequest,
    programs: &[Vec<u8>],
    console: Option<&Console>,
    ready: Option<&OwnedFd>,
) -> Result<i32, LaunchError> {
    let mut signals = SigSet::empty();
    FORWARDED.iter().for_each(|s| signals.add(*s));
    signals.add(Signal::SIGCHLD);
    let mut previous = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut previous))
        .map_err(|e| LaunchError::Sys("sigprocmask", e))?;
    // The child's error before it executes the program, or its execve's,
    // if any; end of file (the descriptor closes on exec) says it ran.
    let (err_read, err_write) =
        pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LaunchError::Sys("pipe", e))?;
    let child = match sys::fork().map_err(|e| LaunchError::Sys("fork", e))? {
        ForkResult::Child => {
            drop(err_read);
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
            let Err(e) = confine_and_exec(plan, request, programs, console, err_write.as_fd());
            let _ = fs::File::from(err_write).write_all(e.to_string().as_bytes());
            sys::exit_now(126)
        }
        ForkResult::Parent { child } => child,
    };
    drop(err_write);
    let mut failure = String::new();
    let _ = fs::File::from(err_read).read_to_string(&mut failure);
    if !failure.is_empty() {
        let _ = waitpid(child, None);
        return Err(LaunchError::Setup(failure));
    }
    if let Some(ready) = ready {
        let _ = nix::unistd::write(ready, b"ready\n");
    }
    Ok(wait_forwarding(child, &signals))
}

/// The child: inside the pid namespace, its terminal made from the
/// sandbox's devpts when asked (as init makes the command's), confined as
/// init confines the command (Landlock, no_new_privs, rlimits, seccomp
/// last), then the program. Returns only with what went wrong.
fn confine_and_exec(
    plan: &LaunchPlan,
    request: &ExecRequest,
    programs: &[Vec<u8>],
    console: Option<&Console>,
    report: BorrowedFd<'_>,
) -> Result<std::convert::Infallible, SetupError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    let _ = nix::unistd::setsid();
    // Before the terminal: a working directory that is not there fails
    // the exec with no master sent to the engine.
    nix::unistd::chdir(&request.cwd).map_err(errno("chdir to the working directory"))?;
    if let Some(console) = console {
        crate::console::take_terminal(console)?;
    }
    let abi = sys::landlock_abi_version().unwrap_or(0);
    // The plan's own ruleset, then each layer's, as init applies them.
    crate::landlock::apply(&plan.landlock, abi)?;
    for layer in &plan.layers {
        crate::landlock::apply_with(&layer.landlock, abi, RulePaths::NoLinks)?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(errno("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    apply_rlimits(&plan.rlimits, RlimitFallback::default());
    let spec_allow = plan.seccomp_spec_allow();
    for program in programs {
        sys::load_seccomp_program(program, spec_allow).map_err(errno("seccomp: load filter"))?;
    }
    exec_command(&request.argv, &request.env, request.terminal, Some(report))
}

/// Waits for `child`, passing it every forwarded signal; its exit code.
fn wait_forwarding(child: Pid, signals: &SigSet) -> i32 {
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) => {}
            Err(_) => return 125,
        }
        match signals.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(signal) => {
                let _ = kill(child, signal);
            }
        }
    }
}
