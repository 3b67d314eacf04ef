//! The launcher's side of a run, shared by both backends: what the sandbox
//! reports back, how the launcher waits for it and ends it on a signal.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::cgroup::{CgroupReport, LimitOutcome};
use crate::landlock::LandlockReport;
use crate::mounts::MountReport;
use crate::plan::{CgroupLimits, RlimitKind};
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
pub(crate) enum Status {
    Ready(Box<SetupReport>),
    Failed(String),
    /// The very first step failed: this host does not let us create a user
    /// namespace. Nothing was changed; another backend may work.
    UsernsUnavailable(String),
}

impl From<String> for Status {
    fn from(message: String) -> Self {
        Status::Failed(message)
    }
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
    /// User namespaces are not available to the native backend here.
    #[error("{0}")]
    UsernsUnavailable(String),
    /// The launcher was told to stop (this signal) before the sandbox was
    /// built: it ended the sandbox; nothing was run.
    #[error("stopped by signal {0} before the sandbox was built")]
    Terminated(i32),
}

/// Which backend ran the sandbox, and why that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Native,
    Bwrap,
}

/// The result of one run.
#[derive(Debug)]
pub struct RunOutcome {
    pub backend: Backend,
    pub setup: SetupReport,
    /// How the filter was compiled (by the launcher); `None` when unconfined.
    pub seccomp: Option<SeccompReport>,
    pub cgroup: CgroupReport,
    /// Exit code as a shell reports it: the code, or 128 + signal.
    pub exit_code: i32,
    /// Set when the launcher ended the sandbox because it got this signal.
    pub terminated_by: Option<i32>,
}

/// How a sandbox ended, and what the launcher applied around it: all of
/// a run's outcome but the setup, which the sandbox reports.
pub(crate) struct Ended {
    pub(crate) exit_code: i32,
    pub(crate) terminated_by: Option<i32>,
    pub(crate) seccomp: Option<SeccompReport>,
    pub(crate) cgroup: CgroupReport,
}

/// What a backend does around the wait: once the sandbox says it is
/// ready, and once it has ended (before its groups are removed).
#[derive(Default)]
pub(crate) struct Hooks<'a> {
    pub(crate) on_ready: Option<&'a dyn Fn()>,
    pub(crate) on_end: Option<&'a dyn Fn()>,
}

impl Ended {
    /// What both backends do once their sandbox's first process runs: read
    /// its status, wait for it to end (ending it on the launcher's
    /// signals), then remove its groups and restore the signal mask.
    pub(crate) fn wait(
        child: Pid,
        status_read: OwnedFd,
        signals: BlockedSignals,
        mut groups: crate::cgroup::SandboxCgroups,
        seccomp: Option<SeccompReport>,
        cgroup: CgroupReport,
        hooks: &Hooks<'_>,
    ) -> (Option<Status>, Ended) {
        let (status, signalled) = read_status(status_read, &signals.set);
        if signalled.is_some() {
            // A signal while the sandbox was still being built (its setup
            // hung, or it was frozen half-built): it ends now.
            groups.thaw();
            let _ = kill(child, Signal::SIGKILL);
        }
        if let (Some(Status::Ready(_)), Some(on_ready)) = (&status, hooks.on_ready) {
            on_ready();
        }
        let (exit_code, terminated_by) = wait_sandbox(child, &signals.set, &groups, signalled);
        if let Some(on_end) = hooks.on_end {
            on_end();
        }
        groups.cleanup();
        drop(signals);
        let ended = Ended {
            exit_code,
            terminated_by,
            seccomp,
            cgroup,
        };
        (status, ended)
    }

    pub(crate) fn into_outcome(self, backend: Backend, setup: SetupReport) -> RunOutcome {
        RunOutcome {
            backend,
            setup,
            seccomp: self.seccomp,
            cgroup: self.cgroup,
            exit_code: self.exit_code,
            terminated_by: self.terminated_by,
        }
    }
}

