//! `daemon --runtime-dir` (the system unit's /run/substrat): the control
//! socket and the agents' sockets live there, clients naming only the
//! state directory find them through its record, an agent's turn reaches
//! the broker through its socket there, and a runtime directory others
//! could write is refused by the client.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn sockets_live_in_the_runtime_dir_and_clients_find_them() {
    let test = "sockets_live_in_the_runtime_dir_and_clients_find_them";
    if !sandbox_works(test, "native") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let runtime = root.path().join("run");
    let policies = repo().join("policies");
    let child = Command::new(bin())
        .args(["daemon", "--provider", "stand-in", "--backend", "native"])
        .arg("--runtime-dir")
        .arg(&runtime)
        .arg("--policies")
        .arg(&policies)
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let control = runtime.join("control.sock");
    wait_until("the daemon listens in the runtime dir", 10, || {
        UnixStream::connect(&control).is_ok()
    });
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    let state = team.state();
    assert!(!state.join("control.sock").exists(), "not in the state dir");
    let mode = std::fs::metadata(&runtime).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let recorded = std::fs::read_to_string(state.join("runtime-dir")).unwrap();
    assert_eq!(Path::new(&recorded), runtime.canonicalize().unwrap());
    // Named by its state directory only: the client finds the daemon, and
    // the agent's turn reaches the broker through its socket here.
    let plan = json!({"turns": [{"steps": [{"call": "check_inbox"}, {"reply": "reached"}]}]});
    let ws = team.ws().display().to_string();
    team.agent(&["spawn", "a", "--workspace", &ws, &with_plan("go", &plan)]);
    wait_until("the turn ends", 60, || {
        team.settled() && team.turns("a").len() == 1
    });
    let turn = &team.turns("a")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    assert_eq!(turn.result.as_deref(), Some("reached"), "{turn:?}");
    let id = team.agent_id("a");
    assert!(
        runtime
            .join("agents")
            .join(&id)
            .join("broker.sock")
            .exists()
    );
    assert!(!state.join("agents").join(&id).join("broker.sock").exists());
    let audit = std::fs::read_to_string(state.join("audit.log")).unwrap();
    assert!(audit.contains("\"tool\":\"check_inbox\""), "{audit}");
    // A runtime dir others may write (they could put a socket of theirs
    // there): the client refuses it, naming why.
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = team.agent_fails(&["list"]);
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(
        refused.contains("is writable by others (mode 777)"),
        "{refused}"
    );
    assert!(
        team.agent(&["list"])["agents"]
            .to_string()
            .contains("\"a\"")
    );
}

/// A daemon started without turns on `state` and `runtime`.
fn bare_daemon(state: &Path, runtime: &Path) -> std::process::Child {
    Command::new(bin())
        .args(["daemon", "--state-dir"])
        .arg(state)
        .arg("--runtime-dir")
        .arg(runtime)
        .env("SUBSTRAT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn list(state: &Path) -> std::process::Output {
    Command::new(bin())
        .args(["agent", "list", "--state-dir"])
        .arg(state)
        .output()
        .unwrap()
}

#[test]
fn a_daemon_refused_a_busy_runtime_dir_leaves_no_way_to_the_other() {
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (root.path().join("s1"), root.path().join("s2"));
    let runtime = root.path().join("run");
    let mut holder = bare_daemon(&first, &runtime);
    wait_until("the first daemon listens", 10, || {
        UnixStream::connect(runtime.join("control.sock")).is_ok()
    });
    // The second state directory's daemon asks for the same runtime dir.
    let refused = bare_daemon(&second, &runtime).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        said.contains("runtime directory") && said.contains("--runtime-dir"),
        "{said}"
    );
    assert!(!second.join("runtime-dir").exists(), "no record left");
    assert!(!list(&second).status.success(), "no daemon of its own");
    // A record left from an earlier run (or planted by a copy) naming the
    // runtime dir the first daemon now holds: the client refuses it.
    std::fs::copy(first.join("runtime-dir"), second.join("runtime-dir")).unwrap();
    let out = list(&second);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("of another state directory"), "{said}");
    assert!(list(&first).status.success());
    holder.kill().unwrap();
    holder.wait().unwrap();
}
