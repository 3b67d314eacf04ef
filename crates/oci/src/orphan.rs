//! A `create` killed midway (SIGKILL: nothing of it runs after) must not
//! leave a launcher waiting at the gate forever: nothing would start it,
//! and an engine that lost `create` knows no pid to kill. `create` starts
//! a watcher first (this program, `create-watch`), holding the read end
//! of a pipe whose write end only `create` has. When `create` is done it
//! writes `SAVED`; when it dies the pipe closes without it, and the
//! watcher ends the launcher as `kill` would (SIGTERM: the sandbox is
//! killed and its groups removed). Which launcher `create` says on the
//! pipe (its pid and start time) as soon as it runs: never the record of
//! the id, which by the time a slow watcher reads it may be the next
//! container's. The record, saved before the launcher started, then says
//! `stopped` for `delete` to remove.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use substrat_oci::state;

/// `create`'s last word to its watcher.
pub(crate) const SAVED: &[u8] = b"saved\n";

/// What `create` tells its watcher once the launcher runs.
pub(crate) fn launcher_line(pid: i32, start: u64) -> String {
    format!("launcher {pid} {start}\n")
}

/// Starts the watcher for container `id`; returns the pipe's write end.
/// The watcher is `create`'s child and outlives it by the time `create`
/// takes to exit (the engine, a subreaper, reaps it).
pub(crate) fn spawn_watch(root: &Path, id: &str) -> Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("cannot make the watcher's pipe")?;
    let exe = std::env::current_exe().context("cannot find this program")?;
    Command::new(exe)
        .arg(crate::argv::flag("--root", root))
        .args(["create-watch", "--", id])
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the create watcher")?;
    Ok(write)
}

/// The launcher's first act: names itself on the watcher's pipe (fd
/// `fd`, inherited) and closes it.
pub(crate) fn name_launcher(fd: i32) {
    let path = format!("/proc/self/fd/{fd}");
    // Only a pipe: an fd number that is anything else is left alone.
    let is_pipe = std::fs::metadata(&path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_fifo()
    });
    if !is_pipe {
        return;
    }
    let me = std::process::id() as i32;
    if let (Ok(mut pipe), Some((start, _))) = (
        std::fs::OpenOptions::new().write(true).open(&path),
        state::process_start(me),
    ) {
        use std::io::Write;
        let _ = pipe.write_all(launcher_line(me, start).as_bytes());
    }
    let _ = nix::unistd::close(fd);
}

/// The watcher: waits for `create` to end; unless it said `SAVED`, ends
/// the launcher it named (when that is still the same process). The root
/// and the id are only shown in `ps`.
pub(crate) fn watch(_root: &Path, _id: &str) {
    close_inherited();
    let mut said = Vec::new();
    let _ = std::io::stdin().take(256).read_to_end(&mut said);
    let text = String::from_utf8_lossy(&said);
    if text.lines().any(|l| l.as_bytes() == SAVED.trim_ascii_end()) {
        return;
    }
    let named = text.lines().find_map(|l| {
        let mut words = l.strip_prefix("launcher ")?.split(' ');
        let pid: i32 = words.next()?.parse().ok()?;
        let start: u64 = words.next()?.parse().ok()?;
        Some((pid, start))
    });
    if let Some((pid, start)) = named
        && pid > 0
        && state::process_start(pid) == Some((start, false))
    {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
}

/// Closes every descriptor above stderr this process inherited (from the
/// engine, through `create`): the watcher holds nothing of anyone's open.
fn close_inherited() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is closed already: EBADF.
        let _ = nix::unistd::close(fd);
    }
}