/// How the launcher itself runs (not part of the policy).
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Names the sandbox's cgroups (`substrat-<name>`).
    pub name: String,
    /// The group to create them under, relative to each hierarchy.
    pub cgroup_parent: Option<crate::cgroup::CgroupParent>,
    /// Where the mount points made in writable binds are listed until they
    /// are removed (`mountpoints`): a file outside every bind.
    pub mount_point_record: Option<PathBuf>,
    /// Whose host ids the sandbox runs as: subordinate ones, staged binds
    /// and all, when root launches (`hostid`, `stage`).
    pub host_ids: crate::hostid::HostIds,
    /// A warm sandbox: the connected control socket (SOCK_SEQPACKET) on
    /// which init serves turns (`turns`) instead of running the command.
    pub turns: Option<std::os::fd::OwnedFd>,
    /// Told `ready` (one line) once the sandbox is built and its command
    /// about to start: `substrat-oci create` returns then (native backend).
    pub ready: Option<OwnedFd>,
    /// A FIFO's read end (non-blocking): init starts the command only once
    /// a byte arrives on it (`substrat-oci start`); a writer that closes it
    /// without one means the command never starts (native backend).
    pub start_gate: Option<OwnedFd>,
    /// Once the sandbox is built, the launcher joins its network, ipc and
    /// uts namespaces (before `ready` is told), so that those of the
    /// launcher's pid are the sandbox's: an engine joins a pod's other
    /// containers to the namespaces of the pid `substrat-oci` reports,
    /// which is the launcher's (native backend).
    pub share_namespaces: bool,
    /// The command's terminal is made inside the sandbox and its master
    /// sent here (`substrat-oci create --console-socket`; native backend).
    pub console: Option<crate::console::Console>,
    /// Judges each bind's source as opened, the object then mounted; a
    /// refusal fails the launch (native backend, not warm sandboxes).
    pub bind_judge: Option<crate::bind_judge::BindJudge>,
}

const SIGNALS: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGCHLD,
];

/// Blocks the signals the launcher handles itself (with sigwait) while a
/// sandbox runs; restores the previous mask when dropped.
pub(crate) struct BlockedSignals {
    pub(crate) set: SigSet,
    pub(crate) previous: SigSet,
}

impl BlockedSignals {
    pub(crate) fn block() -> Result<Self, LaunchError> {
        let mut set = SigSet::empty();
        SIGNALS.iter().for_each(|s| set.add(*s));
        let mut previous = SigSet::empty();
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut previous))
            .map_err(|e| LaunchError::Sys("sigprocmask", e))?;
        Ok(Self { set, previous })
    }

    /// In a forked child: back to the mask the launcher started with.
    pub(crate) fn restore_in_child(&self) {
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&self.previous), None);
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&self.previous), None);
    }
}

/// Rlimits that stand in for cgroup limits a best-effort policy could not
/// get: RLIMIT_NPROC for `pids_max`, RLIMIT_DATA (heap and private
/// writable mappings) for `memory_max`. Nothing stands in for `cpu_max`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlimitFallback {
    pub nproc: Option<u64>,
    pub data: Option<u64>,
}

/// The go byte's base; bit 0 asks for the NPROC fallback, bit 1 for DATA.
const GO: u8 = 0x40;

impl RlimitFallback {
    /// What stands in for the limits `report` says were not applied.
    pub(crate) fn for_report(limits: &CgroupLimits, report: &CgroupReport) -> Self {
        let missing = |outcome: &LimitOutcome| matches!(outcome, LimitOutcome::NotApplied { .. });
        RlimitFallback {
            nproc: limits.pids_max.filter(|_| missing(&report.pids_max)),
            data: limits.memory_max.filter(|_| missing(&report.memory_max)),
        }
    }

