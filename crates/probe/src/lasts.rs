//! What lasts from one turn to the next (`check --prove --warm`): `leave
//! TOKEN` leaves one thing of each kind of substrat_battery::LASTS, `look
//! TOKEN` (the next turn, or the next cold launch) says which it finds and
//! removes them. One JSON line per kind: `{"left":KIND,"outcome":O}` with
//! `ok`, `errno:E`, `not-tmpfs` (a file place that is no tmpfs of the
//! sandbox's own: nothing is written there) or `not-attempted:<why>`;
//! `{"seen":KIND,"outcome":O}` with `seen`, `gone` or `errno:E`.
//!
//! The process and the abstract socket are one: `lasts hold TOKEN`,
//! started in a session of its own, listens on the socket until killed.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::sys::{cstring, syscall6};

/// `lasts leave|look|hold TOKEN`: true when it was one of these.
pub fn run(args: &[String]) -> bool {
    let token = args.get(1).map(String::as_str).unwrap_or("");
    match args.first().map(String::as_str) {
        Some("leave") => print("left", &leave(token)),
        Some("look") => print("seen", &look(token)),
        Some("hold") => hold(token),
        _ => return false,
    }
    true
}

/// One line per kind, as the battery prints its attacks.
pub fn print(key: &str, outcomes: &[(&'static str, String)]) {
    for (kind, outcome) in outcomes {
        println!(
            "{{\"{key}\":{},\"outcome\":{}}}",
            crate::battery::json_string(kind),
            crate::battery::json_string(outcome)
        );
    }
}

fn name(token: &str) -> String {
    format!("substrat-lasts-{token}")
}

/// The System V key of `token` (never IPC_PRIVATE).
fn key(token: &str) -> u64 {
    let hash = token.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    u64::from(hash & 0x7fff_ffff | 1)
}

/// Where each file kind is left: the directory, if there is one.
fn file_places() -> [(&'static str, Option<PathBuf>); 3] {
    [
        ("tmp-file", Some(PathBuf::from("/tmp"))),
        ("home-file", std::env::var_os("HOME").map(PathBuf::from)),
        ("shm-file", Some(PathBuf::from("/dev/shm"))),
    ]
}

fn errno(e: nix::errno::Errno) -> String {
    format!("errno:{e:?}")
}

const IPC_CREAT: u64 = libc::IPC_CREAT as u64;
const IPC_EXCL: u64 = libc::IPC_EXCL as u64;
const IPC_RMID: u64 = libc::IPC_RMID as u64;

/// Leaves one of each kind; the outcome of each attempt.
pub fn leave(token: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for (kind, dir) in file_places() {
        let outcome = match dir {
            None => "not-attempted:no HOME".to_string(),
            Some(dir) if !is_tmpfs(&dir) => "not-tmpfs".to_string(),
            Some(dir) => crate::io_outcome(std::fs::write(dir.join(name(token)), b"left")),
        };
        out.push((kind, outcome));
    }
    let k = key(token);
    let new = IPC_CREAT | IPC_EXCL | 0o600;
    let made = |r: crate::sys::SysResult| r.map_or_else(errno, |_| "ok".to_string());
    out.push((
        "sysv-shm",
        made(syscall6(libc::SYS_shmget, [k, 4096, new, 0, 0, 0])),
    ));
    out.push((
        "sysv-msg",
        made(syscall6(libc::SYS_msgget, [k, new, 0, 0, 0, 0])),
    ));
    out.push((
        "sysv-sem",
        made(syscall6(libc::SYS_semget, [k, 1, new, 0, 0, 0])),
    ));
    let queue = cstring(&name(token));
    let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u64;
    let mq = syscall6(
        libc::SYS_mq_open,
        [queue.as_ptr() as u64, flags, 0o600, 0, 0, 0],
    );
    if let Ok(fd) = mq {
        let _ = syscall6(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
    }
    out.push(("posix-mqueue", made(mq)));
    let (process, socket) = leave_holder(token);
    out.push(("process", process));
    out.push(("abstract-socket", socket));
    out
}

/// Starts `lasts hold TOKEN` (argv[0] the marker) and waits until its
/// socket answers.
fn leave_holder(token: &str) -> (String, String) {
    let spawned = Command::new("/proc/self/exe")
        .arg0(name(token))
        .args(["lasts", "hold", token])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        let outcome = crate::io_outcome(Err(e));
        return (
            outcome.clone(),
            format!("not-attempted:no process ({outcome})"),
        );
    }
    let start = Instant::now();
    loop {
        match connect(token) {
            Ok(()) => return ("ok".into(), "ok".into()),
            Err(e) if start.elapsed() > Duration::from_secs(3) => {
                return ("ok".into(), crate::io_outcome(Err(e)));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn connect(token: &str) -> std::io::Result<()> {
    let addr = SocketAddr::from_abstract_name(name(token).as_bytes())?;
    UnixStream::connect_addr(&addr).map(drop)
}

/// The holder: a session of its own, the socket, then sleep until killed
/// (two minutes at most).
fn hold(token: &str) {
    let _ = nix::unistd::setsid();
    let Ok(addr) = SocketAddr::from_abstract_name(name(token).as_bytes()) else {
        return;
    };
    let Ok(_listener) = UnixListener::bind_addr(&addr) else {
        return;
    };
    std::thread::sleep(Duration::from_secs(120));
}

fn is_tmpfs(dir: &std::path::Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// What of `leave`'s is here; each thing found is removed.
pub fn look(token: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for (kind, dir) in file_places() {
        let path = dir.map(|d| d.join(name(token)));
        let seen = path.as_ref().is_some_and(|p| p.exists());
        if let (true, Some(path)) = (seen, path) {
            let _ = std::fs::remove_file(path);
        }
        out.push((kind, seen_or_gone(seen)));
    }
    let k = key(token);
    let ipc = [
        ("sysv-shm", libc::SYS_shmget, libc::SYS_shmctl, [k, 0, 0]),
        ("sysv-msg", libc::SYS_msgget, libc::SYS_msgctl, [k, 0, 0]),
        ("sysv-sem", libc::SYS_semget, libc::SYS_semctl, [k, 0, 0]),
    ];
    for (kind, get, ctl, [a, b, c]) in ipc {
        let outcome = match syscall6(get, [a, b, c, 0, 0, 0]) {
            Ok(id) => {
                // semctl takes the semaphore number before the command.
                let args = match kind {
                    "sysv-sem" => [id as u64, 0, IPC_RMID, 0, 0, 0],
                    _ => [id as u64, IPC_RMID, 0, 0, 0, 0],
                };
                let _ = syscall6(ctl, args);
                "seen".to_string()
            }
            Err(nix::errno::Errno::ENOENT) => "gone".to_string(),
            Err(e) => errno(e),
        };
        out.push((kind, outcome));
    }
    let queue = cstring(&name(token));
    let mq = syscall6(
        libc::SYS_mq_open,
        [queue.as_ptr() as u64, libc::O_RDONLY as u64, 0, 0, 0, 0],
    );
    out.push((
        "posix-mqueue",
        match mq {
            Ok(fd) => {
                let _ = syscall6(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
                let _ = syscall6(libc::SYS_mq_unlink, [queue.as_ptr() as u64, 0, 0, 0, 0, 0]);
                "seen".to_string()
            }
            Err(nix::errno::Errno::ENOENT) => "gone".to_string(),
            Err(e) => errno(e),
        },
    ));
    // The socket first: it goes with the process.
    let socket = match connect(token) {
        Ok(()) => "seen".to_string(),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => "gone".to_string(),
        Err(e) => crate::io_outcome(Err(e)),
    };
    out.push(("process", seen_or_gone(kill_holders(token))));
    out.push(("abstract-socket", socket));
    out
}

fn seen_or_gone(seen: bool) -> String {
    match seen {
        true => "seen".into(),
        false => "gone".into(),
    }
}

/// Whether a holder of `token` runs (its argv[0]); each found is killed.
fn kill_holders(token: &str) -> bool {
    let marker = name(token);
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).next() == Some(marker.as_bytes()) {
            found.push(pid);
        }
    }
    for pid in &found {
        let _ = syscall6(
            libc::SYS_kill,
            [*pid as u64, libc::SIGKILL as u64, 0, 0, 0, 0],
        );
    }
    !found.is_empty()
}
