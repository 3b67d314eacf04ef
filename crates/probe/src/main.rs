//! substrat-probe: attempts one attack from inside a sandbox and prints the
//! exact outcome as one line, `OUTCOME <what>`: `ok`, `errno:ENAME`,
//! `signal:SIGNAME`, or `value:<text>`. The escape suite asserts on it;
//! `substrat-probe battery` runs every attack of `check --prove`;
//! `substrat-probe battery-version` names the battery it was built with.

mod battery;
mod hostside;
mod lasts;
mod sys;
mod targets;

use std::fs;
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::CommandExt;

use nix::errno::Errno;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::ForkResult;
use sys::{SysResult, cstring, ptr, syscall6};

fn outcome(result: SysResult) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("errno:{e:?}"),
    }
}

fn io_outcome(result: std::io::Result<()>) -> String {
    match result {
        Ok(()) => "ok".to_string(),
        // A timeout std measured itself (connect_timeout) carries no errno.
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut && e.raw_os_error().is_none() => {
            "errno:ETIMEDOUT".to_string()
        }
        Err(e) => match e.raw_os_error() {
            Some(code) => format!("errno:{:?}", Errno::from_raw(code)),
            None => format!("not-attempted:{e}"),
        },
    }
}

/// Runs `attack` in a child and reports how the child ended.
fn in_child(attack: impl FnOnce() -> i32) -> String {
    match sys::fork() {
        Ok(ForkResult::Child) => sys::exit_now(attack()),
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Signaled(_, signal, _)) => format!("signal:{signal:?}"),
            Ok(WaitStatus::Exited(_, code)) => format!("exit:{code}"),
            other => format!("value:wait {other:?}"),
        },
        Err(e) => format!("errno:{e:?}"),
    }
}

/// Sends `request` to the proxy bridge (127.0.0.1:3128). For a tunnel, the
/// status line is read, then `ping` is sent; the result is `value:<status>
/// <what came back>`.
fn through_proxy(request: &str, tunnel: bool) -> String {
    through_bridge(3128, request, tunnel)
}

/// A request to a bridged loopback port (3128 the proxy, 3129 the model
/// gateway); with `tunnel`, a CONNECT whose tunnel then carries a line.
fn through_bridge(port: u16, request: &str, tunnel: bool) -> String {
    use std::io::{BufRead, BufReader, Read};
    let mut stream = match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => return io_outcome(Err(e)),
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return io_outcome(Err(e));
    }
    if !tunnel {
        let mut all = String::new();
        let _ = stream.read_to_string(&mut all);
        return format!("value:{}", all.trim());
    }
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return io_outcome(Err(e)),
    });
    let mut status = String::new();
    let _ = reader.read_line(&mut status);
    let code = status.split(' ').nth(1).unwrap_or("none").to_string();
    if code != "200" {
        return format!("value:{code}");
    }
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    let _ = stream.write_all(b"ping\n");
    let mut answer = String::new();
    let _ = reader.read_line(&mut answer);
    format!("value:{code} {}", answer.trim())
}

fn loopback_echo(addr: &str) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader};
    let ip: std::net::IpAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let listener = std::net::TcpListener::bind((ip, 0))?;
    let port = listener.local_addr()?.port();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (stream, _) = listener.accept()?;
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line)?;
        (&stream).write_all(format!("echo:{line}").as_bytes())
    });
    let mut client = std::net::TcpStream::connect((ip, port))?;
    client.write_all(b"ping\n")?;
    let mut answer = String::new();
    BufReader::new(&client).read_line(&mut answer)?;
    server
        .join()
        .map_err(|_| std::io::Error::other("server thread panicked"))??;
    if answer == "echo:ping\n" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "unexpected answer {answer:?}"
        )))
    }
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or("")
}

fn num(args: &[String], i: usize) -> u64 {
    arg(args, i).parse().unwrap_or(0)
}

const CLONE_NEWUSER: u64 = 0x1000_0000;
const SIGCHLD: u64 = 17;

