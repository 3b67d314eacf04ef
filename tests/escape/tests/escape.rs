//! The escape suite: each test runs a real `substrat-sandbox run` in a fresh
//! process with the `substrat-probe` binary inside, attempts one attack,
//! and asserts the exact outcome the probe reports (errno, signal, value).
//!
//! Every attack runs four times: with the native and the bwrap backend, each
//! as the invoking user (root in CI) and as an unprivileged user (nobody,
//! through `setpriv`), with the same expected outcome: an attack whose
//! outcome differs between backends fails. Without root the nobody variants
//! cannot switch users: they fail, unless SUBSTRAT_ESCAPE_SKIP_UNPRIVILEGED=1
//! is set, in which case they print `SKIPPED <test>: <reason>` and return.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
/// A wrapper that runs what follows it as nobody (setpriv execs it).
const AS_NOBODY: [&str; 5] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Invoker,
    Nobody,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn probe_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_substrat-probe"))
}

/// The launcher, built by the same `cargo test --workspace` run.
fn launcher() -> PathBuf {
    let path = probe_bin().with_file_name("substrat-sandbox");
    // The bwrap backend's helper beside it (it refuses another build's).
    let helper = path.with_file_name("substrat-init");
    assert!(
        path.is_file() && helper.is_file(),
        "{} or {} not built: run `cargo build --workspace` first",
        path.display(),
        helper.display()
    );
    path
}

fn policy(name: &str) -> String {
    let file = repo()
        .join("tests/escape/policies")
        .join(format!("{name}.toml"));
    if file.is_file() {
        file.display().to_string()
    } else {
        name.to_string()
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the variant can run here; never a silent pass.
fn runnable(who: Who, test: &str) -> bool {
    if who == Who::Invoker || is_root() {
        return true;
    }
    if std::env::var_os("SUBSTRAT_ESCAPE_SKIP_UNPRIVILEGED").is_some() {
        println!("SKIPPED {test}: not root, cannot switch to nobody");
        return false;
    }
    panic!(
        "{test} needs root to switch to nobody; set SUBSTRAT_ESCAPE_SKIP_UNPRIVILEGED=1 to skip it (reported)"
    );
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Native,
    Bwrap,
}

impl Backend {
    fn arg(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::Bwrap => "bwrap",
        }
    }
}

/// A fresh workspace with the probe in it, owned by whoever runs the
/// sandbox. As nobody, cgroups delegated to nobody too: the shipped
/// policies require their limits, as an operator would set it up.
struct Case {
    backend: Backend,
    who: Who,
    ws: tempfile::TempDir,
    /// The agent's git state (`--git-state`), outside the workspace.
    git_state: tempfile::TempDir,
    delegation: Option<Delegation>,
}

impl Case {
    fn new(backend: Backend, who: Who) -> Self {
        let ws = tempfile::Builder::new()
            .prefix("substrat-escape-")
            .tempdir()
            .unwrap();
        std::fs::copy(probe_bin(), ws.path().join("substrat-probe")).unwrap();
        let delegation = Delegation::for_nobody(who, &["memory", "pids", "cpu"]);
        let git_state = tempfile::Builder::new()
            .prefix("substrat-escape-git-")
            .tempdir()
            .unwrap();
        let case = Case {
            backend,
            who,
            ws,
            git_state,
            delegation,
        };
        case.fix_ownership();
        case
    }

    fn path(&self) -> &Path {
        self.ws.path()
    }

    fn fix_ownership(&self) {
        if self.who == Who::Nobody {
            for entry in walk(self.path())
                .into_iter()
                .chain(walk(self.git_state.path()))
            {
                std::os::unix::fs::lchown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
            }
        }
        std::fs::set_permissions(self.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn command(&self, policy_name: &str, argv: &[&str]) -> Command {
        self.command_with(policy_name, &[], argv)
    }

    /// `substrat-sandbox run --policy P --workspace W [launcher_args] -- argv`.
    fn command_with(
        &self,
        policy_name: &str,
        launcher_args: &[&std::ffi::OsStr],
        argv: &[&str],
    ) -> Command {
        let mut cmd = match self.who {
            Who::Invoker => Command::new(launcher()),
            Who::Nobody => {
                let mut c = Command::new(AS_NOBODY[0]);
                c.args(&AS_NOBODY[1..]).arg(launcher());
                c
            }
        };
        cmd.arg("run")
            .arg("--backend")
            .arg(self.backend.arg())
            .arg("--policy")
            .arg(policy(policy_name))
            .arg("--workspace")
            .arg(self.path())
            .arg("--git-state")
            .arg(self.git_state.path());
        cmd.args(launcher_args).arg("--");
        cmd.args(argv).current_dir("/").stdin(Stdio::null());
        if let Some(delegation) = &self.delegation {
            cmd.env("SUBSTRAT_CGROUP_PARENT", &delegation.name);
        }
        cmd
    }

    fn run(&self, policy_name: &str, argv: &[&str]) -> Output {
        self.command(policy_name, argv).output().unwrap()
    }

    /// Runs one probe and returns what it reported.
    fn probe_with(&self, policy_name: &str, args: &[&str]) -> String {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(args);
        outcome_of(&mut self.command(policy_name, &argv))
    }

    fn probe(&self, args: &[&str]) -> String {
        self.probe_with("worker", args)
    }
}

/// Runs a launcher command around a probe and returns the probe's outcome.
fn outcome_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix("OUTCOME ")) {
        Some(outcome) => outcome.to_string(),
        None => panic!(
            "the probe reported nothing (exit {:?})\nstdout: {stdout}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `inner` (a launcher or probe command) run by `wrapper` (a program and
/// its first arguments that end by exec'ing the rest), from /, stdin closed.
fn run_through(wrapper: &[&std::ffi::OsStr], inner: &Command) -> Command {
    let mut cmd = Command::new(wrapper[0]);
    cmd.args(&wrapper[1..])
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir("/")
        .stdin(Stdio::null());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    cmd
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    if root.is_dir() && !root.is_symlink() {
        for entry in std::fs::read_dir(root).unwrap() {
            out.extend(walk(&entry.unwrap().path()));
        }
    }
    out
}

/// Host processes whose command line contains `marker`.
fn host_processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

fn reversed(s: &str) -> String {
    s.chars().rev().collect()
}

/// Declares one attack as four tests: `native_as_invoker`,
/// `native_as_nobody`, `bwrap_as_invoker`, `bwrap_as_nobody`.
macro_rules! attack {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            fn attempt(backend: Backend, who: Who, variant: &str) {
                if runnable(who, &format!("{}::{variant}", stringify!($name))) {
                    let body: fn(Case) = $body;
                    body(Case::new(backend, who));
                }
            }
            #[test]
            fn native_as_invoker() {
                attempt(Backend::Native, Who::Invoker, "native_as_invoker");
            }
            #[test]
            fn native_as_nobody() {
                attempt(Backend::Native, Who::Nobody, "native_as_nobody");
            }
            #[test]
            fn bwrap_as_invoker() {
                attempt(Backend::Bwrap, Who::Invoker, "bwrap_as_invoker");
            }
            #[test]
            fn bwrap_as_nobody() {
                attempt(Backend::Bwrap, Who::Nobody, "bwrap_as_nobody");
            }
        }
    };
}

// ---------------------------------------------------------------- files

attack!(read_planted_secret_outside_workspace, |case| {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "s3cret").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        case.probe(&["read", secret.to_str().unwrap()]),
        "errno:ENOENT"
    );
    assert_eq!(case.probe(&["read", "/etc/passwd"]), "errno:ENOENT");
    // The probe can read what it should: the attack path is real.
    assert_eq!(case.probe(&["read", "./substrat-probe"]), "ok");
});

