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
