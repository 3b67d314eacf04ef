//! Host Unix sockets bound in by a policy: refused unless the bind is
//! marked `socket = true` (Landlock before ABI 9 cannot stop a connect).

use super::*;

/// A host service on a Unix socket: answers each connection with `hello`.
fn serve(path: &Path) {
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = std::io::Write::write_all(&mut stream, b"hello\n");
        }
    });
}

/// A policy extending worker that binds `source` at /run/svc.sock.
fn policy(dir: &Path, name: &str, source: &Path, marker: &str) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "version = 1\nextends = \"worker\"\n[filesystem]\n\
             binds_add = [{{ source = \"{}\", target = \"/run/svc.sock\", mode = \"ro\"{marker} }}]\n",
            source.display()
        ),
    )
    .unwrap();
    file
}

fn run_in(backend: &str, policy: &Path, ws: &Path, argv: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_substrat-sandbox"))
        .args(["run", "--backend", backend, "--tty", "never", "--policy"])
        .arg(policy)
        .arg("--workspace")
        .arg(ws)
        .arg("--")
        .args(argv)
        .output()
        .unwrap()
}

const CONNECT: [&str; 4] = [
    "perl",
    "-MIO::Socket::UNIX",
    "-e",
    "$s = IO::Socket::UNIX->new(Peer => '/run/svc.sock') or die \"connect: $!\\n\"; print <$s>",
];

/// Unmarked, the bind of a socket is refused before anything runs, named
/// with the marker to add; through a link too (judged where the launch
/// resolves it). Marked, the command connects to the host's service.
#[test]
fn a_socket_bind_is_refused_unless_the_policy_marks_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let socket = dir.path().join("svc.sock");
    serve(&socket);
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&socket, &link).unwrap();
    let unmarked = policy(dir.path(), "unmarked", &socket, "");
    let linked = policy(dir.path(), "linked", &link, "");
    let marked = policy(dir.path(), "marked", &socket, ", socket = true");
    let refusal = |source: &Path, via: &str| {
        format!(
            "bind source {}{via} is a Unix socket, which the command could connect to; refusing. \
             If the command should reach the service behind it, mark the bind `socket = true` in the \
             policy (filesystem.binds: {{ source = \"{}\", target = \"/run/svc.sock\", ..., socket = true }})",
            source.display(),
            source.display()
        )
    };
    for backend in backends_for("a_socket_bind_is_refused_unless_the_policy_marks_it") {
        let out = run_in(backend, &unmarked, &ws, &["true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(code(&out), 0, "{backend}: {stderr}");
        assert!(
            stderr.contains(&refusal(&socket, "")),
            "{backend}: {stderr}"
        );
        let out = run_in(backend, &linked, &ws, &["true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(code(&out), 0, "{backend}: {stderr}");
        let via = format!(" (resolved to {})", socket.display());
        assert!(
            stderr.contains(&refusal(&link, &via)),
            "{backend}: {stderr}"
        );
        let out = run_in(backend, &marked, &ws, &CONNECT);
        assert_eq!(
            (code(&out), String::from_utf8_lossy(&out.stdout).as_ref()),
            (0, "hello\n"),
            "{backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `check` judges the sockets where the launch would find them: an
/// unmarked socket (through a link) high, a marked one low, a directory
/// holding one medium, with this kernel's Landlock ABI named.
#[test]
fn check_reports_socket_binds_as_the_launch_resolves_them() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("svc.sock");
    serve(&socket);
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&socket, &link).unwrap();
    let findings = |policy: &Path| -> Vec<(String, String, String)> {
        let out = substrat(&["check", "--format", "json", policy.to_str().unwrap()]);
        let report = stdout_json(&out);
        report["policies"][0]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| ["SBX047", "SBX048", "SBX049"].contains(&f["rule_id"].as_str().unwrap()))
            .map(|f| {
                let s = |k: &str| f[k].as_str().unwrap().to_string();
                (s("rule_id"), s("severity"), s("message"))
            })
            .collect()
    };
    let unmarked = findings(&policy(dir.path(), "linked", &link, ""));
    assert_eq!(unmarked.len(), 1, "{unmarked:?}");
    assert_eq!((&*unmarked[0].0, &*unmarked[0].1), ("SBX047", "high"));
    assert!(
        unmarked[0]
            .2
            .contains(&format!("resolves to `{}` here", socket.display())),
        "{unmarked:?}"
    );
    let marked = findings(&policy(dir.path(), "marked", &socket, ", socket = true"));
    assert_eq!(
        marked,
        [(
            "SBX048".to_string(),
            "low".to_string(),
            format!(
                "reachable: the command can connect to the service at `{}`",
                socket.display()
            )
        )]
    );
    // A kernel with Landlock ABI 9 stops the connect: nothing to report.
    let host = stdout_json(&substrat(&[
        "check", "--host", "--format", "json", "worker",
    ]));
    let abi = host["host"]["facts"]["landlock_abi"].as_u64().unwrap();
    let holding = findings(&policy(dir.path(), "holding", dir.path(), ""));
    if abi >= 9 {
        assert_eq!(holding, []);
        return;
    }
    assert_eq!(
        holding,
        [(
            "SBX049".to_string(),
            "medium".to_string(),
            format!(
                "bind source `{}` holds Unix sockets: `{}`; Landlock cannot stop a connect on this kernel (Landlock ABI {abi})",
                dir.path().display(),
                socket.display()
            )
        )]
    );
}