attack!(write_outside_workspace, |case| {
    assert_eq!(
        case.probe(&["write", "/usr/bin/substrat-pwned"]),
        "errno:EROFS"
    );
    assert_eq!(case.probe(&["write", "/etc/substrat-pwned"]), "errno:EROFS");
    assert_eq!(case.probe(&["write", "/substrat-pwned"]), "errno:EROFS");
    assert!(!Path::new("/usr/bin/substrat-pwned").exists());
    // The workspace itself is writable, so the probe's writes do work.
    assert_eq!(case.probe(&["write", "allowed.txt"]), "ok");
    assert_eq!(
        std::fs::read_to_string(case.path().join("allowed.txt")).unwrap(),
        "pwned"
    );
});

attack!(write_existing_protected_file, |case| {
    std::fs::create_dir_all(case.path().join(".cursor")).unwrap();
    std::fs::write(case.path().join(".cursor/mcp.json"), "{}").unwrap();
    case.fix_ownership();
    assert_eq!(case.probe(&["write", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["append", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["write", ".cursor/other.json"]), "errno:EROFS");
    assert_eq!(
        std::fs::read_to_string(case.path().join(".cursor/mcp.json")).unwrap(),
        "{}"
    );
});

attack!(create_missing_protected_files, |case| {
    assert_eq!(case.probe(&["write", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["mkdir", ".cursor/x"]), "errno:EROFS");
    assert!(!case.path().join(".cursor/mcp.json").exists());
});

attack!(replace_protected_dir, |case| {
    assert_eq!(case.probe(&["remove-dir", ".cursor"]), "errno:EBUSY");
    assert_eq!(
        case.probe(&["rename", ".cursor", "cursor-old"]),
        "errno:EBUSY"
    );
    assert_eq!(
        case.probe(&["symlink", "/tmp", ".cursor/link"]),
        "errno:EROFS"
    );
    // The workspace's `.git` is the agent's own git dir, mounted: it cannot
    // be renamed away or replaced either.
    assert_eq!(case.probe(&["rename", ".git", "git-old"]), "errno:EBUSY");
    assert_eq!(case.probe(&["remove-dir", ".git"]), "errno:EBUSY");
    // Nothing got through: the mount point was removed after the run, empty.
    assert!(!case.path().join(".cursor").exists() && !case.path().join(".cursor").is_symlink());
});

attack!(protected_symlink_planted_before_launch, |case| {
    std::fs::create_dir_all(case.path().join("evil")).unwrap();
    std::os::unix::fs::symlink("evil", case.path().join(".cursor")).unwrap();
    case.fix_ownership();
    let out = case.run("worker", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".cursor is a symlink"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("OUTCOME"),
        "nothing may run"
    );
    // A `.git` that is a symlink (to a git dir the agent made) is refused too.
    std::fs::remove_file(case.path().join(".cursor")).unwrap();
    std::os::unix::fs::symlink("evil", case.path().join(".git")).unwrap();
    case.fix_ownership();
    let out = case.run("worker", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".git is a symlink"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("OUTCOME"));
});

// ---------------------------------------------------------------- namespaces and processes

attack!(nested_user_namespace, |case| {
    assert_eq!(case.probe(&["unshare-user"]), "errno:EPERM");
    assert_eq!(case.probe(&["clone-newuser"]), "errno:EPERM");
    assert_eq!(case.probe(&["clone3"]), "errno:ENOSYS");
});

attack!(ptrace_and_process_memory, |case| {
    assert_eq!(case.probe(&["ptrace-attach", "1"]), "errno:EPERM");
    assert_eq!(case.probe(&["ptrace-parent"]), "errno:EPERM");
    assert_eq!(case.probe(&["process-vm-writev"]), "errno:EPERM");
});

attack!(host_processes_invisible_and_unsignalable, |case| {
    let marker = unique("substrat-host-marker");
    let mut host = Command::new("sleep");
    std::os::unix::process::CommandExt::arg0(&mut host, &marker);
    let mut host = host.arg("30").spawn().unwrap();
    let host_pid = host.id() as i32;
    wait_until(
        "the marker to be findable on the host",
        Duration::from_secs(5),
        || host_processes_with(&marker) == [host_pid],
    );
    let seen = case.probe(&["proc-scan", &reversed(&marker)]);
    let count: usize = seen.rsplit(':').next().unwrap().parse().unwrap();
    assert!(seen.starts_with("value:absent:") && count <= 3, "{seen}");
    assert_eq!(case.probe(&["kill", &host.id().to_string()]), "errno:ESRCH");
    host.kill().unwrap();
    host.wait().unwrap();
});

attack!(capabilities_and_no_new_privs, |case| {
    // The backend really is the one asked for: pid 1 is bwrap's init, or ours.
    let init = match case.backend {
        Backend::Native => "value:substrat-sandbo",
        Backend::Bwrap => "value:bwrap",
    };
    assert_eq!(case.probe(&["comm", "1"]), init);
    let zero = "0000000000000000";
    let want = format!(
        "value:CapInh={zero},CapPrm={zero},CapEff={zero},CapBnd={zero},CapAmb={zero},NoNewPrivs=1,Seccomp=2"
    );
    assert_eq!(case.probe(&["status"]), want);
});

attack!(kernel_interfaces_denied, |case| {
    for attack in [
        ["io-uring-setup"],
        ["keyctl"],
        ["add-key"],
        ["bpf"],
        ["perf-event-open"],
        ["userfaultfd"],
        ["mount-tmpfs"],
    ] {
        assert_eq!(case.probe(&attack), "errno:EPERM", "{attack:?}");
    }
});

attack!(foreign_syscall_abis_killed, |case| {
    assert_eq!(case.probe(&["int80"]), "signal:SIGSYS");
    assert_eq!(case.probe(&["x32-syscall"]), "signal:SIGSYS");
});

attack!(tiocsti_on_a_real_pty, |case| {
    let pty = nix::pty::openpty(None, None).unwrap();
    for variant in [&["tiocsti"][..], &["tiocsti", "high"]] {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(variant);
        let tty = std::fs::File::from(pty.slave.try_clone().unwrap());
        let outcome = outcome_of(case.command("worker", &argv).stdin(Stdio::from(tty)));
        assert_eq!(outcome, "errno:EPERM", "{variant:?}");
    }
    // Nothing was pushed into the terminal's input. (The slave stays open,
    // so an empty read of the master says EAGAIN, not EIO.)
    nix::fcntl::fcntl(
        &pty.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        nix::unistd::read(&pty.master, &mut buf),
        Err(nix::errno::Errno::EAGAIN)
    );
});

// ---------------------------------------------------------------- network

attack!(socket_families, |case| {
    for family in ["netlink", "packet", "vsock", "inet", "inet6"] {
        assert_eq!(case.probe(&["socket", family]), "errno:EPERM", "{family}");
    }
    assert_eq!(case.probe(&["socket", "inet", "garbage"]), "errno:EPERM");
    assert_eq!(case.probe(&["socket", "unix"]), "ok");
});

attack!(host_loopback_and_abstract_sockets, |case| {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    assert_eq!(case.probe(&["connect-tcp", &port]), "errno:EPERM");
    use std::os::linux::net::SocketAddrExt;
    let name = unique("substrat-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    // The host's abstract socket is reachable from the host...
    assert!(std::os::unix::net::UnixStream::connect_addr(&addr).is_ok());
    // ...but not from a sandbox with its own network namespace,
    assert_eq!(
        case.probe(&["connect-abstract", &name]),
        "errno:ECONNREFUSED"
    );
    // nor, through Landlock's scoping, from one sharing the host's network.
    assert_eq!(
        case.probe_with("host-network", &["connect-abstract", &name]),
        "errno:EPERM"
    );
});

// ---------------------------------------------------------------- environment

attack!(host_env_secret_invisible, |case| {
    let mut secret = case.command(
        "worker",
        &["./substrat-probe", "getenv", "SUBSTRAT_TEST_API_TOKEN"],
    );
    assert_eq!(
        outcome_of(secret.env("SUBSTRAT_TEST_API_TOKEN", "s3cret")),
        "value:unset"
    );
    // An allowed variable does pass: the probe reads the environment.
    let mut lang = case.command("worker", &["./substrat-probe", "getenv", "LANG"]);
    assert_eq!(outcome_of(lang.env("LANG", "C.UTF-8")), "value:set");
});

attack!(inherited_descriptor_to_a_host_secret_closed, |case| {
    // A careless parent leaves descriptor 7 open on a host file outside the
    // view; the sandboxed command must not get it (nor any of the
    // launcher's own descriptors: bind sources, the helper, pipes).
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "host secret").unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let leaking = |inner: &Command| {
        let script = "exec 7<\"$0\"; exec \"$@\"";
        run_through(
            &[
                "sh".as_ref(),
                "-c".as_ref(),
                script.as_ref(),
                secret.path().as_os_str(),
            ],
            inner,
        )
    };
    // The probe sees a leaked descriptor when nothing closes it...
    let direct = Command::new(case.path().join("substrat-probe"));
    let mut direct = leaking(&direct);
    direct.arg("open-fds");
    let seen = outcome_of(&mut direct);
    assert!(
        seen.starts_with("value:fds:") && seen.contains(&format!("7={}", secret.path().display())),
        "{seen}"
    );
    // ...and inside the sandbox there is none.
    let sandboxed = case.command("worker", &["./substrat-probe", "open-fds"]);
    assert_eq!(outcome_of(&mut leaking(&sandboxed)), "value:none");
});

attack!(command_starts_with_the_hosts_signal_dispositions, |case| {
    // The launcher and the bwrap helper are Rust programs, which ignore
    // SIGPIPE; an ignored signal survives exec, so the command would get
    // EPIPE errors where it dies quietly on the host (`yes | head -1`).
    // grep reads its own masks (the probe cannot: Rust ignores SIGPIPE
    // before its main).
    let masks = ["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"];
    let stdout = |out: Output| {
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = |shell: &str| {
        stdout(
            Command::new("sh")
                .args(["-c", shell, "sh"])
                .args(masks)
                .stdin(Stdio::null())
                .output()
                .unwrap(),
        )
    };
    // What this test's environment leaves ignored, with SIGPIPE's bit (12)
    // clear...
    let host = direct("exec \"$@\"");
    let ignored = |text: &str| {
        let hex = text
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .unwrap();
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    assert_eq!(ignored(&host) & (1 << 12), 0, "{host}");
    // ...grep does report an ignored SIGPIPE when its parent leaves one...
    let trapped = direct("trap '' PIPE; exec \"$@\"");
    assert_eq!(ignored(&trapped), ignored(&host) | (1 << 12), "{trapped}");
    // ...and the sandboxed command starts as the host's does: SIGPIPE not
    // ignored, nothing blocked...
    assert_eq!(stdout(case.run("worker", &masks)), host);
    // ...even when the launcher was started with SIGPIPE ignored and
    // SIGUSR1 (bit 9) blocked, which GNU env really does:
    let env = ["env", "--ignore-signal=PIPE", "--block-signal=USR1"].map(std::ffi::OsStr::new);
    let mut grep = Command::new(masks[0]);
    grep.args(&masks[1..]);
    let changed = stdout(run_through(&env, &grep).output().unwrap());
    assert!(
        changed.contains(&format!("SigBlk:\t{:016x}\n", 1 << 9)),
        "{changed}"
    );
    assert_eq!(ignored(&changed), ignored(&host) | (1 << 12), "{changed}");
    let launcher = case.command("worker", &masks);
    assert_eq!(stdout(run_through(&env, &launcher).output().unwrap()), host);
});

// ---------------------------------------------------------------- resources and lifetime

attack!(fork_bomb_stopped_by_pids_limit, |case| {
    let outcome = case.probe_with("limits", &["fork-bomb"]);
    let count: u64 = outcome.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        outcome.starts_with("value:EAGAIN:") && count < 64,
        "{outcome}"
    );
    // The host still forks.
    assert!(Command::new("true").status().unwrap().success());
});

attack!(double_fork_survivor_dies_with_the_command, |case| {
    let marker = unique("substrat-survivor");
    assert_eq!(
        case.probe(&["survivor", &reversed(&marker)]),
        "value:spawned"
    );
    wait_until("the survivor to be gone", Duration::from_secs(5), || {
        host_processes_with(&marker).is_empty()
    });
});

attack!(launcher_death_kills_the_tree, |case| {
    let marker = unique("substrat-orphan");
    let script = format!(
        "./substrat-probe survivor {}; exec ./substrat-probe sleep 60",
        reversed(&marker)
    );
    let mut launcher = case
        .command("worker", &["/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the survivor to start", Duration::from_secs(10), || {
        !host_processes_with(&marker).is_empty()
    });
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until(
        "the tree to die with the launcher",
        Duration::from_secs(5),
        || host_processes_with(&marker).is_empty(),
    );
});

attack!(sigterm_to_launcher_ends_the_tree, |case| {
    let marker = unique("substrat-sigterm");
    let script = format!(
        "./substrat-probe survivor {}; exec ./substrat-probe sleep 60",
        reversed(&marker)
    );
    let launcher = case
        .command("worker", &["/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the survivor to start", Duration::from_secs(10), || {
        !host_processes_with(&marker).is_empty()
    });
    // setpriv execs the launcher, so the child's pid is the launcher's either way.
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = launcher.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(128 + 15));
    wait_until("the tree to be gone", Duration::from_secs(5), || {
        host_processes_with(&marker).is_empty()
    });
});

// ---------------------------------------------------------------- exit codes and bad input

attack!(exit_codes_pass_through, |case| {
    assert_eq!(
        case.run("worker", &["/bin/sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    assert_eq!(
        case.run("worker", &["/bin/sh", "-c", "kill -TERM $$"])
            .status
            .code(),
        Some(128 + 15)
    );
    let out = case.run("worker", &["no-such-command-substrat"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no-such-command-substrat: command not found")
    );
});

attack!(missing_required_bind_source_refused, |case| {
    let out = case.run("missing-bind", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/substrat-required does not exist"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("OUTCOME"));
});

#[test]
fn missing_workspace_refused() {
    let out = Command::new(launcher())
        .args([
            "run",
            "--policy",
            "worker",
            "--workspace",
            "/nonexistent/substrat-ws",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/substrat-ws does not exist")
    );
}

// ---------------------------------------------------------------- memory, with cgroups delegated to nobody

/// Groups an administrator delegates to nobody (v1 hierarchies holding the
/// controller, as on hybrid hosts), removed when dropped (after the case's
/// sandboxes, and their groups, are gone). As the invoker (root) no
/// delegation is needed.
struct Delegation {
    name: String,
    dirs: Vec<PathBuf>,
}

impl Delegation {
    fn for_nobody(who: Who, controllers: &[&str]) -> Option<Delegation> {
        if who == Who::Invoker || !is_root() {
            return None;
        }
        let name = unique("substrat-escape");
        let mut dirs = Vec::new();
        for controller in controllers {
            let root = Path::new("/sys/fs/cgroup").join(controller);
            assert!(
                root.join("cgroup.procs").is_file(),
                "no cgroup v1 {controller} hierarchy to delegate on this host"
            );
            let dir = root.join(&name);
            std::fs::create_dir(&dir).unwrap();
            for entry in [dir.clone(), dir.join("cgroup.procs"), dir.join("tasks")] {
                std::os::unix::fs::chown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
            }
            dirs.push(dir);
        }
        Some(Delegation { name, dirs })
    }
}

impl Drop for Delegation {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

attack!(memory_hog_stopped_by_memory_limit, |case| {
    // The report goes into the workspace, which the launcher (root or nobody) may write.
    let report = case.path().join("report.json");
    let args = ["--report".as_ref(), report.as_os_str()];
    let mut cmd = case.command_with("limits", &args, &["./substrat-probe", "memory-hog", "1024"]);
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "the hog is killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("allocated"));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        report["cgroup"]["memory_max"]["status"], "applied",
        "{report:#}"
    );
    assert_eq!(report["exit_code"], 137);
    // The host is unaffected: it still allocates and forks.
    assert!(Command::new("true").status().unwrap().success());
});

// ---------------------------------------------------------------- usability under every shipped policy

const SHIPPED: [&str; 3] = ["worker", "reviewer", "strict"];

/// Runs `script` with sh under every shipped policy and returns stdout.
fn under_every_policy(case: &Case, script: &str, expected: &str) {
    for policy_name in SHIPPED {
        let out = case.run(policy_name, &["/bin/sh", "-c", script]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(expected),
            "{policy_name}: exit {:?}\nstdout: {stdout}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

attack!(usable_sh_and_coreutils, |case| {
    under_every_policy(
        &case,
        "mkdir -p /tmp/a && printf 'b\\na\\n' > /tmp/a/f && sort /tmp/a/f | head -1 && ls / | wc -l && cat /dev/null && date +%Y >/dev/null && echo coreutils-ok",
        "coreutils-ok",
    );
});

attack!(usable_python3_threads_and_subprocess, |case| {
    let script = r#"python3 -c 'import threading, subprocess
t = threading.Thread(target=print, args=("thread-ok",)); t.start(); t.join()
print(subprocess.run(["echo", "subprocess-ok"], capture_output=True, text=True).stdout.strip())'"#;
    under_every_policy(&case, script, "thread-ok\nsubprocess-ok");
});

attack!(usable_node, |case| {
    under_every_policy(
        &case,
        r#"node -e 'require("child_process").execFileSync("true"); console.log("node-ok")'"#,
        "node-ok",
    );
});

attack!(usable_git_init_and_commit, |case| {
    // In a subdirectory of the workspace where it is writable; the reviewer's
    // workspace is read-only, so there (and only there) in /tmp.
    let script = "base=$PWD; [ -w \"$base\" ] || base=/tmp; repo=$(mktemp -d \"$base/sub-XXXXXX\") && cd \"$repo\" && git init -q && echo a > a && git add a && git -c user.name=t -c user.email=t@example.com commit -qm first && git log --oneline | wc -l | sed 's/^/commits=/'";
    under_every_policy(&case, script, "commits=1");
});

// ---------------------------------------------------------------- backend choice

/// In a user namespace whose `max_user_namespaces` is 0, the native backend
/// cannot start; `auto` must then try bwrap (which, not being setuid, fails
/// the same way here) and say what each backend hit. The namespace is made
/// by nobody: its root is nobody on the host, so the launcher runs the
/// sandbox as that (host root's namespace would need root's subordinate ids).
#[test]
fn auto_backend_falls_back_to_bwrap_and_reports_both() {
    if !runnable(
        Who::Nobody,
        "auto_backend_falls_back_to_bwrap_and_reports_both",
    ) {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" run --backend auto --policy worker --workspace \"$1\" --git-state \"$1/.git-state\" -- true";
    let mut unshare = Command::new("unshare");
    unshare.args(["--user", "--map-root-user", "--", "sh", "-c", script]);
    let delegation = Delegation::for_nobody(Who::Nobody, &["memory", "pids", "cpu"]);
    if let Some(delegation) = &delegation {
        unshare.env("SUBSTRAT_CGROUP_PARENT", &delegation.name);
    }
    let as_nobody: Vec<&std::ffi::OsStr> = AS_NOBODY.iter().map(std::ffi::OsStr::new).collect();
    let out = run_through(&as_nobody, &unshare)
        .arg(launcher())
        .arg(ws.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("native backend: unshare: ENOSPC"),
        "{stderr}"
    );
    assert!(stderr.contains("bwrap backend:"), "{stderr}");
}

#[test]
fn bwrap_backend_without_bwrap_says_what_is_missing() {
    let ws = tempfile::tempdir().unwrap();
    let out = Command::new(launcher())
        .env("PATH", "/nonexistent")
        .args([
            "run",
            "--backend",
            "bwrap",
            "--policy",
            "worker",
            "--workspace",
        ])
        .arg(ws.path())
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs bubblewrap on PATH"));
}

#[test]
fn report_names_the_backend_and_why() {
    for (backend, reason) in [
        ("native", "requested: native"),
        ("bwrap", "requested: bwrap"),
        ("auto", "auto: user namespaces are available"),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let report = ws.path().join("report.json");
        let out = Command::new(launcher())
            .args([
                "run",
                "--backend",
                backend,
                "--policy",
                "worker",
                "--report",
            ])
            .arg(&report)
            .arg("--workspace")
            .arg(ws.path())
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let expected = if backend == "auto" { "native" } else { backend };
        assert_eq!(report["backend"], expected);
        assert!(
            report["backend_reason"]
                .as_str()
                .unwrap()
                .starts_with(reason),
            "{report:#}"
        );
        assert_eq!(report["landlock"]["status"], "full");
        assert_eq!(report["seccomp_filters_loaded"], 2);
        assert_eq!(report["nested_userns_blocked"], true);
    }
}

attack!(socket_families_hold_under_a_default_allow_profile, |case| {
    assert_eq!(
        case.probe_with("default-allow", &["bpf"]),
        "errno:EPERM",
        "the profile's own denial"
    );
    assert_eq!(
        case.probe_with("default-allow", &["socket", "inet", "garbage"]),
        "errno:EPERM"
    );
    assert_eq!(
        case.probe_with("default-allow", &["socket", "netlink"]),
        "errno:EPERM"
    );
    assert_eq!(case.probe_with("default-allow", &["socket", "unix"]), "ok");
    let out = case.run("default-allow", &["/bin/true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warning: seccomp rules naming syscalls this system does not know were skipped: no_such_syscall_substrat"), "{stderr}");
});

// ---------------------------------------------------------------- network = "proxy"

/// A host-side TCP server on loopback: answers each connection's first
/// line with `pong:<line>`. The proxy (outside the sandbox) can reach it;
/// the sandbox itself cannot.
fn pong_server() -> u16 {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let _ = reader.read_line(&mut line);
                let mut stream = stream;
                let _ = writeln!(stream, "pong:{}", line.trim());
            });
        }
    });
    port
}

/// A proxy policy in the case's workspace (the port is the test server's).
fn proxy_policy(case: &Case, name: &str, body: &str) -> String {
    let path = case.path().join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\n{body}\n"),
    )
    .unwrap();
    path.display().to_string()
}

/// The proxy's audit lines of one kind of event (`decision`, `closed`).
fn audit_lines(path: &Path, event: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event"] == event)
        .collect()
}

attack!(proxy_egress_only_to_allowed_hosts, |case| {
    let port = pong_server();
    let p = port.to_string();
    // The test-only settings: a resolver mapping names to loopback, and the
    // private-range refusal switched off (check reports both as critical).
    let open = proxy_policy(
        &case,
        "open",
        &format!(
            "allow = [\"allowed.test:{p}\", \"denied.test:{p}\"]\ndeny = [\"denied.test:{p}\"]\ntest_allow_private = true\ntest_hosts = {{ \"allowed.test\" = \"127.0.0.1\", \"denied.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}"
        ),
    );
    let audit = case.path().join("audit.log");
    let probe = |args: &[&str]| {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(args);
        let extra = [std::ffi::OsStr::new("--proxy-audit"), audit.as_os_str()];
        outcome_of(&mut case.command_with(&open, &extra, &argv))
    };
    // Through the proxy to the allowed name: a tunnel and a forward request.
    assert_eq!(
        probe(&["proxy-connect", "allowed.test", &p]),
        "value:200 pong:ping"
    );
    assert_eq!(
        probe(&["proxy-get", "allowed.test", &p, "/x"]),
        "value:pong:GET /x HTTP/1.1"
    );
    // Denied (deny wins over allow) and not allowed.
    assert_eq!(probe(&["proxy-connect", "denied.test", &p]), "value:403");
    assert_eq!(probe(&["proxy-connect", "other.test", &p]), "value:403");
    assert_eq!(probe(&["proxy-connect", "127.0.0.1", &p]), "value:403");
    // Around the proxy: no TCP but to the bridge (Landlock), and nothing
    // but loopback in the sandbox's network namespace anyway.
    assert_eq!(probe(&["connect-ip", "127.0.0.1", &p]), "errno:EACCES");
    assert_eq!(probe(&["connect-ip", "1.1.1.1", "443"]), "errno:EACCES");
    // The namespace alone (Landlock off): no route out, and the sandbox's
    // loopback is not the host's.
    let no_landlock = proxy_policy(&case, "no-landlock", "allow = [\"x.test\"]");
    let text = std::fs::read_to_string(&no_landlock).unwrap();
    std::fs::write(
        &no_landlock,
        text.replace(
            "network = \"proxy\"",
            "network = \"proxy\"\nlandlock = \"off\"",
        ),
    )
    .unwrap();
    let direct = |args: &[&str]| {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(args);
        outcome_of(&mut case.command(&no_landlock, &argv))
    };
    assert_eq!(
        direct(&["connect-ip", "1.1.1.1", "443"]),
        "errno:ENETUNREACH"
    );
    assert_eq!(
        direct(&["connect-ip", "127.0.0.1", &p]),
        "errno:ECONNREFUSED"
    );
    let lines = audit_lines(&audit, "decision");
    let decisions: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["host"].as_str().unwrap().to_string(),
                l["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("allowed.test", "allowed"),
            ("allowed.test", "allowed"),
            ("denied.test", "denied"),
            ("other.test", "denied"),
            ("127.0.0.1", "denied"),
        ]
        .map(|(h, d)| (h.to_string(), d.to_string()))
    );
    let closed = audit_lines(&audit, "closed");
    assert_eq!(closed.len(), 2, "the two allowed connections closed");
    assert!(
        closed[0]["bytes_up"].as_u64().unwrap() >= 5
            && closed[0]["bytes_down"].as_u64().unwrap() >= 10,
        "{}",
        closed[0]
    );
    assert!(
        lines[2]["reason"]
            .as_str()
            .unwrap()
            .contains("is denied by"),
        "{}",
        lines[2]
    );

    // With the private-range refusal on (the default), names that resolve
    // to loopback, private, link-local (cloud metadata) or IPv4-mapped
    // addresses are refused even when allowed.
    let strict = proxy_policy(
        &case,
        "strict",
        &format!(
            "allow = [\"loop.test:{p}\", \"ten.test:{p}\", \"meta.test:{p}\", \"mapped.test:{p}\"]\ntest_hosts = {{ \"loop.test\" = \"127.0.0.1\", \"ten.test\" = \"10.0.0.1\", \"meta.test\" = \"169.254.169.254\", \"mapped.test\" = \"::ffff:127.0.0.1\" }}"
        ),
    );
    // The system's resolver, not the test map: `localhost` resolves to
    // loopback and is refused though allowed.
    let real_dns = proxy_policy(&case, "real-dns", &format!("allow = [\"localhost:{p}\"]"));
    let audit_dns = case.path().join("audit-dns.log");
    let extra = [std::ffi::OsStr::new("--proxy-audit"), audit_dns.as_os_str()];
    let argv = ["./substrat-probe", "proxy-connect", "localhost", &p];
    assert_eq!(
        outcome_of(&mut case.command_with(&real_dns, &extra, &argv)),
        "value:403"
    );
    let dns = audit_lines(&audit_dns, "decision");
    let reason = dns[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("localhost resolves to ") && reason.ends_with("(loopback)"),
        "{reason}"
    );
    let audit_strict = case.path().join("audit-strict.log");
    for host in ["loop.test", "ten.test", "meta.test", "mapped.test"] {
        let extra = [
            std::ffi::OsStr::new("--proxy-audit"),
            audit_strict.as_os_str(),
        ];
        let argv = ["./substrat-probe", "proxy-connect", host, &p];
        assert_eq!(
            outcome_of(&mut case.command_with(&strict, &extra, &argv)),
            "value:403",
            "{host}"
        );
    }
    let reasons: Vec<String> = audit_lines(&audit_strict, "decision")
        .iter()
        .map(|l| l["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "loop.test resolves to 127.0.0.1, which is not a public address (loopback)",
            "ten.test resolves to 10.0.0.1, which is not a public address (private)",
            "meta.test resolves to 169.254.169.254, which is not a public address (link-local, cloud metadata)",
            "mapped.test resolves to ::ffff:127.0.0.1, which is not a public address (IPv4-mapped or -compatible)",
        ]
    );
});

// ---------------------------------------------------------------- what the command leaves on the host

#[path = "escape/hostside.rs"]
mod hostside;

#[path = "escape/git.rs"]
mod git;

#[path = "escape/hostuid.rs"]
mod hostuid;
