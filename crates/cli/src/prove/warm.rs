//! `check --prove --warm`: the battery as the second turn of a warm
//! sandbox, the way the daemon's warm turns run. The first turn runs the
//! battery too and leaves its processes behind (the fork bomb's children)
//! and one thing of each kind lasts.rs knows; the second must find the
//! same walls, none of the processes, and only what the docs say lasts.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use substrat_sandbox::cgroup::Freezer;
use substrat_sandbox::turns::{self, Hello, TurnReply, TurnRequest};

/// How long the launcher may take to connect (it connects before it
/// builds anything).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `launcher` (a `run` command line without COMMAND) serving turns on
/// a socket in `dir`, `first` as its first turn and `second` as its second:
/// the second turn's output, as a cold launch's would be read, and the
/// first turn's stdout (empty if it did not run).
pub fn two_turns(
    mut launcher: Command,
    dir: &Path,
    first: &[String],
    second: &[String],
) -> Result<(Output, Vec<u8>)> {
    let socket = dir.join("turns.sock");
    let listener = turns::listen(&socket).context("cannot listen for the warm sandbox")?;
    let mut child = launcher
        .arg("--serve-turns")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the launcher")?;
    let control = match accept_from(&listener, &mut child) {
        Ok(control) => control,
        Err(e) => return Ok((ended_early(child, e)?, Vec::new())),
    };
    let request = |argv: &[String]| TurnRequest {
        argv: argv.to_vec(),
        env: Vec::new(),
    };
    // Between the turns the sandbox is frozen and thawed, as the daemon's.
    let first = hello(&control).and_then(|freezer| Ok((turn(&control, &request(first))?, freezer)));
    let (first_stdout, second) = match first {
        Ok(((stdout, _), freezer)) => (
            stdout,
            freeze_and_thaw(freezer.as_ref()).and_then(|()| turn(&control, &request(second))),
        ),
        Err(e) => (Vec::new(), Err(e)),
    };
    drop(control);
    let waited = child.wait_with_output().context("the launcher")?;
    let (stdout, code) = match second {
        Ok(done) => done,
        Err(e) => return Ok((ended_early_output(waited, e)?, first_stdout)),
    };
    let mut stderr = waited.stderr;
    if code != 0 {
        stderr.extend_from_slice(format!("the second turn ended with {code}\n").as_bytes());
    }
    let output = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(code << 8),
        stdout,
        stderr,
    };
    Ok((output, first_stdout))
}

/// The launcher's connection, unless it ends first.
fn accept_from(listener: &OwnedFd, child: &mut Child) -> Result<OwnedFd> {
    rustix::net::sockopt::set_socket_timeout(
        listener,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(100)),
    )?;
    let start = Instant::now();
    loop {
        match turns::accept(listener) {
            Ok(control) => return Ok(control),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => bail!("accept: {e}"),
        }
        if let Some(status) = child.try_wait()? {
            bail!("the launcher ended before it connected ({status})");
        }
        if start.elapsed() > CONNECT_TIMEOUT {
            bail!("the launcher did not connect");
        }
    }
}

/// The launcher's freezer group, if it made one.
fn hello(control: &OwnedFd) -> Result<Option<Freezer>> {
    match turns::read_hello(control)? {
        Some(Hello::Freezer(freezer)) => Ok(Some(freezer.checked()?)),
        Some(Hello::NoFreezer { .. }) => Ok(None),
        None => bail!("the launcher ended before the sandbox was built"),
    }
}

/// Freezes the sandbox, waits until it is frozen, thaws it.
fn freeze_and_thaw(freezer: Option<&Freezer>) -> Result<()> {
    let Some(freezer) = freezer else {
        return Ok(());
    };
    freezer.freeze().context("freeze the warm sandbox")?;
    let start = Instant::now();
    while !freezer.is_frozen()? {
        if start.elapsed() > CONNECT_TIMEOUT {
            bail!("the warm sandbox did not freeze");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    freezer.thaw().context("thaw the warm sandbox")
}

/// One turn: its stdout (read to the end, which comes once every process
/// of the turn is gone) and its exit code.
fn turn(control: &OwnedFd, request: &TurnRequest) -> Result<(Vec<u8>, i32)> {
    let (mut read, write) = std::io::pipe()?;
    let null = std::fs::File::open("/dev/null")?;
    turns::send_request(
        control,
        request,
        [null.as_fd(), write.as_fd(), rustix::stdio::stderr()],
    )?;
    drop(write);
    let mut stdout = Vec::new();
    read.read_to_end(&mut stdout)?;
    match turns::read_reply(control)? {
        Some(TurnReply::Ended { code }) => Ok((stdout, code)),
        Some(TurnReply::Refused { reason }) => bail!("the turn was refused: {reason}"),
        None => bail!("the warm sandbox ended during the turn"),
    }
}

/// The launcher's own words when the sandbox never served a turn: read as
/// a cold launch that failed (its exit code and stderr).
fn ended_early(child: Child, why: anyhow::Error) -> Result<Output> {
    let waited = child.wait_with_output().context("the launcher")?;
    ended_early_output(waited, why)
}

fn ended_early_output(mut waited: Output, why: anyhow::Error) -> Result<Output> {
    waited
        .stderr
        .extend_from_slice(format!("warm sandbox: {why}\n").as_bytes());
    Ok(waited)
}
