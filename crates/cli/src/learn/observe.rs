//! One observed run: the launcher started under `__learn-exec` (a fresh
//! process of this program), its seccomp listener taken with
//! `pidfd_getfd`, and every notification answered CONTINUE after the
//! call's path or destination is recorded. The observer never answers
//! anything else: it cannot make a call succeed that the sandbox refuses,
//! only see it. Calls of processes not yet inside the finished sandbox
//! (the launcher setting it up: fewer than two seccomp filters, ours and
//! the sandbox's) continue unrecorded.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use libseccomp::{ScmpNotifReq, ScmpNotifResp, ScmpNotifRespFlags, notify_id_valid};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
use substrat_policy::learn::Observations;

use super::decode::{Table, decode};

/// How long the helper may take to hand over its listener.
const HANDOVER: Duration = Duration::from_secs(10);

/// Whether `pid` runs inside the finished sandbox: our filter and the
/// sandbox's (or more) loaded.
fn inside(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .is_some_and(|n| n >= 2)
}

/// Answers notifications on `listener` until no process is left to make
/// any (or `stop`, once the launcher is gone and the queue is empty).
fn serve(listener: OwnedFd, stop: Arc<AtomicBool>) -> Observations {
    let table = Table::new();
    let fd = listener.as_raw_fd();
    let mut seen = Observations::default();
    loop {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        let ready = poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            }),
        );
        let events = fds[0].revents();
        if ready.is_err() || events.contains(PollFlags::HUP) || events.contains(PollFlags::ERR) {
            break;
        }
        if !events.contains(PollFlags::IN) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        let Ok(req) = ScmpNotifReq::receive(fd) else {
            continue; // the caller died before we read it
        };
        // Asked of every call, never remembered by pid: a pid that ends
        // can be reused by a process of the launcher's (outside the
        // finished sandbox), whose calls are not the command's.
        if inside(req.pid) {
            seen.calls += 1;
            let event = decode(&table, req.data.syscall, req.pid, &req.data.args);
            // Recorded only if the caller is still the one that asked (its
            // pid not reused while we read).
            if let Some(event) = event
                && notify_id_valid(fd, req.id).is_ok()
            {
                event.record(&mut seen);
            }
        }
        let _ = ScmpNotifResp::new_continue(req.id, ScmpNotifRespFlags::empty()).respond(fd);
    }
    seen
}

/// Takes the helper's listener: its number from the socket, a copy
/// through a pidfd.
fn take_listener(socket: &UnixListener, helper: u32) -> Result<OwnedFd> {
    socket.set_nonblocking(true)?;
    let started = Instant::now();
    let mut stream = loop {
        match socket.accept() {
            Ok((stream, _)) => break stream,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock && started.elapsed() < HANDOVER =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("the observed run did not start"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HANDOVER))?;
    let mut number = [0u8; 4];
    stream
        .read_exact(&mut number)
        .context("the observed run did not hand over its listener")?;
    let pid = Pid::from_raw(helper as i32).context("no helper pid")?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).context("pidfd_open of the helper")?;
    let listener = pidfd_getfd(&pidfd, i32::from_le_bytes(number), PidfdGetfdFlags::empty())
        .context("pidfd_getfd of the helper's listener")?;
    stream
        .write_all(b"k")
        .context("cannot release the helper")?;
    Ok(listener)
}

/// What one run of the launcher with `run_args` did: its exit status and
/// what the command inside used. The command's stdout goes to stderr
/// (stdout may carry the learned policy).
pub fn observe(
    program: &Path,
    run_args: &[OsString],
    scratch: &Path,
) -> Result<(ExitStatus, Observations)> {
    let socket_path: PathBuf = scratch.join("observer.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = UnixListener::bind(&socket_path).context("cannot make the observer's socket")?;
    let mut child = Command::new(program)
        .arg("__learn-exec")
        .arg(&socket_path)
        .arg("--")
        .arg(program)
        .args(run_args)
        .stdout(stderr_for_stdout()?)
        .spawn()
        .context("cannot start the observed run")?;
    let listener = match take_listener(&socket, child.id()) {
        Ok(l) => l,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let stop = stop.clone();
        std::thread::spawn(move || serve(listener, stop))
    };
    let status = child.wait().context("waiting for the observed run")?;
    stop.store(true, Ordering::Relaxed);
    let Ok(seen) = observer.join() else {
        bail!("the observer failed");
    };
    Ok((status, seen))
}

/// Our stderr, as a child's stdout: the command's output never mixes
/// with a policy written to stdout.
pub(super) fn stderr_for_stdout() -> std::io::Result<Stdio> {
    use std::os::fd::AsFd;
    Ok(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
}
