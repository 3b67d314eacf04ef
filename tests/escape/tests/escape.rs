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
//!
//! This file is the harness (`Case`, the `attack!` macro, helpers); the
//! attacks are in escape/, one module per area: files, kernel (namespaces,
//! processes, denied interfaces), network (and the proxy), environment,
//! lifetime (limits, the tree's death, exit codes), usability, backends,
//! and what the command could leave on the host: hostside, git, hostuid.

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

/// The probe (crates/probe), built beside the launcher by
/// `cargo build --workspace` (scripts/test builds before it tests).
fn probe_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/escape-HASH -> target/debug/substrat-probe
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let probe = dir.join("substrat-probe");
    assert!(
        probe.is_file(),
        "{} is missing: run `cargo build --workspace` first",
        probe.display()
    );
    probe
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

#[path = "escape/files.rs"]
mod files;

#[path = "escape/kernel.rs"]
mod kernel;

#[path = "escape/network.rs"]
mod network;

#[path = "escape/environment.rs"]
mod environment;

#[path = "escape/lifetime.rs"]
mod lifetime;

#[path = "escape/usability.rs"]
mod usability;

#[path = "escape/backends.rs"]
mod backends;

// What the command leaves on the host, and whose ids it runs as.

#[path = "escape/hostside.rs"]
mod hostside;

#[path = "escape/git.rs"]
mod git;

#[path = "escape/hostuid.rs"]
mod hostuid;
