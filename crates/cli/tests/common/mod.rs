//! What the CLI's test binaries share: where the binary and the repository
//! are, how an exit status reads, and `agent` commands against a daemon. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A loopback TCP port free now (for a daemon's listener in a test).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `substrat-sandbox` binary this test run built.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_substrat-sandbox")
}

/// The repository's root (policies, test fixtures).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The children of process `pid` (of its main thread), from /proc; none
/// once it is gone.
pub fn child_pids(pid: impl std::fmt::Display) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The exit code, or -1 for a process ended by a signal.
pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// `substrat-sandbox agent ARGS --json --state-dir STATE`: the parsed
/// answer, or what the failure printed (stdout, then stderr).
pub fn agent_json(state: &Path, args: &[&str]) -> Result<Value, String> {
    let out = Command::new(bin())
        .arg("agent")
        .args(args)
        .arg("--json")
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}")))
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// `git ARGS` in `dir` (a committer named), which must succeed: its stdout.
pub fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// PostgreSQL for the tests of daemons on it: SUBSTRAT_TEST_POSTGRES
/// names the database (CI: scripts/postgres); each test has a schema.
/// A schema of this test's own, dropped at the end.
pub struct Schema {
    pub base: String,
    pub name: String,
}

impl Schema {
    /// None, with the test reported skipped, when no database is given.
    pub fn new(test: &str) -> Option<Self> {
        let Ok(base) = std::env::var("SUBSTRAT_TEST_POSTGRES") else {
            println!("SKIPPED {test}: SUBSTRAT_TEST_POSTGRES names no database (scripts/postgres)");
            return None;
        };
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("t_{}_{n}", std::process::id());
        let schema = Schema { base, name };
        schema.psql_base(&format!(
            "DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0}",
            schema.name
        ));
        Some(schema)
    }

    /// The database's URL with this schema as the search path.
    pub fn url(&self) -> String {
        let join = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{join}options=-csearch_path%3D{}", self.base, self.name)
    }

    pub fn psql_base(&self, sql: &str) -> String {
        psql(&self.base, sql)
    }

    /// One value read in this schema.
    pub fn query(&self, sql: &str) -> String {
        psql(&self.url(), sql)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args([
                &self.base,
                "-qc",
                &format!("DROP SCHEMA {} CASCADE", self.name),
            ])
            .output();
    }
}

pub fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A parent group made (as root) in each v1 hierarchy the worker's limits
/// use, for `--cgroup-parent`; removed with what the launches left below
/// it when dropped.
pub struct ParentGroups {
    pub name: String,
    pub dirs: Vec<PathBuf>,
}

impl ParentGroups {
    pub fn make(what: &str) -> Self {
        let name = format!("substrat-test-{what}-{}", std::process::id());
        let mut dirs = Vec::new();
        for controller in ["pids", "memory", "cpu"] {
            let root = Path::new("/sys/fs/cgroup").join(controller);
            if root.join("cgroup.procs").is_file() {
                let dir = root.join(&name);
                std::fs::create_dir(&dir).unwrap();
                dirs.push(dir);
            }
        }
        ParentGroups { name, dirs }
    }

    /// Delegated to `uid` as scripts/delegate-cgroup does it (v1): the
    /// groups and the files a delegatee writes become its own.
    pub fn give_to(&self, uid: u32) {
        for dir in &self.dirs {
            for entry in [dir.clone(), dir.join("cgroup.procs"), dir.join("tasks")] {
                std::os::unix::fs::chown(&entry, Some(uid), Some(uid)).unwrap();
            }
        }
    }
}

impl Drop for ParentGroups {
    /// In every hierarchy: an engine (podman) makes the parent in those it
    /// uses besides ours.
    fn drop(&mut self) {
        let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten();
        for hierarchy in hierarchies.flatten() {
            let dir = hierarchy.path().join(&self.name);
            if dir.is_dir() {
                remove_groups(&dir);
            }
        }
    }
}

/// Removes a group and the groups below it, the deepest first (a group
/// still holding a process stays).
fn remove_groups(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_groups(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}
