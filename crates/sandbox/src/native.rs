//! The native backend: the kernel's namespaces, applied by our own processes.
//!
//! ```text
//! launcher (host)      cgroups, signals, report; waits for `holder`
//!  └ holder            unshare(user, mnt, ipc, uts, net, pid) + id maps
//!     └ init (pid 1)   mounts, pivot_root, landlock, caps, no_new_privs,
//!        │             rlimits, seccomp; then reaps until the command ends
//!        └ command     setsid, fds above 2 closed, execve with the env
//! ```
//! Death travels down: the launcher dying kills the holder (parent-death
//! signal), which kills init, whose end kills every process of the pid
//! namespace, double-forked survivors included.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, getppid, pipe2, setsid};
use serde::{Deserialize, Serialize};

use crate::cgroup::{self, CgroupReport, LimitOutcome};
use crate::landlock::LandlockReport;
use crate::mounts::MountReport;
use crate::plan::{LaunchPlan, RlimitKind, RlimitSetting};
use crate::seccomp::SeccompReport;
use crate::sys;

/// What init found after applying everything, read by the launcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupReport {
    pub mounts: MountReport,
    pub landlock: LandlockReport,
    /// Seccomp programs init loaded, and its seccomp mode read back from
    /// /proc/self/status (2: filtering).
    pub seccomp_filters_loaded: usize,
    pub seccomp_mode: String,
    pub nested_userns_blocked: bool,
    /// From /proc/self/status of init after the last restriction.
    pub capabilities: Capabilities,
    pub no_new_privs: bool,
    pub rlimits: Vec<RlimitOutcome>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Capabilities {
    pub effective: String,
    pub permitted: String,
    pub inheritable: String,
    pub bounding: String,
    pub ambient: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RlimitOutcome {
    pub name: RlimitKind,
    pub value: u64,
    pub applied: bool,
    pub note: Option<String>,
}

/// Messages from the sandbox side to the launcher, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
enum Status {
    Ready(Box<SetupReport>),
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the launcher must be single-threaded to fork safely (found {0} threads)")]
    Threads(usize),
    #[error("{0}: {1}")]
    Sys(&'static str, nix::errno::Errno),
    /// The sandbox could not be built; nothing was run.
    #[error("{0}")]
    Setup(String),
}

/// The result of one run.
#[derive(Debug)]
pub struct RunOutcome {
    pub setup: SetupReport,
    /// How the filter was compiled (by the launcher); `None` when unconfined.
    pub seccomp: Option<SeccompReport>,
    pub cgroup: CgroupReport,
    /// Exit code as a shell reports it: the code, or 128 + signal.
    pub exit_code: i32,
    /// Set when the launcher ended the sandbox because it got this signal.
    pub terminated_by: Option<i32>,
}

const SIGNALS: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGCHLD,
];

/// How the launcher itself runs (not part of the policy).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Names the sandbox's cgroups (`substrat-<name>`).
    pub name: String,
    /// A delegated cgroup to create them under, relative to each hierarchy.
    pub cgroup_parent: Option<PathBuf>,
}

