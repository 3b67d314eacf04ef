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
