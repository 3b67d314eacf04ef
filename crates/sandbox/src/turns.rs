//! Warm sandboxes: one sandbox serving many turns. After its setup, init
//! (already confined: mounts, Landlock, capabilities, no_new_privs,
//! rlimits, seccomp) does not start one command but waits on a control
//! socket for turn requests, and runs each request's command the way a cold
//! launch runs its own: a fork of init, so every restriction is inherited
//! unchanged, with the plan's working directory and environment (a request
//! may only give new values to variables the plan passes). When the command
//! ends, every other process of the pid namespace is killed before the
//! answer goes back, so nothing of one turn runs on into the next, and
//! (with an ipc namespace of the sandbox's own) its System V objects and
//! POSIX message queues are removed.
//!
//! The control socket is a Unix SOCK_SEQPACKET connection the launcher made
//! to the caller (the daemon): a request is one packet, a JSON object with
//! the command's stdin, stdout and stderr attached (SCM_RIGHTS); an answer
//! is one packet, a JSON object. Before any answer, the launcher sends one
//! packet of its own (`Hello`): the sandbox's freezer group, which the
//! caller freezes between turns (cgroup::Freezer), or why there is none.
//! The caller closing the socket ends the
//! sandbox. Init is not dumpable and the command gets only fds 0-2, so no
//! process of the sandbox can reach the socket.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

use crate::inside::{enter_dir, exec_command};
use crate::plan::LaunchPlan;
use crate::sys;

/// The largest request: a prompt travels in the command line, and one
/// argument may not exceed 128 KiB (MAX_ARG_STRLEN) anyway.
pub const MAX_REQUEST: usize = 160 << 10;

/// One turn: the command line, and new values for variables of the plan's
/// environment. Its stdin, stdout and stderr come attached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnRequest {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TurnReply {
    /// The command ended with this exit code (128 + N for signal N), and
    /// every process it left was killed.
    Ended { code: i32 },
    /// The request was not run, and why.
    Refused { reason: String },
}

/// The launcher's first packet, sent once the sandbox's groups are made
/// and before init starts (so before any answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Hello {
    /// Freeze the sandbox here between turns.
    Freezer(crate::cgroup::Freezer),
    /// The sandbox cannot be frozen, and why.
    NoFreezer { reason: String },
}

/// Sends the launcher's `Hello` (the launcher's side).
pub fn send_hello(control: impl AsFd, hello: &Hello) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(hello).map_err(std::io::Error::other)?;
    rustix::net::send(control, &bytes, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// For a warm sandbox (`options.turns`): its freezer group made, before
/// its first process is added (so everything in the sandbox is in it), and
/// told to the caller before init can answer anything (init waits for the
/// launcher's go). A sandbox that cannot be frozen still serves; the
/// caller is told why.
pub(crate) fn announce_freezer(
    groups: &mut crate::cgroup::SandboxCgroups,
    options: &crate::supervise::RunOptions,
) -> Result<(), String> {
    let Some(control) = &options.turns else {
        return Ok(());
    };
    let hello = match groups.add_freezer(&options.name, options.cgroup_parent.as_ref()) {
        Ok(freezer) => Hello::Freezer(freezer),
        Err(reason) => Hello::NoFreezer { reason },
    };
    send_hello(control, &hello).map_err(|e| format!("the control socket: {e}"))
}

/// Reads the launcher's `Hello` (the caller's side, first); None when the
/// launcher ended before it sent one (it could not build the sandbox).
pub fn read_hello(control: impl AsFd) -> std::io::Result<Option<Hello>> {
    read_packet(control)
}

/// One JSON packet from the sandbox's side; None at the end.
fn read_packet<T: serde::de::DeserializeOwned>(control: impl AsFd) -> std::io::Result<Option<T>> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::io::read(control, &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    serde_json::from_slice(&buf[..n])
        .map(Some)
        .map_err(std::io::Error::other)
}

/// Why a request packet is not a request.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("a request of {0} bytes is over the limit of {MAX_REQUEST}")]
    TooLarge(usize),
    #[error("the request is not valid: {0}")]
    Json(String),
    #[error("a request needs a command")]
    NoCommand,
    #[error("an argument or a variable holds a NUL byte")]
    Nul,
    #[error("variable `{0}` is not one the sandbox passes")]
    NotPassed(String),
    #[error("a request needs exactly 3 descriptors (stdin, stdout, stderr), not {0}")]
    Descriptors(usize),
}

/// Parses one request packet; the environment is checked against the plan
/// by `turn_env`.
pub fn parse_request(packet: &[u8]) -> Result<TurnRequest, RequestError> {
    if packet.len() > MAX_REQUEST {
        return Err(RequestError::TooLarge(packet.len()));
    }
    let request: TurnRequest =
        serde_json::from_slice(packet).map_err(|e| RequestError::Json(e.to_string()))?;
    if request.argv.is_empty() || request.argv[0].is_empty() {
        return Err(RequestError::NoCommand);
    }
    let strings = request
        .argv
        .iter()
        .chain(request.env.iter().flat_map(|(k, v)| [k, v]));
    if strings.into_iter().any(|s| s.contains('\0')) {
        return Err(RequestError::Nul);
    }
    Ok(request)
}