    /// The launcher says go with one byte once the sandbox's first process
    /// is in its cgroups; the byte carries which fallbacks to apply.
    pub(crate) fn go_byte(self) -> u8 {
        GO | u8::from(self.nproc.is_some()) | (u8::from(self.data.is_some()) << 1)
    }

    /// Read back by the native sandbox, which has the limits in its plan;
    /// `None` for a byte the launcher does not write.
    pub(crate) fn from_go_byte(byte: u8, limits: &CgroupLimits) -> Option<Self> {
        (byte & !0b11 == GO).then(|| RlimitFallback {
            nproc: limits.pids_max.filter(|_| byte & 1 != 0),
            data: limits.memory_max.filter(|_| byte & 2 != 0),
        })
    }
}

/// Stops a sandbox whose setup the launcher gave up on.
pub(crate) fn abort(child: Pid, message: String) -> LaunchError {
    let _ = kill(child, Signal::SIGKILL);
    let _ = waitpid(child, None);
    LaunchError::Setup(message)
}

/// Exit code of the holder when setup failed (the message says why).
pub(crate) const SETUP_FAILED: i32 = 125;

pub(crate) fn send(fd: &OwnedFd, status: &Status) {
    if let Ok(mut line) = serde_json::to_string(status) {
        line.push('\n');
        let _ = fs::File::from(
            fd.try_clone()
                .unwrap_or_else(|_| sys::exit_now(SETUP_FAILED)),
        )
        .write_all(line.as_bytes());
    }
}

/// The sandbox's status line, read until every writer has closed the
/// pipe. The launcher's own signals (blocked, see `BlockedSignals`) are
/// watched meanwhile: one of them (not SIGCHLD) stops the wait and is
/// returned, so a launcher told to stop never waits on a setup that does
/// not finish. Where a signalfd cannot be made, the read only blocks.
pub(crate) fn read_status(fd: OwnedFd, signals: &SigSet) -> (Option<Status>, Option<i32>) {
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use rustix::event::{PollFd, PollFlags, poll};
    let parse = |text: &[u8]| {
        String::from_utf8_lossy(text)
            .lines()
            .find_map(|line| serde_json::from_str(line).ok())
    };
    let Ok(signal_fd) =
        SignalFd::with_flags(signals, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        let mut text = Vec::new();
        let _ = fs::File::from(fd).read_to_end(&mut text);
        return (parse(&text), None);
    };
    let mut file = fs::File::from(fd);
    let (mut text, mut buf) = (Vec::new(), [0u8; 4096]);
    loop {
        let mut fds = [
            PollFd::new(&file, PollFlags::IN),
            PollFd::new(&signal_fd, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let (status_ready, signal_ready) =
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if signal_ready {
            while let Ok(Some(info)) = signal_fd.read_signal() {
                let signal = info.ssi_signo as i32;
                if signal != Signal::SIGCHLD as i32 {
                    return (parse(&text), Some(signal));
                }
            }
        }
        if status_ready {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    (parse(&text), None)
}

/// Waits for the holder; a signal to the launcher ends the whole sandbox,
/// and the launcher then reports 128 + that signal, as a shell would.
/// `terminated_by`: a signal already taken (while the status was read).
pub(crate) fn wait_sandbox(
    holder: Pid,
    signals: &SigSet,
    groups: &crate::cgroup::SandboxCgroups,
    mut terminated_by: Option<i32>,
) -> (i32, Option<i32>) {
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
        if terminated_by.is_some() {
            // Ending: a freeze that raced the signal (a daemon's, after a
            // turn's answer) is undone until the sandbox is gone.
            groups.thaw();
            let _ = kill(holder, Signal::SIGKILL);
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        match signals.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(signal) => {
                terminated_by = Some(signal as i32);
                // A frozen sandbox (a warm one between turns) dies only
                // once thawed.
                groups.thaw();
                let _ = kill(holder, Signal::SIGKILL);
            }
        }
    }
}
