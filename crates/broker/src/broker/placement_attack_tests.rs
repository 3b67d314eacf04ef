//! Attacks on placement (issue 42), each asserting what must hold; each
//! failed before its fix (branch placefix).

use super::tests::{call, create_tight, tight_broker};
use super::*;
use crate::store::testdb::TestDb;

fn seat(broker: &Broker, id: &str, offer: crate::store::Offer) {
    broker.store().take_seat(crate::store::Seat {
        daemon_id: id.into(),
        lease_ms: 60_000,
    });
    broker.register_daemon(&format!("host:/{id}")).unwrap();
    broker.store().declare_offer(&offer).unwrap();
    broker.set_providers(vec!["cli".into()], "cli").unwrap();
}

/// The planner judges the workspace resolved (through a link), but the
/// agent is stored (and launched on the daemon chosen) with the text
/// path. A spawn_agent subdir checked link-free by resolve_subdir and then
/// swapped for a link into the shared path (the agent's own background
/// process can do that) reaches this point with exactly this request.
#[test]
fn atk_placement_judges_a_path_other_than_the_one_stored() {
    let Some(db) = TestDb::postgres("atk_placement_judges_a_path_other_than_the_one_stored") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let (shared, local) = (root.join("shared"), root.join("local"));
    std::fs::create_dir_all(shared.join("x")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    let a = tight_broker(&db, "children_per_agent = 1000", r#"["spawn_agent"]"#);
    let b = tight_broker(&db, "children_per_agent = 1000", r#"["spawn_agent"]"#);
    seat(
        &a,
        "daemon-a",
        crate::store::Offer {
            max_agents: None,
            shared_paths: vec![shared.clone()],
            state_dir: None,
            runtime_dir: None,
        },
    );
    seat(
        &b,
        "daemon-b",
        crate::store::Offer {
            max_agents: Some(100),
            shared_paths: vec![shared.clone()],
            state_dir: None,
            runtime_dir: None,
        },
    );
    // The parent, its workspace local to daemon a: it stays there.
    let boss = a
        .create_agent(NewAgent {
            name: "boss".into(),
            role: "tight".into(),
            workspace: Some(local.display().to_string()),
            ..NewAgent::default()
        })
        .unwrap();
    assert_eq!(
        a.placements().unwrap()[&boss.id].daemon_id.as_deref(),
        Some("daemon-a")
    );
    // The agent's own process swaps `sub` between a directory and a link
    // to the shared path while spawn_agent runs.
    let sub = local.join("sub");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (sub, target, stop) = (sub.clone(), shared.join("x"), stop.clone());
        std::thread::spawn(move || {
            // `sub` and `sub.other` swapped atomically (RENAME_EXCHANGE):
            // `sub` is a directory half the time, a link the other half.
            let other = sub.with_file_name("sub.other");
            std::fs::create_dir(&sub).unwrap();
            std::os::unix::fs::symlink(&target, &other).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &sub,
                    nix::fcntl::AT_FDCWD,
                    &other,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        })
    };
    let mut on_b = Vec::new();
    let mut errors = std::collections::HashMap::new();
    let started = std::time::Instant::now();
    let mut i = 0;
    while i < 40 && started.elapsed() < std::time::Duration::from_secs(90) {
        let (made, is_error) = call(
            &a,
            &boss,
            "spawn_agent",
            json!({"name": format!("c{i}"), "role": "tight", "instructions": "go",
                   "workspace_subdir": "sub"}),
        );
        if let Some(ms) = made["retry_after_ms"].as_u64() {
            std::thread::sleep(std::time::Duration::from_millis(ms + 1));
            continue;
        }
        i += 1;
        if is_error {
            *errors.entry(made["error"].to_string()).or_insert(0usize) += 1;
            continue;
        }
        let id = made["agent_id"].as_str().unwrap().to_string();
        let p = &a.placements().unwrap()[&id];
        if p.daemon_id.as_deref() == Some("daemon-b") {
            on_b.push((id, p.why.clone()));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!("errors {errors:?}, on b {}", on_b.len());
    for (id, why) in &on_b {
        let child = a.store().agent_by_id(id).unwrap().unwrap();
        eprintln!(
            "child {} on daemon-b, workspace {:?}, why {:?}",
            child.name, child.workspace, why
        );
    }
    // What should hold: an agent whose stored workspace is not under a
    // shared path is never placed on another daemon.
    assert!(
        on_b.is_empty(),
        "{} children with workspace {}/sub (not shared) placed on daemon-b",
        on_b.len(),
        local.display()
    );
}

/// The same without a race: the broker's create_agent with a workspace
/// text that goes through a link into the shared path (what spawn_agent
/// passes after the swap) is placed by the link's target, stored by its
/// text.
#[test]
fn atk_a_linked_workspace_is_placed_by_its_target_and_stored_by_its_text() {
    let Some(db) = TestDb::postgres("atk_a_linked_workspace_is_placed_by_its_target") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let (shared, local) = (root.join("shared"), root.join("local"));
    std::fs::create_dir_all(shared.join("x")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::os::unix::fs::symlink(shared.join("x"), local.join("sub")).unwrap();
    let a = tight_broker(&db, "", r#"[]"#);
    let b = tight_broker(&db, "", r#"[]"#);
    let offer = |max| crate::store::Offer {
        max_agents: max,
        shared_paths: vec![shared.clone()],
        state_dir: None,
        runtime_dir: None,
    };
    seat(&a, "daemon-a", offer(None));
    seat(&b, "daemon-b", offer(Some(4)));
    let ws = local.join("sub").display().to_string();
    let made = a
        .create_agent(NewAgent {
            name: "c".into(),
            role: "tight".into(),
            workspace: Some(ws.clone()),
            ..NewAgent::default()
        })
        .unwrap();
    let p = &a.placements().unwrap()[&made.id];
    let stored = a.store().agent_by_id(&made.id).unwrap().unwrap().workspace;
    eprintln!(
        "daemon {:?} why {:?} stored workspace {stored:?}",
        p.daemon_id, p.why
    );
    assert_eq!(stored.as_deref(), Some(ws.as_str()));
    assert_eq!(
        p.daemon_id.as_deref(),
        Some("daemon-a"),
        "placed by the link's target"
    );
    assert_eq!(
        p.why.as_deref(),
        Some("here: workspace changed while judged")
    );
    // The same workspace by its resolved path is placed: the refusal
    // above is for the link, not for the directory.
    let made = a
        .create_agent(NewAgent {
            name: "d".into(),
            role: "tight".into(),
            workspace: Some(shared.join("x").display().to_string()),
            ..NewAgent::default()
        })
        .unwrap();
    let p = &a.placements().unwrap()[&made.id];
    assert_eq!(p.daemon_id.as_deref(), Some("daemon-b"), "{p:?}");
}

/// docs/broker.md: a workspace is placed elsewhere only "under a path both
/// the maker and that daemon declare". The planner accepts any path of the
/// other daemon's that holds it: a daemon declaring `/` (misconfigured, or
/// lying in its row) reaches every workspace the maker shares.
#[test]
fn atk_the_chosen_daemon_need_not_declare_the_makers_shared_path() {
    use crate::placement::{Candidate, plan};
    let d = |id: &str, max: Option<u32>, shared: &[&str]| Candidate {
        id: id.into(),
        name: id.into(),
        max_agents: max,
        agents: 0,
        shared_paths: shared.iter().map(std::path::PathBuf::from).collect(),
        roles: Default::default(),
        providers: Vec::new(),
    };
    let daemons = [d("a", None, &["/srv/team"]), d("b", Some(8), &["/"])];
    let p = plan("a", Some(std::path::Path::new("/srv/team/p")), &daemons);
    assert!(p.here, "{p:?}");
}

/// The daemon an agent was placed on checks the workspace again before
/// each launch: it must be its own resolved path and under a path this
/// daemon declares shared; else the turn fails saying why.
#[test]
fn a_placed_agent_launches_only_in_a_workspace_shared_here() {
    let Some(db) = TestDb::postgres("a_placed_agent_launches_only_in_a_workspace_shared_here")
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let shared = root.join("shared");
    std::fs::create_dir_all(shared.join("x")).unwrap();
    let a = tight_broker(&db, "", r#"[]"#);
    let b = tight_broker(&db, "", r#"[]"#);
    let offer = |max| crate::store::Offer {
        max_agents: max,
        shared_paths: vec![shared.clone()],
        state_dir: None,
        runtime_dir: None,
    };
    seat(&a, "daemon-a", offer(None));
    seat(&b, "daemon-b", offer(Some(4)));
    let made = a
        .create_agent(NewAgent {
            name: "c".into(),
            role: "tight".into(),
            workspace: Some(shared.join("x").display().to_string()),
            ..NewAgent::default()
        })
        .unwrap();
    assert_eq!(
        b.placements().unwrap()[&made.id].daemon_id.as_deref(),
        Some("daemon-b")
    );
    // Daemon b's own declaration (what `daemon --shared-path` set).
    b.set_shared_paths(vec![shared.clone()]);
    assert_eq!(b.placed_workspace_refusal(&made).unwrap(), None);
    // Declared in its row, not by the daemon itself: refused.
    b.set_shared_paths(vec![root.join("elsewhere")]);
    let refusal = b.placed_workspace_refusal(&made).unwrap().unwrap();
    assert!(
        refusal.contains("not under a path this daemon declares shared"),
        "{refusal}"
    );
    // A link put on its way since it was judged: refused.
    b.set_shared_paths(vec![shared.clone()]);
    std::fs::rename(shared.join("x"), shared.join("y")).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), shared.join("x")).unwrap();
    std::fs::create_dir(root.join("elsewhere")).unwrap();
    let refusal = b.placed_workspace_refusal(&made).unwrap().unwrap();
    assert!(
        refusal.contains("no longer resolves to itself"),
        "{refusal}"
    );
    // An agent made here is not judged by this rule.
    let here = b
        .create_agent(NewAgent {
            name: "h".into(),
            role: "tight".into(),
            workspace: Some(root.join("elsewhere").display().to_string()),
            ..NewAgent::default()
        })
        .unwrap();
    assert_eq!(b.placed_workspace_refusal(&here).unwrap(), None);
}

/// The planner places only on a daemon that runs the agent's role with
/// the same policy and its CLI; the one it makes names the CLI judged.
#[test]
fn a_daemon_with_another_policy_for_the_role_is_not_chosen() {
    let Some(db) = TestDb::postgres("a_daemon_with_another_policy_for_the_role_is_not_chosen")
    else {
        return;
    };
    let a = tight_broker(&db, "", r#"[]"#);
    // The same role name, another policy (more tools).
    let b = tight_broker(&db, "", r#"["spawn_agent"]"#);
    let offer = |max| crate::store::Offer {
        max_agents: max,
        ..Default::default()
    };
    seat(&a, "daemon-a", offer(None));
    seat(&b, "daemon-b", offer(Some(4)));
    let made = create_tight(&a, "t1", None);
    let p = &a.placements().unwrap()[&made.id];
    assert_eq!(p.daemon_id.as_deref(), Some("daemon-a"));
    assert_eq!(
        p.why.as_deref(),
        Some("here: no other live daemon with a free slot runs role tight as here with cli")
    );
    // The role b runs as a does (worker): placed, naming the CLI.
    let made = a
        .create_agent(NewAgent {
            name: "w1".into(),
            role: "worker".into(),
            ..NewAgent::default()
        })
        .unwrap();
    assert_eq!(
        a.placements().unwrap()[&made.id].daemon_id.as_deref(),
        Some("daemon-b")
    );
    assert_eq!(made.provider.as_deref(), Some("cli"));
}

/// An agent placed here and removed by its maker between the beat that
/// found it unserved and the binding of its socket: the socket is not
/// served (nor left on disk), and a later agent is served as before.
#[test]
fn a_placed_agent_removed_before_its_socket_is_bound_is_not_served() {
    let Some(db) = TestDb::postgres("a_placed_agent_removed_before_its_socket_is_bound") else {
        return;
    };
    let a = tight_broker(&db, "", r#"[]"#);
    let b = tight_broker(&db, "", r#"[]"#);
    let offer = |max| crate::store::Offer {
        max_agents: max,
        ..Default::default()
    };
    seat(&a, "daemon-a", offer(None));
    seat(&b, "daemon-b", offer(Some(4)));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    b.set_events(tx);
    let gone = create_tight(&a, "gone", None);
    let kept = create_tight(&a, "kept", None);
    for made in [&gone, &kept] {
        let p = &a.placements().unwrap()[&made.id];
        assert_eq!(p.daemon_id.as_deref(), Some("daemon-b"), "{p:?}");
    }
    // The beat's view of what to serve, then a removal on daemon b (an
    // operator's, from another thread) before the sockets are bound.
    let (_, placed) = {
        let store = b.store();
        b.sockets_to_change(&store).unwrap()
    };
    assert_eq!(placed.len(), 2);
    assert!(b.store().remove_agent(&gone.id).unwrap());
    b.serve_placed(&placed);
    let mut created = Vec::new();
    while let Ok(event) = rx.try_recv() {
        if let AgentEvent::Created(agent, _) = event {
            created.push(agent.name);
        }
    }
    assert_eq!(created, vec!["kept".to_string()]);
    assert!(!b.socket_path(&gone.id).exists());
    assert!(b.socket_path(&kept.id).exists());
}

/// An agent placed on b, adopted by c after b stops, is judged at its
/// launch on c as a placed one (svcfin b: adoption rewrote `placed` to
/// "adopted from daemon ...", and the launch judged only "placed:"
/// rows): a workspace c does not declare shared, or one swapped for a
/// link, is refused. PostgreSQL only (placement needs it).
#[test]
fn an_adopted_agent_launches_only_in_a_workspace_shared_here() {
    let Some(db) = TestDb::postgres("an_adopted_agent_launches_only_in_a_workspace_shared_here")
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let shared = root.join("shared");
    std::fs::create_dir_all(shared.join("x")).unwrap();
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    let short_seat = |broker: &Broker, id: &str, max| {
        broker.store().take_seat(crate::store::Seat {
            daemon_id: id.into(),
            lease_ms: 200,
        });
        broker.register_daemon(&format!("host:/{id}")).unwrap();
        broker
            .store()
            .declare_offer(&crate::store::Offer {
                max_agents: max,
                shared_paths: vec![shared.clone()],
                state_dir: None,
                runtime_dir: None,
            })
            .unwrap();
        broker.set_providers(vec!["cli".into()], "cli").unwrap();
    };
    let a = tight_broker(&db, "", r#"[]"#);
    let b = tight_broker(&db, "", r#"[]"#);
    let c = tight_broker(&db, "", r#"[]"#);
    short_seat(&a, "daemon-a", None);
    short_seat(&b, "daemon-b", Some(4));
    let made = a
        .create_agent(NewAgent {
            name: "c".into(),
            role: "tight".into(),
            workspace: Some(shared.join("x").display().to_string()),
            ..NewAgent::default()
        })
        .unwrap();
    assert_eq!(
        b.placements().unwrap()[&made.id].daemon_id.as_deref(),
        Some("daemon-b")
    );
    // b stops; c starts, its row declaring the shared path.
    std::thread::sleep(std::time::Duration::from_millis(300));
    short_seat(&c, "daemon-c", Some(4));
    a.store().heartbeat(&[]).unwrap();
    c.store().heartbeat(&[]).unwrap();
    let taken = c.store().adopt_agents(8, true).unwrap();
    assert_eq!(taken.len(), 1, "c adopts the agent");
    // On c: the daemon itself does not declare the path shared, and the
    // workspace is now a link elsewhere. Placed on c, both were refused.
    c.set_shared_paths(vec![root.join("nothing")]);
    std::fs::rename(shared.join("x"), shared.join("y")).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), shared.join("x")).unwrap();
    assert_eq!(
        c.store().agent_placed_kind(&made.id).unwrap(),
        Some(crate::store::PlacedKind::Adopted)
    );
    let refusal = c.placed_workspace_refusal(&made).unwrap();
    assert!(
        refusal
            .as_deref()
            .is_some_and(|r| r.contains("no longer resolves to itself")),
        "an adopted agent launches on c in {}, unjudged: {refusal:?}",
        shared.join("x").display()
    );
    // Put back, the path c does not declare shared is refused too.
    std::fs::remove_file(shared.join("x")).unwrap();
    std::fs::rename(shared.join("y"), shared.join("x")).unwrap();
    let refusal = c.placed_workspace_refusal(&made).unwrap();
    assert!(
        refusal
            .as_deref()
            .is_some_and(|r| r.contains("not under a path this daemon")),
        "{refusal:?}"
    );
}
