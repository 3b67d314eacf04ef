//! Placement across daemons (issue 42): three daemons on one PostgreSQL
//! database; agents made on the first, which offers no slots, go to the
//! daemon with most free slots that reaches their workspace (a shared
//! path both declare), or stay there; `agent list` says where and why and
//! shows each agent's socket in its own daemon's directory. Turns by the
//! stand-in agent in real sandboxes.

use super::daemons::{Seated, plan, turns_of};
use super::*;

/// (daemon id, why) of each agent as `agent list` on `daemon` says, and
/// its socket, by name.
fn listed(daemon: &Seated) -> Vec<(String, String, String, String)> {
    let list = daemon.agent(&["list"]);
    list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
            (
                s(&x["name"]),
                s(&x["daemon"]["daemon_id"]),
                s(&x["daemon"]["why"]),
                s(&x["socket"]),
            )
        })
        .collect()
}

#[test]
fn new_agents_go_where_there_are_free_slots_and_their_workspace_is_shared() {
    let test = "new_agents_go_where_there_are_free_slots_and_their_workspace_is_shared";
    if !sandbox_works(test, "native") {
        return;
    }
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let (shared, local) = (root.join("shared"), root.join("local"));
    std::fs::create_dir_all(shared.join("p")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    let shared_arg = shared.display().to_string();
    let a = Seated::start_with(&root, "a", &url, &["--shared-path", &shared_arg]);
    let b = Seated::start_with(
        &root,
        "b",
        &url,
        &["--max-agents", "2", "--shared-path", &shared_arg],
    );
    let c = Seated::start_with(&root, "c", &url, &["--max-agents", "1"]);
    let first = |who: &str| {
        plan(
            &format!("You are {who}."),
            json!({"turns": [{"steps": [
                {"call": "check_inbox", "args": {}},
                {"reply": format!("{who} ready")}]}]}),
        )
    };
    let in_shared = shared.join("p").display().to_string();
    let in_local = local.display().to_string();
    a.agent(&["spawn", "p1", "--workspace", &in_shared, &first("p1")]);
    a.agent(&["spawn", "l1", "--workspace", &in_local, &first("l1")]);
    wait_until("p1 and l1 take their first turns", 60, || {
        ["p1", "l1"].iter().all(|n| {
            let turns = turns_of(&schema, n);
            turns.len() == 1 && turns[0].1 == "done"
        })
    });
    // p1's turn ran on b (its socket bound there), l1's on a.
    assert_eq!(turns_of(&schema, "p1")[0].2, b.id());
    assert_eq!(turns_of(&schema, "l1")[0].2, a.id());
    // No workspace: the most free slots (b and c have one each: b by
    // name), then c, then none left: it stays.
    for name in ["n1", "n2", "n3"] {
        a.agent(&["create", name]);
    }
    let socket = |d: &Seated, name: &str| {
        let id = schema.query(&format!("SELECT id FROM agents WHERE name = '{name}'"));
        d.dir
            .canonicalize()
            .unwrap()
            .join("agents")
            .join(id)
            .join("broker.sock")
            .display()
            .to_string()
    };
    let row =
        |name: &str, d: &Seated, why: String| (name.to_string(), d.id(), why, socket(d, name));
    assert_eq!(
        listed(&a),
        [
            row(
                "p1",
                &b,
                format!(
                    "placed: most free slots (2 of 2) and workspace under shared path {shared_arg}"
                )
            ),
            row("l1", &a, format!("here: workspace {in_local} not shared")),
            row(
                "n1",
                &b,
                "placed: most free slots (1 of 2), no workspace".into()
            ),
            row(
                "n2",
                &c,
                "placed: most free slots (1 of 1), no workspace".into()
            ),
            row(
                "n3",
                &a,
                "here: no other live daemon has a free slot".into()
            ),
        ]
    );
    // Each daemon serves the sockets of its own agents only.
    wait_until("b and c bind their placed agents' sockets", 10, || {
        std::path::Path::new(&socket(&b, "n1")).exists()
            && std::path::Path::new(&socket(&c, "n2")).exists()
    });
    for (d, name) in [(&a, "p1"), (&a, "n1"), (&a, "n2"), (&b, "l1"), (&c, "n3")] {
        assert!(!std::path::Path::new(&socket(d, name)).exists(), "{name}");
    }
    // What `agent list` prints for people says the same.
    let out = Command::new(bin())
        .args(["agent", "list", "--state-dir"])
        .arg(&a.dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(placed: most free slots (1 of 1), no workspace)"),
        "{text}"
    );
}

/// A lease shorter than the bound on one call to the state database is
/// refused at start, saying so (a daemon held up by one call would lose
/// its agents).
#[test]
fn a_lease_shorter_than_a_database_call_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .args(["daemon", "--lease", "2", "--state-dir"])
        .arg(dir.path().join("s"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a daemon that starts after all must fail the test, not
    // hang it.
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a daemon with --lease 2 kept running for 20 s: it was not refused");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("--lease 2s is shorter than the 5s a call to the state database may take"),
        "{stderr}"
    );
    assert!(!dir.path().join("s").join("control.sock").exists());
}

/// A daemon with `--runtime-dir` records it: another daemon's `agent list`
/// shows its agents' sockets there (where it binds them), not under its
/// state directory.
#[test]
fn an_agent_on_a_daemon_with_a_runtime_dir_is_listed_with_its_socket_there() {
    let test = "an_agent_on_a_daemon_with_a_runtime_dir_is_listed_with_its_socket_there";
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let runtime = root.join("run");
    let runtime_arg = runtime.display().to_string();
    let a = Seated::start_with(&root, "a", &url, &[]);
    let r = Seated::start_with(
        &root,
        "r",
        &url,
        &["--max-agents", "1", "--runtime-dir", &runtime_arg],
    );
    a.agent(&["create", "x"]);
    let id = schema.query("SELECT id FROM agents WHERE name = 'x'");
    let there = runtime.join("agents").join(&id).join("broker.sock");
    let under_state = r.dir.join("agents").join(&id).join("broker.sock");
    let shown = |d: &Seated| {
        listed(d)
            .into_iter()
            .find(|row| row.0 == "x")
            .map(|row| (row.1, row.3))
    };
    let expected = Some((r.id(), there.display().to_string()));
    assert_eq!(shown(&a), expected, "as the other daemon lists it");
    assert_eq!(shown(&r), expected, "as its own daemon lists it");
    wait_until("r binds x's socket in its runtime dir", 10, || {
        there.exists()
    });
    assert!(!under_state.exists(), "nothing under its state directory");
}
