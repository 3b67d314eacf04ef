//! `__learn-exec SOCKET -- PROGRAM ARGS...`: the first process of an
//! observed run. It connects to the observer, loads a seccomp filter that
//! turns the calls that name a path or a destination into user
//! notifications (a second filter on top of every filter the sandbox
//! loads: it allows nothing the sandbox's own filter refuses), tells the
//! observer the listener's number, waits for it to take a copy
//! (`pidfd_getfd`), and executes PROGRAM (the launcher). From the exec on,
//! every notified call of every descendant waits until the observer lets
//! it continue; the listener itself is close-on-exec, so neither the
//! launcher nor the command holds it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use libseccomp::{ScmpAction, ScmpFilterAttr, ScmpFilterContext, ScmpSyscall};

use super::decode::NOTIFIED_CALLS;

/// Loads the notifying filter on this process; the listener's number.
fn load_filter() -> Result<i32> {
    let mut filter = ScmpFilterContext::new(ScmpAction::Allow).context("seccomp: new filter")?;
    // As root the launcher may need set-id helpers (newuidmap): no
    // no_new_privs then (loading a filter is allowed by CAP_SYS_ADMIN).
    if nix::unistd::geteuid().is_root() {
        filter
            .set_filter_attr(ScmpFilterAttr::CtlNnp, 0)
            .context("seccomp: no_new_privs attribute")?;
    }
    for name in NOTIFIED_CALLS {
        // A call this architecture lacks (open on arm64) is skipped.
        if let Ok(call) = ScmpSyscall::from_name(name) {
            filter
                .add_rule(ScmpAction::Notify, call)
                .with_context(|| format!("seccomp: notify rule for {name}"))?;
        }
    }
    filter
        .load()
        .context("seccomp: load the observing filter")?;
    filter.get_notify_fd().context("seccomp: the listener")
}

/// The helper's whole life: never returns on success (exec).
pub fn main(socket: &Path, program: &[std::ffi::OsString]) -> Result<()> {
    let Some((first, rest)) = program.split_first() else {
        bail!("__learn-exec: no program");
    };
    // Connect before the filter: connect is one of the notified calls.
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach the observer at {}", socket.display()))?;
    let listener = load_filter()?;
    stream
        .write_all(&listener.to_le_bytes())
        .context("cannot tell the observer the listener")?;
    let mut ack = [0u8; 1];
    stream
        .read_exact(&mut ack)
        .context("the observer did not take the listener")?;
    drop(stream);
    let error = std::process::Command::new(first).args(rest).exec();
    Err(error).with_context(|| format!("cannot execute {}", Path::new(first).display()))
}
