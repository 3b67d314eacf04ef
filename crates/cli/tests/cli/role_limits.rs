//! A script role cannot outrun its limits (issue 39): every attack a
//! script (or an agent's arguments) can make, through `role test` in a
//! fresh process, ends with its exact error within the time limit and a
//! little more, never at the caller's mercy.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The time limit the attack role has, and what the answer may take past it
/// (the evaluator's start and the kill).
const LIMIT_MS: u64 = 300;
const SLACK: Duration = Duration::from_millis(600);

/// `substrat-sandbox ARGS`, killed if it runs 10 s: its exit code, stderr
/// and how long it took.
fn bounded(args: &[&str]) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            panic!("{args:?}: no answer within 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err, took)
}

fn attack_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("tests/broker/roles/attack.lua"),
        dir.path().join("attack.lua"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("attack.toml"),
        format!(
            "version = 1\nextends = \"worker\"\n[persona]\nscript = \"attack.lua\"\ntimeout_ms = {LIMIT_MS}\nmemory_mb = 16\n"
        ),
    )
    .unwrap();
    dir
}

#[test]
fn a_script_role_cannot_outrun_its_limits() {
    let dir = attack_dir();
    let policies = dir.path().to_str().unwrap();
    let time = format!("role `attack` ran past its time limit of {LIMIT_MS} ms");
    let memory = "role `attack` ran past its memory limit of 16777216 bytes".to_string();
    let said = |text: &str| format!("role `attack`: resolve: {text}");
    let (a30, b30) = ("a".repeat(30), format!("{}b", "a*".repeat(30)));
    let cases: Vec<(&str, Vec<String>, String)> = vec![
        // Error and message handlers, to-be-closed variables, metamethods.
        ("error_tostring", vec![], time.clone()),
        ("xpcall_loop", vec![], time.clone()),
        ("close", vec![], time.clone()),
        ("len", vec![], time.clone()),
        ("index", vec![], time.clone()),
        ("eq", vec![], time.clone()),
        ("lt", vec![], time.clone()),
        ("concat", vec![], time.clone()),
        ("sort_loop", vec![], time.clone()),
        (
            "gc",
            vec![],
            said(
                "runtime error: attack.lua:17: __gc is not available to role scripts (finalizers run outside the time limit)",
            ),
        ),
        // Library functions that loop or allocate inside C.
        ("rep", vec![], memory.clone()),
        ("table_concat", vec![], memory.clone()),
        ("utf8_char", vec![], memory.clone()),
        ("utf8_codes", vec![], memory.clone()),
        (
            "sort_error",
            vec![],
            said("runtime error: attack.lua:21: cmp"),
        ),
        (
            "format",
            vec![],
            said("runtime error: attack.lua:22: invalid conversion specification: '%99999d'"),
        ),
        // Patterns that backtrack exponentially, in one C call.
        ("find", vec![], time.clone()),
        ("match", vec![], time.clone()),
        ("gsub", vec![], time.clone()),
        ("gmatch", vec![], time.clone()),
        // The same with a subject and a pattern an agent chose.
        (
            "args",
            vec![format!("subject={a30}"), format!("pattern={b30}")],
            time.clone(),
        ),
    ];
    for (case, extra, wanted) in cases {
        let mut args = vec![
            "role".to_string(),
            "test".into(),
            "attack".into(),
            "--policies".into(),
            policies.into(),
            "--arg".into(),
            format!("case={case}"),
        ];
        for e in extra {
            args.extend(["--arg".to_string(), e]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err, took) = bounded(&args);
        assert_eq!(code, Some(2), "{case}: {err}");
        assert_eq!(
            err.trim(),
            format!("substrat-sandbox role: {wanted}"),
            "{case}"
        );
        assert!(
            took < Duration::from_millis(LIMIT_MS) + SLACK,
            "{case}: answered after {took:?}"
        );
        assert!(!err.contains(policies), "{case}: {err}");
    }
}
