//! Attacks that need a real target, set up first so that a refusal can
//! only come from the sandbox: a child process of this probe (same
//! credentials, a descendant, so the kernel's own checks let it be traced
//! and written) and a terminal of its own (a pty whose slave is this
//! process's controlling terminal). When the target cannot be set up the
//! outcome is `not-attempted:<why>`, never an errno: the judge must not
//! take a failed setup for a refusal.

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
use std::os::fd::AsRawFd;

use crate::sys::{self, ptr, syscall6};

/// A paused child of this probe, killed and reaped when dropped.
struct Target(Pid);

impl Target {
    fn spawn() -> Result<Self, String> {
        match sys::fork() {
            Ok(ForkResult::Child) => sys::pause(),
            Ok(ForkResult::Parent { child }) => Ok(Self(child)),
            Err(e) => Err(format!("not-attempted:fork a target: {e:?}")),
        }
    }

    fn pid(&self) -> u64 {
        self.0.as_raw() as u64
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
        let _ = waitpid(self.0, None);
    }
}

fn outcome(result: sys::SysResult) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno:{e:?}"),
    }
}

/// PTRACE_ATTACH to a child of this probe.
pub fn ptrace_child() -> String {
    let target = match Target::spawn() {
        Ok(t) => t,
        Err(why) => return why,
    };
    let result = syscall6(
        libc::SYS_ptrace,
        [libc::PTRACE_ATTACH as u64, target.pid(), 0, 0, 0, 0],
    );
    outcome(result)
}

/// process_vm_writev of 8 bytes into a child's copy of a buffer of this
/// process: a valid address in the target, so EFAULT cannot stand for a
/// refusal.
pub fn process_vm_writev_child() -> String {
    let buffer = [0u8; 8];
    let target = match Target::spawn() {
        Ok(t) => t,
        Err(why) => return why,
    };
    let data = [0x5au8; 8];
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: buffer.as_ptr() as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    let result = syscall6(
        libc::SYS_process_vm_writev,
        [target.pid(), ptr(&local), 1, ptr(&remote), 1, 0],
    );
    outcome(result)
}

/// A new pty whose slave becomes this process's controlling terminal. Its
/// descriptors stay open until the process ends: closing the master
/// would hang up this session (SIGHUP) before the outcome is printed.
fn own_terminal() -> Result<std::mem::ManuallyDrop<nix::pty::OpenptyResult>, String> {
    let pty = nix::pty::openpty(
        None::<&nix::pty::Winsize>,
        None::<&nix::sys::termios::Termios>,
    )
    .map_err(|e| format!("not-attempted:open a pty: {e:?}"))?;
    nix::unistd::setsid().map_err(|e| format!("not-attempted:setsid: {e:?}"))?;
    let slave = pty.slave.as_raw_fd() as u64;
    syscall6(libc::SYS_ioctl, [slave, libc::TIOCSCTTY, 0, 0, 0, 0])
        .map_err(|e| format!("not-attempted:make the pty the controlling terminal: {e:?}"))?;
    Ok(std::mem::ManuallyDrop::new(pty))
}

/// TIOCSTI on this process's own controlling terminal (the kernel allows
/// it there; only the sandbox can refuse). With `high`, the request's
/// upper 32 bits are set, as a filter comparing 64 bits would miss.
pub fn tiocsti_pty(high: bool) -> String {
    let pty = match own_terminal() {
        Ok(p) => p,
        Err(why) => return why,
    };
    let c = b'x';
    let high = if high { 1u64 << 32 } else { 0 };
    let slave = pty.slave.as_raw_fd() as u64;
    outcome(syscall6(
        libc::SYS_ioctl,
        [slave, libc::TIOCSTI | high, ptr(&c), 0, 0, 0],
    ))
}

/// TIOCSETD (N_TTY, always registered) on this process's own terminal.
pub fn tiocsetd_pty() -> String {
    let pty = match own_terminal() {
        Ok(p) => p,
        Err(why) => return why,
    };
    let n_tty: libc::c_int = 0;
    let slave = pty.slave.as_raw_fd() as u64;
    outcome(syscall6(
        libc::SYS_ioctl,
        [slave, libc::TIOCSETD, ptr(&n_tty), 0, 0, 0],
    ))
}

/// Dispatches the probes of this module; `None` for another module's name.
pub fn run(args: &[String]) -> Option<String> {
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    Some(match a(0) {
        "ptrace-child" => ptrace_child(),
        "process-vm-writev-child" => process_vm_writev_child(),
        "tiocsti-pty" => tiocsti_pty(a(1) == "high"),
        "tiocsetd-pty" => tiocsetd_pty(),
        _ => return None,
    })
}
