//! The substrat-sandbox binary, run as users run it: fresh processes, real
//! files, exit codes and outputs compared.

// A panic in a test helper is a failed test, not a crash of the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;
use common::*;

mod check;
mod file_binds;
mod homeless;
mod launch;
mod layer_depth;
mod layer_groups;
mod layer_modes;
mod layer_paths;
mod layer_review;
mod layers;
mod learn;
mod learn_attacks;
mod newcomer;
mod polish;
mod prove;
mod prove_probe;
mod proxy_private;
mod role_limits;
mod roles;
mod sockets;
mod terminal_text;
mod warm;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn substrat(args: &[&str]) -> Output {
    substrat_command(args).output().unwrap()
}

fn substrat_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"));
    command
        .args(args)
        .current_dir(repo())
        .env_remove("SUBSTRAT_POLICY_DIR")
        .env_remove("SUBSTRAT_SECCOMP_DIR")
        .env_remove("SUBSTRAT_PROBE");
    command
}

/// `substrat(args)` for a `check --prove`: with the probe built from this
/// source (`SUBSTRAT_PROBE`), whatever copy lies beside the binary.
fn substrat_proving(args: &[&str]) -> Output {
    substrat_command(args)
        .env("SUBSTRAT_PROBE", current_probe())
        .output()
        .unwrap()
}

/// The probe built from this source: `cargo build -p substrat-probe`, once
/// per test run, in this run's target directory and profile (cargo builds
/// the probe only for a workspace build, and scripts/static-probe's
/// static copy beside the binary may be older than the code). The prover
/// refuses a probe of another build anyway; this makes the tests judge by
/// the current one rather than fail for an old one.
fn current_probe() -> &'static Path {
    static PROBE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROBE.get_or_init(|| {
        // target/PROFILE-DIR/substrat-sandbox
        let dir = Path::new(bin()).parent().unwrap();
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev",
            Some(other) => other,
        };
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "substrat-probe", "--bin"])
            .args(["substrat-probe", "--profile", profile, "--target-dir"])
            .arg(dir.parent().unwrap())
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cargo build -p substrat-probe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir.join("substrat-probe")
    })
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn bwrap_on_path() -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("bwrap").is_file())
}

/// The backends a test runs on here: native, and bwrap where it is on
/// PATH (else that part of `test` is reported skipped).
fn backends_for(test: &str) -> Vec<&'static str> {
    let mut backends = vec!["native"];
    if bwrap_on_path() {
        backends.push("bwrap");
    } else {
        println!("SKIPPED {test}[bwrap]: bubblewrap is not on PATH");
    }
    backends
}

/// Runs a freshly copied program. Another test thread's fork can still
/// hold the copy's write descriptor for a moment (until its exec closes
/// it), and exec then fails with ETXTBSY: retry that, nothing else.
fn output_of_copied(cmd: &mut Command) -> std::process::Output {
    for _ in 0..200 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
    panic!("{cmd:?}: text file busy for 2 s");
}
