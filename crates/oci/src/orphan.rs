//! A `create` killed midway (SIGKILL: nothing of it runs after) must not
//! leave a launcher waiting at the gate forever: nothing would start it,
//! and an engine that lost `create` knows no pid to kill. `create` starts
//! a watcher first (this program, `create-watch`), holding the read end
//! of a pipe whose write end only `create` has. When `create` is done it
//! writes `SAVED`; when it dies the pipe closes without it, and the
//! watcher ends the launcher the record names as `kill` would (SIGTERM:
//! the sandbox is killed and its groups removed). The record, saved
//! before the launcher started, then says `stopped` for `delete` to
//! remove.

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

/// The watcher: waits for `create` to end; unless it said `SAVED`, ends
/// the launcher its record names (when that is still the same process).
pub(crate) fn watch(root: &Path, id: &str) {
    let mut said = Vec::new();
    let _ = std::io::stdin().take(64).read_to_end(&mut said);
    if said == SAVED {
        return;
    }
    let Ok((_, record)) = state::load(root, id) else {
        return;
    };
    if record.pid > 0 && state::alive(&record) {
        let _ = kill(Pid::from_raw(record.pid), Signal::SIGTERM);
    }
}
