//! What the CLI's test binaries share: where the binary and the repository
//! are, and how an exit status reads. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

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
