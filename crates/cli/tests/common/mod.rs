//! What the CLI's test binaries share: where the binary and the repository
//! are, how an exit status reads, and `agent` commands against a daemon. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

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
