//! `substrat-probe battery KEY=VALUE...`: every attack of `check --prove`,
//! each in a fresh child process of this probe (one that crashes, is
//! killed by seccomp or hangs costs only itself), one JSON line per attack
//! on stdout, then `{"done":true}`. Outcomes are raw (`ok`, `errno:EPERM`,
//! `value:...`, `signal:SIGKILL`, `timeout`, `not-attempted:<why>` when the
//! attack's target could not be set up): the prover outside judges held
//! or escaped, knowing the policy and what it set up on the host. Each
//! attack sets up what it needs (a target process, a terminal) and passes
//! valid arguments, so that an errno can only be a refusal.
//!
//! Keys (all set by the prover): `ws` the workspace, `outside` a host file
//! outside every bind, `outside_dir` its directory, `socket` a host Unix
//! socket, `abstract` a host abstract socket, `port` a host TCP port on
//! 127.0.0.1, `host_ip` a non-loopback host address listening on `port`
//! (may be empty), `marker` a host process's command-line marker,
//! `marker_pid` its host pid, `secret` a value only the launcher's
//! environment holds (reversed, so no command line holds it), `memory_mib` and `fsize` the limits to try;
//! `leave` and `look` a token for what lasts between turns (lasts.rs).

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One attack: its id and the probe command that performs it.
struct Attack {
    id: &'static str,
    argv: Vec<String>,
    timeout: Duration,
}

fn attack(id: &'static str, argv: &[&str]) -> Attack {
    Attack {
        id,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        timeout: Duration::from_secs(5),
    }
}

/// The attacks in the order they run: the limits last, since a fork bomb
/// leaves its children behind until the sandbox ends.
fn attacks(k: &BTreeMap<String, String>) -> Vec<Attack> {
    let get = |key: &str| k.get(key).map(String::as_str).unwrap_or("");
    let ws = get("ws");
    let in_ws = |rel: &str| format!("{ws}/{rel}");
    let outside_new = format!("{}/written-from-inside", get("outside_dir"));
    let mut list = vec![
        attack("read-outside", &["read", get("outside")]),
        attack("write-outside", &["write", &outside_new]),
        attack("write-system", &["write", "/usr/substrat-prove"]),
        attack("protected-write", &["write", &in_ws(".git/config")]),
        attack(
            "protected-create",
            &["write", &in_ws(".git/hooks/pre-commit")],
        ),
        attack(
            "protected-rename-over",
            &["rename-over", &in_ws("prove-decoy"), &in_ws(".git/config")],
        ),
        attack(
            "protected-symlink-swap",
            &["rename", &in_ws(".git/hooks"), &in_ws("hooks-moved")],
        ),
        attack("mcp-config-write", &["write", &in_ws(".cursor/mcp.json")]),
        attack("unix-socket", &["connect-unix-only", get("socket")]),
        attack("abstract-socket", &["connect-abstract", get("abstract")]),
        attack(
            "tcp-host-loopback",
            &["connect-ip", "127.0.0.1", get("port")],
        ),
        attack("socket-netlink", &["socket", "netlink"]),
        attack("socket-packet", &["socket", "packet"]),
        attack("socket-vsock", &["socket", "vsock"]),
        attack("userns", &["unshare-user"]),
        attack("clone-newuser", &["clone-newuser"]),
        attack("mount", &["mount-tmpfs"]),
        attack("capabilities", &["status"]),
        attack("ptrace", &["ptrace-child"]),
        attack("process-vm-writev", &["process-vm-writev-child"]),
        attack("process-visibility", &["proc-scan", get("marker")]),
        attack("signal-host", &["kill", get("marker_pid")]),
        attack("io-uring", &["io-uring-setup"]),
        attack("keyctl", &["keyctl"]),
        attack("bpf", &["bpf"]),
        attack("perf-event-open", &["perf-event-open"]),
        attack("userfaultfd", &["userfaultfd"]),
        attack("tiocsti", &["tiocsti-pty"]),
        attack("tiocsetd", &["tiocsetd-pty"]),
        attack("proc-secret", &["secret-scan", get("secret")]),
        attack("proc-mem", &["open-mem", "1"]),
        attack("setid-file", &["set-id-modes"]),
        attack("environment", &["env-names"]),
    ];
    if !get("host_ip").is_empty() {
        list.push(attack(
            "tcp-host-address",
            &["connect-ip", get("host_ip"), get("port")],
        ));
    }
    if !get("fsize").is_empty() {
        let home = std::env::var("HOME").unwrap_or_default();
        list.push(attack(
            "limit-fsize",
            &["fsize-write", get("fsize"), ws, "/tmp", &home],
        ));
    }
    if !get("memory_mib").is_empty() {
        let mut hog = attack("limit-memory", &["memory-hog", get("memory_mib")]);
        hog.timeout = Duration::from_secs(20);
        list.push(hog);
    }
    let mut bomb = attack("limit-pids", &["fork-bomb"]);
    bomb.timeout = Duration::from_secs(20);
    list.push(bomb);
    list
}