fn run(args: &[String]) -> String {
    let a = |i| arg(args, i);
    match a(0) {
        "read" => io_outcome(fs::read(a(1)).map(drop)),
        "write" => io_outcome(fs::write(a(1), b"pwned")),
        "append" => io_outcome(
            fs::OpenOptions::new()
                .append(true)
                .open(a(1))
                .and_then(|mut f| f.write_all(b"x")),
        ),
        "mkdir" => io_outcome(fs::create_dir(a(1))),
        "rename" => io_outcome(fs::rename(a(1), a(2))),
        "remove-dir" => io_outcome(fs::remove_dir_all(a(1))),
        "symlink" => io_outcome(std::os::unix::fs::symlink(a(1), a(2))),
        "unshare-user" => {
            outcome(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map(|_| 0))
        }
        "clone-newuser" => {
            // Raw clone: flags in the first argument, where seccomp can see them.
            match syscall6(libc::SYS_clone, [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0, 0]) {
                Ok(0) => sys::exit_now(0),
                Ok(pid) => {
                    let _ = waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
                    "ok".into()
                }
                Err(e) => format!("errno:{e:?}"),
            }
        }
        "clone3" => {
            // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls
            let args_struct: [u64; 8] = [CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0];
            match syscall6(libc::SYS_clone3, [ptr(&args_struct), 64, 0, 0, 0, 0]) {
                Ok(0) => sys::exit_now(0),
                Ok(_) => "ok".into(),
                Err(e) => format!("errno:{e:?}"),
            }
        }
        "ptrace-attach" => outcome(syscall6(
            libc::SYS_ptrace,
            [libc::PTRACE_ATTACH as u64, num(args, 1), 0, 0, 0, 0],
        )),
        "ptrace-parent" => {
            let parent = nix::unistd::getppid().as_raw() as u64;
            outcome(syscall6(
                libc::SYS_ptrace,
                [libc::PTRACE_ATTACH as u64, parent, 0, 0, 0, 0],
            ))
        }
        "process-vm-writev" => {
            let data = [0u8; 8];
            let local = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: 8,
            };
            let remote = libc::iovec {
                iov_base: 0x10000 as *mut libc::c_void,
                iov_len: 8,
            };
            let target = nix::unistd::getppid().as_raw() as u64;
            outcome(syscall6(
                libc::SYS_process_vm_writev,
                [target, ptr(&local), 1, ptr(&remote), 1, 0],
            ))
        }
        "tiocsti" => {
            let c = b'x';
            let high = if a(1) == "high" { 1u64 << 32 } else { 0 };
            outcome(syscall6(
                libc::SYS_ioctl,
                [0, libc::TIOCSTI | high, ptr(&c), 0, 0, 0],
            ))
        }
        "io-uring-setup" => {
            let params = [0u8; 120];
            outcome(syscall6(
                libc::SYS_io_uring_setup,
                [1, ptr(&params), 0, 0, 0, 0],
            ))
        }
        "socket" => {
            let (family, kind) = match a(1) {
                "netlink" => (libc::AF_NETLINK, libc::SOCK_RAW),
                "packet" => (libc::AF_PACKET, libc::SOCK_RAW),
                "vsock" => (libc::AF_VSOCK, libc::SOCK_STREAM),
                "inet" => (libc::AF_INET, libc::SOCK_STREAM),
                "inet6" => (libc::AF_INET6, libc::SOCK_STREAM),
                _ => (libc::AF_UNIX, libc::SOCK_STREAM),
            };
            let garbage = if a(2) == "garbage" {
                0xdead_0000_0000_0000u64
            } else {
                0
            };
            outcome(syscall6(
                libc::SYS_socket,
                [family as u64 | garbage, kind as u64, 0, 0, 0, 0],
            ))
        }
        "connect-abstract" => {
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(a(1).as_bytes());
            match addr {
                Ok(addr) => {
                    io_outcome(std::os::unix::net::UnixStream::connect_addr(&addr).map(drop))
                }
                Err(e) => format!("value:{e}"),
            }
        }
        // Connects to a Unix socket, says hello and waits for the peer's
        // answer (the peer reads this process's host credentials meanwhile).
        "connect-unix" => {
            use std::io::Read;
            let step = |what: &'static str| {
                move |e: std::io::Error| {
                    eprintln!("connect-unix: {what}: {e}");
                    e
                }
            };
            let talk = || -> std::io::Result<()> {
                let mut stream =
                    std::os::unix::net::UnixStream::connect(a(1)).map_err(step("connect"))?;
                stream
                    .set_read_timeout(Some(std::time::Duration::from_secs(120)))
                    .map_err(step("timeout"))?;
                stream.write_all(b"hello").map_err(step("write"))?;
                stream.read_exact(&mut [0u8; 2]).map_err(step("read"))
            };
            io_outcome(talk())
        }
        "connect-tcp" => {
            io_outcome(std::net::TcpStream::connect(("127.0.0.1", num(args, 1) as u16)).map(drop))
        }
        // A TCP server on the sandbox's own loopback (ADDR: 127.0.0.1 or
        // ::1), a client connecting to it, one line each way.
        "loopback-echo" => io_outcome(loopback_echo(a(1))),
        // A direct TCP connection to any address, bypassing the proxy.
        "connect-ip" => match a(1).parse::<std::net::IpAddr>() {
            Ok(ip) => io_outcome(
                std::net::TcpStream::connect_timeout(
                    &std::net::SocketAddr::new(ip, num(args, 2) as u16),
                    std::time::Duration::from_secs(3),
                )
                .map(drop),
            ),
            Err(e) => format!("value:{e}"),
        },
        // GET PATH from the model gateway's bridged port: its whole answer.
        "gateway-get" => through_bridge(
            3129,
            &format!(
                "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                a(1)
            ),
            false,
        ),
        // CONNECT HOST:PORT through the sandbox's proxy bridge; on 200 a
        // line goes through the tunnel and the answer comes back.
        "proxy-connect" => through_proxy(
            &format!(
                "CONNECT {}:{} HTTP/1.1\r\nHost: {}:{}\r\n\r\n",
                a(1),
                a(2),
                a(1),
                a(2)
            ),
            true,
        ),
        // A plain-HTTP forward request through the proxy.
        "proxy-get" => through_proxy(
            &format!(
                "GET http://{}:{}{} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                a(1),
                a(2),
                a(3),
                a(1)
            ),
            false,
        ),
        "proc-scan" => {
            // The marker comes reversed so our own command line cannot match.
            let marker: String = a(1).chars().rev().collect();
            let mut seen = 0;
            let mut found = false;
            for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .chars()
                    .all(|c| c.is_ascii_digit())
                {
                    seen += 1;
                    let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    found |= String::from_utf8_lossy(&cmdline).contains(&marker);
                }
            }
            format!("value:{}:{seen}", if found { "found" } else { "absent" })
        }
        "kill" => outcome(syscall6(libc::SYS_kill, [num(args, 1), 0, 0, 0, 0, 0])),
        "status" => {
            let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
            let keep = [
                "CapEff",
                "CapPrm",
                "CapBnd",
                "CapAmb",
                "CapInh",
                "NoNewPrivs",
                "Seccomp",
            ];
            let fields: Vec<String> = status
                .lines()
                .filter_map(|l| l.split_once(':'))
                .filter(|(k, _)| keep.contains(k))
                .map(|(k, v)| format!("{k}={}", v.trim()))
                .collect();
            format!("value:{}", fields.join(","))
        }
        "keyctl" => outcome(syscall6(libc::SYS_keyctl, [0, (-3i64) as u64, 0, 0, 0, 0])),
        "add-key" => {
            let (kind, desc, payload) = (cstring("user"), cstring("substrat"), [1u8; 4]);
            outcome(syscall6(
                libc::SYS_add_key,
                [
                    kind.as_ptr() as u64,
                    desc.as_ptr() as u64,
                    ptr(&payload),
                    4,
                    (-2i64) as u64,
                    0,
                ],
            ))
        }
        // Valid arguments throughout: where the call is admitted it works
        // (or the kernel's own policy refuses it), never EINVAL or EFAULT.
        "bpf" => {
            // BPF_MAP_CREATE of a one-entry array map: map_type 2 (array),
            // key_size 4, value_size 4, max_entries 1.
            let mut attr = [0u32; 32];
            attr[..4].copy_from_slice(&[2, 4, 4, 1]);
            outcome(syscall6(libc::SYS_bpf, [0, ptr(&attr), 128, 0, 0, 0]))
        }
        "perf-event-open" => {
            // A software CPU clock of this process only (pid 0, any cpu),
            // user space only: what perf_event_paranoid 2 allows anyone.
            let mut attr = [0u8; 128];
            attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
            attr[4..8].copy_from_slice(&128u32.to_ne_bytes()); // size
            // disabled, exclude_kernel, exclude_hv
            attr[40..48].copy_from_slice(&(1u64 | 1 << 5 | 1 << 6).to_ne_bytes());
            outcome(syscall6(
                libc::SYS_perf_event_open,
                [ptr(&attr), 0, u64::MAX, u64::MAX, 0, 0],
            ))
        }
        // UFFD_USER_MODE_ONLY: allowed unprivileged whatever
        // vm.unprivileged_userfaultfd says.
        "userfaultfd" => outcome(syscall6(
            libc::SYS_userfaultfd,
            [1 | libc::O_CLOEXEC as u64, 0, 0, 0, 0, 0],
        )),
        "mount-tmpfs" => {
            let (src, target, fs_type) = (cstring("tmpfs"), cstring("/tmp"), cstring("tmpfs"));
            outcome(syscall6(
                libc::SYS_mount,
                [
                    src.as_ptr() as u64,
                    target.as_ptr() as u64,
                    fs_type.as_ptr() as u64,
                    0,
                    0,
                    0,
                ],
            ))
        }
        "comm" => format!(
            "value:{}",
            fs::read_to_string(format!("/proc/{}/comm", a(1)))
                .unwrap_or_default()
                .trim()
        ),
        // Descriptors open in this process besides 0-2 (and the listing's own).
        "open-fds" => {
            let mut open = Vec::new();
            for entry in fs::read_dir("/proc/self/fd")
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                let target = fs::read_link(entry.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                // Only the listing's own descriptor: this process's fd directory.
                let listing = target == format!("/proc/{}/fd", std::process::id());
                if !["0", "1", "2"].contains(&name.as_str()) && !listing {
                    open.push(format!("{name}={target}"));
                }
            }
            if open.is_empty() {
                "value:none".into()
            } else {
                format!("value:fds:{}", open.join(","))
            }
        }
        "getenv" => format!(
            "value:{}",
            if std::env::var_os(a(1)).is_some() {
                "set"
            } else {
                "unset"
            }
        ),
        "fork-bomb" => {
            let mut count = 0u64;
            loop {
                match sys::fork() {
                    Ok(ForkResult::Child) => sys::pause(),
                    Ok(ForkResult::Parent { .. }) => count += 1,
                    Err(e) => return format!("value:{e:?}:{count}"),
                }
                if count >= 100_000 {
                    return format!("value:unbounded:{count}");
                }
            }
        }
        "memory-hog" => {
            let mut blocks: Vec<Vec<u8>> = Vec::new();
            for _ in 0..num(args, 1) / 16 {
                blocks.push(vec![1u8; 16 << 20]);
            }
            format!("value:allocated:{}MiB", blocks.len() * 16)
        }
        "survivor" => {
            // Double fork and a new session: the grandchild outlives us unless
            // the sandbox takes it down. Its marker comes reversed, so only
            // the grandchild's command line carries it.
            let marker: String = a(1).chars().rev().collect();
            match sys::fork() {
                Ok(ForkResult::Child) => {
                    let _ = nix::unistd::setsid();
                    if let Ok(ForkResult::Child) = sys::fork() {
                        let err = std::process::Command::new("/bin/sleep")
                            .arg0(&marker)
                            .arg("60")
                            .exec();
                        eprintln!("exec sleep: {err}");
                    }
                    sys::exit_now(0)
                }
                Ok(ForkResult::Parent { child }) => {
                    let _ = waitpid(child, None);
                    "value:spawned".into()
                }
                Err(e) => format!("errno:{e:?}"),
            }
        }
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(num(args, 1)));
            "value:slept".into()
        }
        #[cfg(target_arch = "x86_64")]
        "int80" => in_child(|| sys::int80_getpid() as i32),
        "x32-syscall" => in_child(|| match syscall6(39 | 0x4000_0000, [0; 6]) {
            Ok(_) => 0,
            Err(e) => e as i32,
        }),
        other => hostside::run(args)
            .or_else(|| targets::run(args))
            .unwrap_or_else(|| format!("value:unknown probe {other}")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("battery") => return battery::run(&args[1..]),
        Some("lasts") if lasts::run(&args[1..]) => return,
        // The prover runs a probe only when this line is its own.
        Some(substrat_battery::VERSION_COMMAND) => {
            return println!("{}", substrat_battery::version_line());
        }
        _ => {}
    }
    let result = battery::primitive(&args).unwrap_or_else(|| run(&args));
    println!("OUTCOME {result}");
}