/// Runs the plan's command in a native sandbox and waits for it.
///
/// The launcher works while the sandbox builds itself: after forking the
/// holder it makes the cgroups (the holder starts init only once it is
/// inside them) and compiles the seccomp filter, which init loads last.
pub fn run(plan: &LaunchPlan, options: &RunOptions) -> Result<RunOutcome, LaunchError> {
    match sys::thread_count() {
        Some(1) => {}
        Some(n) => return Err(LaunchError::Threads(n)),
        None => return Err(LaunchError::Setup("cannot read /proc/self/status".into())),
    }
    let pipe = || pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LaunchError::Sys("pipe", e));
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    let (filter_read, filter_write) = pipe()?;
    // Signals wait in a queue from here on; the launcher takes them with sigwait.
    let mut signals = SigSet::empty();
    SIGNALS.iter().for_each(|s| signals.add(*s));
    let mut old_mask = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), Some(&mut old_mask))
        .map_err(|e| LaunchError::Sys("sigprocmask", e))?;
    let launcher = nix::unistd::getpid();

    let holder = match sys::fork().map_err(|e| LaunchError::Sys("fork", e))? {
        ForkResult::Child => {
            drop((go_write, status_read, filter_write));
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
            let ends = SandboxEnds {
                go: go_read,
                status: status_write,
                filter: filter_read,
            };
            let code = match holder_main(plan, launcher, &ends) {
                Ok(code) => code,
                Err(message) => {
                    send(&ends.status, &Status::Failed(message));
                    SETUP_FAILED
                }
            };
            sys::exit_now(code)
        }
        ForkResult::Parent { child } => child,
    };
    drop((go_read, status_write, filter_read));
    let abort = |message: String| {
        let _ = kill(holder, Signal::SIGKILL);
        let _ = waitpid(holder, None);
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
        LaunchError::Setup(message)
    };

    let (mut groups, cgroup) = cgroup::create(
        &plan.cgroup,
        &options.name,
        options.cgroup_parent.as_deref(),
    );
    if let Err(message) = groups.add(holder.as_raw()) {
        return Err(abort(message));
    }
    // Go, and whether init must stand in for a missing pids cgroup with RLIMIT_NPROC.
    let go = if matches!(cgroup.pids_max, LimitOutcome::NotApplied { .. }) {
        GO_NPROC_FALLBACK
    } else {
        GO
    };
    let _ = nix::unistd::write(&go_write, &[go]);
    drop(go_write);

    let (programs, seccomp) = match &plan.seccomp {
        Some(seccomp_plan) => match crate::seccomp::export(seccomp_plan) {
            Ok((programs, report)) => (programs, Some(report)),
            Err(e) => return Err(abort(e.to_string())),
        },
        None => (Vec::new(), None),
    };
    // If init already failed the write fails too; its status says why.
    let _ = fs::File::from(filter_write).write_all(&frame_programs(&programs));

    let status = read_status(status_read);
    let (exit_code, terminated_by) = wait_holder(holder, &signals);
    groups.cleanup();
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
    match status {
        Some(Status::Ready(setup)) => Ok(RunOutcome {
            setup: *setup,
            seccomp,
            cgroup,
            exit_code,
            terminated_by,
        }),
        Some(Status::Failed(message)) => Err(LaunchError::Setup(message)),
        None => Err(LaunchError::Setup(format!(
            "the sandbox ended before it was ready (exit {exit_code})"
        ))),
    }
}

const GO: u8 = b'g';
const GO_NPROC_FALLBACK: u8 = b'n';

/// The sandbox's ends of the pipes to the launcher.
struct SandboxEnds {
    /// The launcher says go (once the holder is in its cgroups).
    go: OwnedFd,
    /// Setup report or failure, one JSON line.
    status: OwnedFd,
    /// The compiled seccomp programs, framed by `frame_programs`.
    filter: OwnedFd,
}

/// Each program as a little-endian u32 length and its bytes; a zero length ends the list.
fn frame_programs(programs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for program in programs {
        out.extend_from_slice(&(program.len() as u32).to_le_bytes());
        out.extend_from_slice(program);
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

fn read_programs(fd: &OwnedFd) -> Result<Vec<Vec<u8>>, String> {
    let mut file = fs::File::from(fd.try_clone().map_err(|e| format!("seccomp pipe: {e}"))?);
    let mut programs = Vec::new();
    loop {
        let mut len = [0u8; 4];
        file.read_exact(&mut len)
            .map_err(|e| format!("the launcher sent no seccomp filter: {e}"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 {
            return Ok(programs);
        }
        if len > 1 << 20 {
            return Err(format!("seccomp program of {len} bytes refused"));
        }
        let mut program = vec![0u8; len];
        file.read_exact(&mut program)
            .map_err(|e| format!("seccomp program cut short: {e}"))?;
        programs.push(program);
    }
}

/// Exit code of the holder when setup failed (the message says why).
const SETUP_FAILED: i32 = 125;

fn send(fd: &OwnedFd, status: &Status) {
    if let Ok(mut line) = serde_json::to_string(status) {
        line.push('\n');
        let _ = fs::File::from(
            fd.try_clone()
                .unwrap_or_else(|_| sys::exit_now(SETUP_FAILED)),
        )
        .write_all(line.as_bytes());
    }
}

fn read_status(fd: OwnedFd) -> Option<Status> {
    let mut text = String::new();
    let _ = fs::File::from(fd).read_to_string(&mut text);
    text.lines()
        .find_map(|line| serde_json::from_str(line).ok())
}

/// Waits for the holder; a signal to the launcher ends the whole sandbox,
/// and the launcher then reports 128 + that signal, as a shell would.
fn wait_holder(holder: Pid, signals: &SigSet) -> (i32, Option<i32>) {
    let mut terminated_by = None;
    loop {
        let code = |own: i32| terminated_by.map_or(own, |s: i32| 128 + s);
        match waitpid(holder, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, c)) => return (code(c), terminated_by),
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                return (code(128 + signal as i32), terminated_by);
            }
            Ok(_) => {}
            Err(_) => return (SETUP_FAILED, terminated_by),
        }
        match signals.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(signal) => {
                terminated_by = Some(signal as i32);
                let _ = kill(holder, Signal::SIGKILL);
            }
        }
    }
}

