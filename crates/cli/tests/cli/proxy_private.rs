//! Only an operator opens the egress proxy to loopback and private
//! addresses: a policy's test switches (`proxy.test_allow_private`,
//! `proxy.test_hosts`) are refused by the launch (and reported by
//! `check`), and names that resolve to loopback, however spelt, are
//! refused with the exact reason while the loopback server behind them
//! sees no connection.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A loopback server counting the connections it is given.
fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong");
        }
    });
    (port, seen)
}

/// A shell line inside: `CONNECT host:port` to the proxy by hand (bash's
/// /dev/tcp, so no client rewrites the name), its status line printed.
fn connect_line(host: &str, port: u16) -> String {
    format!(
        "exec 3<>/dev/tcp/127.0.0.1/${{HTTP_PROXY##*:}}; \
         printf 'CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n' >&3; \
         head -1 <&3; exec 3<&-"
    )
}

fn policy(dir: &Path, name: &str, proxy: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\n{proxy}\n"),
    )
    .unwrap();
    path
}

fn run_in(policy: &Path, audit: &Path, line: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--backend", "native", "--policy"])
        .arg(policy)
        .arg("--proxy-audit")
        .arg(audit)
        .args(["--", "/bin/bash", "-c", line])
        .current_dir(repo())
        .output()
        .unwrap()
}

fn sandbox_works(test: &str) -> bool {
    let out = substrat(&["run", "--policy", "worker", "--", "true"]);
    if !out.status.success() {
        println!(
            "SKIPPED {test}: no sandbox here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    out.status.success()
}

#[test]
fn a_policys_test_switches_are_refused_and_reported() {
    let test = "a_policys_test_switches_are_refused_and_reported";
    if !sandbox_works(test) {
        return;
    }
    let (port, seen) = counting_server();
    let dir = tempfile::tempdir().unwrap();
    for (name, proxy) in [
        (
            "open",
            format!("allow = [\"localhost:{port}\"]\ntest_allow_private = true"),
        ),
        (
            "hosts",
            format!(
                "allow = [\"loop.test:{port}\"]\ntest_hosts = {{ \"loop.test\" = \"127.0.0.1\" }}"
            ),
        ),
    ] {
        let file = policy(dir.path(), name, &proxy);
        let audit = dir.path().join(format!("{name}.log"));
        let host = if name == "open" {
            "localhost"
        } else {
            "loop.test"
        };
        let out = run_in(&file, &audit, &connect_line(host, port));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let key = if name == "open" {
            "proxy.test_allow_private"
        } else {
            "proxy.test_hosts"
        };
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains(&format!("{key}: a switch for tests")),
            "{name}: {stderr}"
        );
        assert_eq!(
            seen.load(Ordering::SeqCst),
            0,
            "{name}: the server was reached"
        );
        // `check` still names it, with its own rule.
        let out = substrat(&["check", "--format", "json", file.to_str().unwrap()]);
        let report = stdout_json(&out);
        let findings = report["policies"][0]["findings"].as_array().unwrap();
        assert!(
            findings
                .iter()
                .any(|f| f["rule_id"] == "SBX039" && f["severity"] == "critical"),
            "{name}: {findings:#?}"
        );
    }
}

#[test]
fn names_of_loopback_however_spelt_are_refused_and_reach_nothing() {
    let test = "names_of_loopback_however_spelt_are_refused_and_reach_nothing";
    if !sandbox_works(test) {
        return;
    }
    let (port, seen) = counting_server();
    let dir = tempfile::tempdir().unwrap();
    // Spellings a resolver (inet_aton) takes for 127.0.0.1, 0.0.0.0 and a
    // literal loopback, each allowed by name.
    let names = [
        "localhost",
        "2130706433",
        "0x7f.1",
        "017700000001",
        "127.1",
        "0x7f000001",
        "0",
    ];
    // Numeric names cannot be written in an allowlist: `*` lets them be
    // asked for.
    let file = policy(
        dir.path(),
        "spellings",
        &format!("allow = [\"*:{port}\", \"localhost:{port}\"]"),
    );
    let audit = dir.path().join("audit.log");
    let lines: Vec<String> = names
        .iter()
        .chain(&["127.0.0.1"])
        .map(|n| connect_line(n, port))
        .collect();
    let out = run_in(&file, &audit, &lines.join("; "));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("HTTP/1.1 403"))
            .count(),
        names.len() + 1,
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut audit_text = String::new();
    std::fs::File::open(&audit)
        .unwrap()
        .read_to_string(&mut audit_text)
        .unwrap();
    let reasons: Vec<String> = audit_text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "decision")
        .map(|l| l["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    // `localhost` judged on the address it resolves to; the numeric
    // spellings and the literal never reach a resolver.
    let mut expected = vec![
        "localhost resolves to 127.0.0.1, which is not a public address (loopback)".to_string(),
    ];
    expected.extend(
        names[1..]
            .iter()
            .chain(&["127.0.0.1"])
            .map(|n| format!("`{n}` is not a host name the proxy accepts")),
    );
    assert_eq!(reasons, expected);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "the loopback server was reached"
    );
}