/// The turn's environment: the plan's, with the request's values for
/// variables the plan passes. A variable the plan does not pass is refused:
/// a warm turn's environment is never wider than a cold launch's.
pub fn turn_env(
    plan_env: &[(String, String)],
    request: &TurnRequest,
) -> Result<Vec<(String, String)>, RequestError> {
    let mut env = plan_env.to_vec();
    for (name, value) in &request.env {
        let Some(slot) = env.iter_mut().find(|(k, _)| k == name) else {
            return Err(RequestError::NotPassed(name.clone()));
        };
        slot.1 = value.clone();
    }
    Ok(env)
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// The launcher's side: connects to the caller's control socket at `path`.
pub fn connect(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let socket = seqpacket()?;
    rustix::net::connect(&socket, &rustix::net::SocketAddrUnix::new(path)?)?;
    Ok(socket)
}

/// The caller's side: a control socket listening at `path`.
pub fn listen(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let socket = seqpacket()?;
    rustix::net::bind(&socket, &rustix::net::SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&socket, 16)?;
    Ok(socket)
}

/// The caller's side: the next launcher's connection.
pub fn accept(listener: impl AsFd) -> std::io::Result<OwnedFd> {
    Ok(rustix::net::accept_with(
        listener,
        rustix::net::SocketFlags::CLOEXEC,
    )?)
}

/// Sends a request with the command's stdio (the caller's side).
pub fn send_request(
    control: impl AsFd,
    request: &TurnRequest,
    stdio: [std::os::fd::BorrowedFd<'_>; 3],
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control_buffer = SendAncillaryBuffer::new(&mut space);
    control_buffer.push(SendAncillaryMessage::ScmRights(&stdio));
    rustix::net::sendmsg(
        control,
        &[IoSlice::new(&bytes)],
        &mut control_buffer,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Reads one answer (the caller's side); None when the sandbox has ended.
pub fn read_reply(control: impl AsFd) -> std::io::Result<Option<TurnReply>> {
    read_packet(control)
}

/// One packet from the caller: its bytes and the descriptors attached; None
/// at the end of the connection.
fn receive(control: &OwnedFd) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_REQUEST + 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        control,
        &mut [IoSliceMut::new(&mut buf)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    // A cut packet or cut descriptors: refused whole, never run in part.
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Ok(Some((Vec::new(), fds)));
    }
    buf.truncate(received.bytes.min(MAX_REQUEST + 1));
    Ok(Some((buf, fds)))
}

fn answer(control: &OwnedFd, reply: &TurnReply) -> bool {
    let Ok(bytes) = serde_json::to_vec(reply) else {
        return false;
    };
    rustix::net::send(control, &bytes, SendFlags::NOSIGNAL).is_ok()
}

/// What every turn's command starts with: the plan's environment and
/// working directory; and what is cleared after each turn.
#[derive(Debug)]
pub(crate) struct TurnContext {
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The sandbox has an ipc namespace of its own: its System V objects
    /// and POSIX message queues are removed after every turn (never in a
    /// namespace shared with the host).
    pub own_ipc: bool,
    /// The namespace's mqueue filesystem, opened before Landlock
    /// (`sys::open_detached_mqueue`): the queues to remove are read there.
    pub mqueue: Option<OwnedFd>,
}

impl TurnContext {
    pub(crate) fn of(plan: &LaunchPlan, mqueue: Option<OwnedFd>) -> Self {
        Self {
            env: plan.env.clone(),
            cwd: plan.cwd.clone(),
            own_ipc: plan.namespaces.ipc,
            mqueue,
        }
    }

    /// After a turn, every process ended: the ipc namespace's objects
    /// removed, so none is found by the next turn.
    fn clear_ipc(&self) {
        if !self.own_ipc {
            return;
        }
        sys::remove_sysv_ipc();
        if let Some(dir) = &self.mqueue {
            remove_message_queues(dir);
        }
    }
}

/// Unlinks every POSIX message queue listed in the mqueue filesystem `dir`.
fn remove_message_queues(dir: &OwnedFd) {
    let Ok(dup) = dir.try_clone() else {
        return;
    };
    // The duplicate shares the offset: back to the start for each listing.
    let _ = nix::unistd::lseek(&dup, 0, nix::unistd::Whence::SeekSet);
    let Ok(mut listing) = nix::dir::Dir::from_fd(dup) else {
        return;
    };
    for entry in listing.iter().flatten() {
        let name = entry.file_name();
        if name != c"." && name != c".." {
            let _ = sys::mq_unlink(name);
        }
    }
}

/// The turn server's loop (native init, or the bwrap helper): a turn per
/// request until the caller hangs up. Returns the exit code to end with.
pub(crate) fn serve(
    control: &OwnedFd,
    context: &TurnContext,
    bridges: &[(TcpListener, PathBuf)],
) -> i32 {
    loop {
        let (packet, fds) = match receive(control) {
            Ok(Some(received)) => received,
            Ok(None) => return 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        let checked = parse_request(&packet).and_then(|request| {
            if fds.len() != 3 {
                return Err(RequestError::Descriptors(fds.len()));
            }
            let env = turn_env(&context.env, &request)?;
            Ok((request, env))
        });
        let reply = match checked {
            Ok((request, env)) => TurnReply::Ended {
                code: run_turn(control, context, bridges, &request.argv, &env, fds),
            },
            Err(e) => TurnReply::Refused {
                reason: e.to_string(),
            },
        };
        if !answer(control, &reply) {
            return 1;
        }
    }
}

/// One turn: the bridges and the command forked from init, the command
/// waited for, then every process of the namespace ended and its ipc
/// objects removed.
fn run_turn(
    control: &OwnedFd,
    context: &TurnContext,
    bridges: &[(TcpListener, PathBuf)],
    argv: &[String],
    env: &[(String, String)],
    stdio: Vec<OwnedFd>,
) -> i32 {
    // The bridges end with every turn (below), so each turn starts its own.
    for (listener, socket) in bridges {
        let Ok(listener) = listener.try_clone() else {
            continue;
        };
        if let Ok(ForkResult::Child) = sys::fork() {
            let _ = nix::unistd::close(control.as_raw_fd());
            crate::bridge::run(listener, socket.clone(), true)
        }
    }
    let command = match sys::fork() {
        Ok(ForkResult::Child) => command_main(control, &context.cwd, argv, env, &stdio),
        Ok(ForkResult::Parent { child }) => child,
        Err(_) => return crate::supervise::SETUP_FAILED,
    };
    drop(stdio);
    let code = reap_until(command);
    end_every_process();
    context.clear_ipc();
    code
}

/// The command of a turn: the request's stdio on 0-2, a session of its
/// own, the plan's working directory, then as a cold launch execs it.
fn command_main(
    control: &OwnedFd,
    cwd: &std::path::Path,
    argv: &[String],
    env: &[(String, String)],
    stdio: &[OwnedFd],
) -> ! {
    let _ = nix::unistd::close(control.as_raw_fd());
    let [stdin, stdout, stderr] = stdio else {
        sys::exit_now(126)
    };
    let onto = rustix::stdio::dup2_stdin(stdin)
        .and_then(|()| rustix::stdio::dup2_stdout(stdout))
        .and_then(|()| rustix::stdio::dup2_stderr(stderr));
    if onto.is_err() {
        sys::exit_now(126);
    }
    let _ = nix::unistd::setsid();
    enter_dir(cwd);
    exec_command(argv, env, false, None)
}

/// Reaps init's children until `command` ends: its exit code.
fn reap_until(command: Pid) -> i32 {
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                return 128 + signal as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return crate::supervise::SETUP_FAILED,
        }
    }
}

/// Kills every process of the pid namespace but the turn server, and reaps
/// them. kill(-1) reaches every process of the namespace except pid 1 and
/// the caller (natively the caller is pid 1; under bwrap, bwrap's own pid 1
/// stays, and the helper is a subreaper, so orphans come to it to be
/// reaped); repeated until none is left, so a process forked while the
/// signal went round is caught by the next round.
fn end_every_process() {
    loop {
        let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
        match waitpid(None::<Pid>, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_or_say_why_not() {
        assert_eq!(
            parse_request(br#"{"argv":["sh","-c","echo hi"],"env":[["TERM","dumb"]]}"#),
            Ok(TurnRequest {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                env: vec![("TERM".into(), "dumb".into())],
            })
        );
        assert_eq!(
            parse_request(br#"{"argv":[]}"#),
            Err(RequestError::NoCommand)
        );
        assert_eq!(
            parse_request(br#"{"argv":[""]}"#),
            Err(RequestError::NoCommand)
        );
        assert_eq!(
            parse_request(br#"{"argv":["a\u0000b"]}"#),
            Err(RequestError::Nul)
        );
        assert!(matches!(
            parse_request(br#"{"argv":["sh"],"cwd":"/"}"#),
            Err(RequestError::Json(_))
        ));
        assert_eq!(
            parse_request(&vec![b' '; MAX_REQUEST + 1]),
            Err(RequestError::TooLarge(MAX_REQUEST + 1))
        );
    }

    #[test]
    fn a_turn_sets_only_variables_the_plan_passes() {
        let plan_env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("TERM".to_string(), "xterm".to_string()),
        ];
        let request = |env: &[(&str, &str)]| TurnRequest {
            argv: vec!["sh".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        assert_eq!(
            turn_env(&plan_env, &request(&[("TERM", "dumb")])),
            Ok(vec![
                ("PATH".to_string(), "/usr/bin".to_string()),
                ("TERM".to_string(), "dumb".to_string()),
            ])
        );
        assert_eq!(
            turn_env(&plan_env, &request(&[("LD_PRELOAD", "/x.so")])),
            Err(RequestError::NotPassed("LD_PRELOAD".into()))
        );
    }
}