fn errno(what: &'static str) -> impl Fn(nix::errno::Errno) -> String {
    move |e| format!("{what}: {e}")
}

/// The holder: enters the new namespaces, maps ids, starts init, and exits
/// with init's status.
fn holder_main(plan: &LaunchPlan, launcher: Pid, ends: &SandboxEnds) -> Result<i32, String> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    if getppid() != launcher {
        return Err("the launcher exited during setup".into());
    }
    let ns = &plan.namespaces;
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS;
    for (on, flag) in [
        (ns.pid, CloneFlags::CLONE_NEWPID),
        (ns.ipc, CloneFlags::CLONE_NEWIPC),
        (ns.uts, CloneFlags::CLONE_NEWUTS),
        (ns.net, CloneFlags::CLONE_NEWNET),
    ] {
        if on {
            flags |= flag;
        }
    }
    unshare(flags).map_err(errno(
        "unshare (user namespaces may be disabled on this host; see `check --host`)",
    ))?;
    // A single-id map works unprivileged; setgroups must be denied first.
    fs::write("/proc/self/setgroups", "deny").map_err(|e| format!("write setgroups: {e}"))?;
    fs::write(
        "/proc/self/uid_map",
        format!("{} {} 1", plan.uid_map.inside, plan.uid_map.outside),
    )
    .map_err(|e| format!("write uid_map: {e}"))?;
    fs::write(
        "/proc/self/gid_map",
        format!("{} {} 1", plan.gid_map.inside, plan.gid_map.outside),
    )
    .map_err(|e| format!("write gid_map: {e}"))?;
    // Init is the first process of the sandbox: it may start only once the
    // launcher has put us into the cgroups, so everything it starts is inside.
    let mut go = [0u8; 1];
    if nix::unistd::read(&ends.go, &mut go) != Ok(1) {
        return Err("the launcher did not start the sandbox".into());
    }
    let nproc_fallback = go[0] == GO_NPROC_FALLBACK;
    match sys::fork().map_err(errno("fork"))? {
        ForkResult::Child => {
            let code = match init_main(plan, ends, nproc_fallback) {
                Ok(code) => code,
                Err(message) => {
                    send(&ends.status, &Status::Failed(message));
                    SETUP_FAILED
                }
            };
            sys::exit_now(code)
        }
        ForkResult::Parent { child } => {
            let _ = nix::unistd::close(ends.status.as_raw_fd());
            Ok(wait_for(child))
        }
    }
}

fn wait_for(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// Init: builds the sandbox around itself in the required order, reports,
/// starts the command and reaps until it ends.
fn init_main(plan: &LaunchPlan, ends: &SandboxEnds, nproc_fallback: bool) -> Result<i32, String> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    let kernel_abi = sys::landlock_abi_version().unwrap_or(0);
    // 1. Mounts and pivot_root, while we hold capabilities in the namespace.
    let mounts = crate::mounts::build_root(plan).map_err(|e| e.to_string())?;
    if plan.namespaces.uts {
        nix::unistd::sethostname(&plan.hostname).map_err(errno("sethostname"))?;
    }
    // 2. No user namespaces below this one: the limit lives in our own
    //    namespace and needs CAP_SYS_RESOURCE, which goes in step 4.
    let nested_userns_blocked = !plan.namespaces.nested_userns
        && fs::write("/proc/sys/user/max_user_namespaces", "0").is_ok();
    if !plan.namespaces.nested_userns && !nested_userns_blocked {
        return Err("cannot set user.max_user_namespaces = 0 inside the sandbox".into());
    }
    // 3. Landlock after every mount: a Landlocked task may not mount.
    let landlock = crate::landlock::apply(&plan.landlock, kernel_abi).map_err(|e| e.to_string())?;
    // 4. Capabilities: the bounding set first, while CAP_SETPCAP is held.
    drop_capabilities()?;
    // 5. no_new_privs: exec can never raise privileges again.
    nix::sys::prctl::set_no_new_privs().map_err(errno("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let rlimits = apply_rlimits(
        &plan.rlimits,
        nproc_fallback.then_some(plan.cgroup.pids_max).flatten(),
    );
    // 6. Seccomp last: everything above needed syscalls it denies.
    let programs = read_programs(&ends.filter)?;
    for program in &programs {
        sys::load_seccomp_program(program).map_err(errno("seccomp: load filter"))?;
    }
    let (capabilities, no_new_privs, seccomp_mode) = read_status_fields();
    let setup = SetupReport {
        mounts,
        landlock,
        seccomp_filters_loaded: programs.len(),
        seccomp_mode,
        nested_userns_blocked,
        capabilities,
        no_new_privs,
        rlimits,
    };
    send(&ends.status, &Status::Ready(Box::new(setup)));
    let _ = nix::unistd::close(ends.status.as_raw_fd());
    let command = match sys::fork().map_err(errno("fork"))? {
        ForkResult::Child => command_main(plan),
        ForkResult::Parent { child } => child,
    };
    Ok(reap_until(command))
}

fn drop_capabilities() -> Result<(), String> {
    use caps::CapSet;
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap)
            .map_err(|e| format!("drop {cap} from the bounding set: {e}"))?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| format!("clear {set:?} capabilities: {e}"))?;
    }
    Ok(())
}