/// Runs every attack and prints its line; `args` are the KEY=VALUE pairs.
pub fn run(args: &[String]) {
    let keys: BTreeMap<String, String> = args
        .iter()
        .filter_map(|a| a.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // What lasts between turns: left before the attacks (the fork bomb
    // leaves no process to spare), looked for before this turn's own.
    if let Some(token) = keys.get("look") {
        crate::lasts::print("seen", &crate::lasts::look(token));
    }
    if let Some(token) = keys.get("leave") {
        crate::lasts::print("left", &crate::lasts::leave(token));
    }
    for attack in attacks(&keys) {
        let outcome = in_fresh_process(&attack);
        println!(
            "{{\"attack\":{},\"outcome\":{}}}",
            json_string(attack.id),
            json_string(&outcome)
        );
    }
    println!("{{\"done\":true}}");
}

/// The attack in a new process of this program: its `OUTCOME` line, how it
/// died, or `timeout`.
fn in_fresh_process(attack: &Attack) -> String {
    let child = Command::new("/proc/self/exe")
        .args(&attack.argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return format!("error:cannot start: {e}"),
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > attack.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return "timeout".into();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return format!("error:wait: {e}"),
        }
    };
    // What the attack wrote, without waiting for the end of the pipe: a
    // fork bomb's children hold its write end until the sandbox ends.
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let _ = fcntl(&stdout, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        out = String::from_utf8_lossy(&bytes).into_owned();
    }
    match out.lines().find_map(|l| l.strip_prefix("OUTCOME ")) {
        Some(outcome) => outcome.to_string(),
        None => {
            use std::os::unix::process::ExitStatusExt;
            match status.signal() {
                Some(signal) => format!("signal:{}", signal_name(signal)),
                None => format!("exit:{}", status.code().unwrap_or(-1)),
            }
        }
    }
}

fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|_| signal.to_string())
}

/// Probe commands only the battery uses.
pub fn primitive(args: &[String]) -> Option<String> {
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    Some(match a(0) {
        // Only the connection (the escape suite's connect-unix also talks).
        "connect-unix-only" => {
            crate::io_outcome(std::os::unix::net::UnixStream::connect(a(1)).map(drop))
        }
        // A file made inside, then renamed over a protected path.
        "rename-over" => crate::io_outcome(
            std::fs::write(a(1), b"decoy").and_then(|()| std::fs::rename(a(1), a(2))),
        ),
        // Whether the secret shows in any process's environment or command
        // line. It comes reversed, so no command line holding it matches.
        "secret-scan" => {
            let secret: String = a(1).chars().rev().collect();
            let found = secret_in_proc(&secret);
            format!("value:{}", if found { "found" } else { "absent" })
        }
        // One byte at offset SIZE of a new file in the first writable of
        // DIRS: past the file size limit if it holds (EFBIG, or SIGXFSZ
        // where the signal is not ignored).
        "fsize-write" => {
            use std::os::unix::fs::FileExt;
            let offset: u64 = a(1).parse().unwrap_or(0);
            let place = args.iter().skip(2).find_map(|dir| {
                let path = std::path::Path::new(dir).join("substrat-prove-big");
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(&path)
                    .ok()?;
                Some((path, file))
            });
            match place {
                None => "value:nowhere-writable".into(),
                Some((path, file)) => {
                    let result = file.write_at(b"x", offset).map(drop);
                    let _ = std::fs::remove_file(path);
                    crate::io_outcome(result)
                }
            }
        }
        // Another process's memory through /proc (pid 1: the sandbox's
        // init or bwrap, which hold the launcher's memory).
        "open-mem" => {
            crate::io_outcome(std::fs::File::open(format!("/proc/{}/mem", a(1))).map(drop))
        }
        "env-names" => {
            let mut names: Vec<String> = std::env::vars_os()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect();
            names.sort();
            format!("value:{}", names.join(","))
        }
        _ => return None,
    })
}

fn secret_in_proc(secret: &str) -> bool {
    if secret.is_empty() {
        return false;
    }
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .any(|e| {
            ["environ", "cmdline"].iter().any(|file| {
                std::fs::read(e.path().join(file))
                    .is_ok_and(|bytes| String::from_utf8_lossy(&bytes).contains(secret))
            })
        })
}

pub fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
