//! What the operator reads: `agent inspect` in words (JSON with --json),
//! `tools list` with nothing configured, a daemon log without colour codes.

use super::*;

fn words(state: &Path, args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn inspect_and_tools_list_speak_words_unless_asked_for_json() {
    let d = Daemon::start();
    let ws = tempfile::tempdir().unwrap();
    d.agent(&[
        "create",
        "lead",
        "--role",
        "tight",
        "--workspace",
        ws.path().to_str().unwrap(),
    ])
    .unwrap();
    let text = words(&d.state(), &["agent", "inspect", "lead"]);
    assert!(text.starts_with("lead  idle  role tight"), "{text}");
    for wanted in [
        "  model default  ",
        "  workspace ",
        "recent turns: none",
        "recent messages: none",
        "  tools: ",
    ] {
        assert!(text.contains(wanted), "missing {wanted:?} in:\n{text}");
    }
    assert!(serde_json::from_str::<Value>(&text).is_err(), "not JSON");
    let json = d.agent(&["inspect", "lead"]).unwrap();
    assert_eq!(json["agent"]["name"], "lead");
    let text = words(&d.state(), &["tools", "list"]);
    assert!(
        text.starts_with("no upstream MCP servers: this daemon was started without --upstreams"),
        "{text}"
    );
}

#[test]
fn a_daemon_log_that_is_no_terminal_has_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
    let mut child = Command::new(bin())
        .args(["daemon", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("SUBSTRAT_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    // The log line, not the socket: "broker ready" is written after the
    // socket listens, and a loaded machine can run the test in between.
    let path = dir.path().join("daemon.log");
    let start = Instant::now();
    while !std::fs::read_to_string(&path).is_ok_and(|t| t.contains("broker ready"))
        && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("broker ready"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text:?}"
    );
}

/// Output into a pipe nobody reads any more (`... | head -c1` after head
/// is gone): every command ends quietly, with 0 or killed by SIGPIPE as C
/// tools are, never with Rust's panic "failed printing to stdout: Broken
/// pipe" (exit 101 and a backtrace hint).
#[test]
fn commands_end_quietly_when_their_reader_is_gone() {
    use std::os::unix::process::ExitStatusExt;
    let d = Daemon::start();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().to_str().unwrap();
    let state = d.state();
    let state = state.to_str().unwrap();
    let commands: [&[&str]; 10] = [
        &[
            "agent",
            "create",
            "lead",
            "--json",
            "--workspace",
            ws,
            "--state-dir",
            state,
        ],
        &["agent", "list", "--state-dir", state],
        &["agent", "inspect", "lead", "--state-dir", state],
        &["tools", "list", "--json", "--state-dir", state],
        &["completions", "bash"],
        &["man"],
        &["check", "worker"],
        &["role", "list"],
        &["explain", "--policy", "worker", "--workspace", ws],
        &["--help"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(bin())
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || out.status.signal() == Some(nix::libc::SIGPIPE),
            "{args:?}: {:?}\n{stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // The request reached the daemon although its answer found no reader.
    assert!(d.agent(&["inspect", "lead"]).is_ok());
}