fn apply_rlimits(settings: &[RlimitSetting], nproc_fallback: Option<u64>) -> Vec<RlimitOutcome> {
    use nix::sys::resource::{Resource, setrlimit};
    let mut wanted: Vec<(RlimitSetting, Option<String>)> =
        settings.iter().map(|s| (*s, None)).collect();
    if let Some(pids) = nproc_fallback
        && !settings.iter().any(|s| s.kind == RlimitKind::Nproc)
    {
        let note =
            "cgroup pids limit unavailable: RLIMIT_NPROC used instead (not enforced for host root)"
                .to_string();
        wanted.push((
            RlimitSetting {
                kind: RlimitKind::Nproc,
                value: pids,
            },
            Some(note),
        ));
    }
    wanted
        .into_iter()
        .map(|(setting, note)| {
            let resource = match setting.kind {
                RlimitKind::Nofile => Resource::RLIMIT_NOFILE,
                RlimitKind::Nproc => Resource::RLIMIT_NPROC,
                RlimitKind::Core => Resource::RLIMIT_CORE,
                RlimitKind::Fsize => Resource::RLIMIT_FSIZE,
                RlimitKind::AddressSpace => Resource::RLIMIT_AS,
                RlimitKind::CpuSeconds => Resource::RLIMIT_CPU,
            };
            let result = setrlimit(resource, setting.value, setting.value);
            RlimitOutcome {
                name: setting.kind,
                value: setting.value,
                applied: result.is_ok(),
                note: result.err().map(|e| format!("setrlimit: {e}")).or(note),
            }
        })
        .collect()
}

fn read_status_fields() -> (Capabilities, bool, String) {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    let caps = Capabilities {
        effective: field("CapEff:"),
        permitted: field("CapPrm:"),
        inheritable: field("CapInh:"),
        bounding: field("CapBnd:"),
        ambient: field("CapAmb:"),
    };
    (caps, field("NoNewPrivs:") == "1", field("Seccomp:"))
}

/// Init's loop: reap every child; when the command ends, so does init, and
/// with it every process left in the pid namespace.
fn reap_until(command: Pid) -> i32 {
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                return 128 + signal as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// The command: a new session (no controlling terminal, so no TIOCSTI into
/// the launcher's terminal), only fds 0-2, the plan's environment.
fn command_main(plan: &LaunchPlan) -> ! {
    let _ = setsid();
    let _ = sys::close_fds_from(3);
    if nix::unistd::chdir(&plan.cwd).is_err() {
        let _ = nix::unistd::chdir("/");
    }
    let env: Vec<CString> = plan
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let argv: Vec<CString> = plan
        .argv
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let name = plan.argv.first().cloned().unwrap_or_default();
    if argv.len() != plan.argv.len() || argv.is_empty() {
        eprintln!("substrat-sandbox: {name}: argument contains a NUL byte");
        sys::exit_now(126);
    }
    let mut denied = false;
    for candidate in candidates(&name, plan) {
        let Ok(path) = CString::new(candidate.as_os_str().as_bytes()) else {
            continue;
        };
        match nix::unistd::execve(&path, &argv, &env) {
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => {}
            Err(nix::errno::Errno::EACCES) => denied = true,
            Err(e) => {
                eprintln!("substrat-sandbox: {name}: {e}");
                sys::exit_now(126);
            }
            Ok(never) => match never {},
        }
    }
    if denied {
        eprintln!("substrat-sandbox: {name}: permission denied");
        sys::exit_now(126);
    }
    eprintln!("substrat-sandbox: {name}: command not found");
    sys::exit_now(127)
}

/// Where to look for the command: as given when it has a `/`, else in the
/// sandbox's PATH (or the usual directories when the policy sets none).
fn candidates(name: &str, plan: &LaunchPlan) -> Vec<PathBuf> {
    if name.contains('/') {
        return vec![PathBuf::from(name)];
    }
    let path = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(name))
        .collect()
}
