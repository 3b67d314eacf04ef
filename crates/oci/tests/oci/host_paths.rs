//! Host binds judged on what is mounted (issue 44): a source swapped
//! between the check and the mount, and a socket as a bind's source.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::json;

use super::{Bundle, pid_of, runnable, wait_launcher};

fn ro_bind(source: &str, destination: &str) -> serde_json::Value {
    json!({"destination": destination, "type": "bind", "source": source, "options": ["rbind", "ro"]})
}

/// The attacker's race (atk/race.py): a writer exchanges `x` (a directory)
/// and `l` (a link to /etc) as fast as it can while containers bind `x`
/// read-only. Before the fix the check resolved the text and the mount
/// reopened it, following the link. Now the launcher judges the
/// descriptor it mounts: each container gets the directory or is refused.
#[test]
fn a_source_swapped_for_a_link_during_create_never_brings_in_etc() {
    let test = "a_source_swapped_for_a_link_during_create_never_brings_in_etc";
    if !runnable(test) {
        return;
    }
    let shared = tempfile::tempdir().expect("shared");
    let dir = std::fs::File::open(shared.path()).expect("open shared");
    std::fs::create_dir(shared.path().join("x")).expect("x");
    std::fs::write(shared.path().join("x/safe"), "safe").expect("safe");
    std::os::unix::fs::symlink("/etc", shared.path().join("l")).expect("l");
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = nix::fcntl::renameat2(
                    &dir,
                    "x",
                    &dir,
                    "l",
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                );
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let source = shared.path().join("x").display().to_string();
    let (mut refused, mut safe) = (0, 0);
    for attempt in 0..24 {
        let bundle = Bundle::new("ls /hx; cat /hx/passwd 2>/dev/null | head -c 5", |config| {
            config["mounts"]
                .as_array_mut()
                .expect("mounts")
                .push(ro_bind(&source, "/hx"));
        });
        let id = format!("race{attempt}");
        let created = bundle.create(&id, &[]);
        if !created.status.success() {
            let out = bundle.output();
            assert!(out.contains("/etc") && out.contains("refused"), "{out}");
            refused += 1;
            continue;
        }
        let pid = pid_of(&bundle.state(&id));
        assert!(bundle.oci(&["start", &id]).status.success());
        assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
        let seen = bundle.output();
        assert!(
            !seen.contains("passwd") && !seen.contains("root:"),
            "attempt {attempt}: the container saw the host's /etc: {seen}"
        );
        assert!(seen.contains("safe"), "attempt {attempt}: {seen}");
        safe += 1;
        assert!(bundle.oci(&["delete", &id]).status.success());
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    let swaps = swaps.load(Ordering::Relaxed);
    println!("race: {swaps} swaps, {safe} containers saw the directory, {refused} refused");
    assert!(swaps > 2_000, "the swapper hardly ran: {swaps}");
    assert_eq!(safe + refused, 24);
}

/// The race above, made exact: the launcher (a test build) exchanges `x`
/// and the link to /etc right after its own check of the binds' text and
/// before it opens them (`SUBSTRAT_OCI_TEST_EXCHANGE`), so both text
/// checks pass and only the judge of the opened descriptor can refuse.
/// It does, naming what it opened. Without it, /etc was mounted.
#[test]
fn a_source_swapped_between_check_and_open_is_refused_by_the_judge() {
    let test = "a_source_swapped_between_check_and_open_is_refused_by_the_judge";
    if !runnable(test) {
        return;
    }
    if !cfg!(debug_assertions) {
        println!("SKIPPED {test}: the exchange hook is compiled into debug builds only");
        return;
    }
    let shared = tempfile::tempdir().expect("shared");
    let (x, l) = (shared.path().join("x"), shared.path().join("l"));
    std::fs::create_dir(&x).expect("x");
    std::fs::write(x.join("safe"), "safe").expect("safe");
    std::os::unix::fs::symlink("/etc", &l).expect("l");
    let source = x.display().to_string();
    let bundle = Bundle::new("ls /hx; cat /hx/passwd 2>/dev/null | head -c 5", |config| {
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(ro_bind(&source, "/hx"));
    });
    let exchange = format!("{}:{}", x.display(), l.display());
    let created = bundle.create("exact", &[("SUBSTRAT_OCI_TEST_EXCHANGE", &exchange)]);
    let out = bundle.output();
    // The exchange happened: x is the link now.
    assert!(x.is_symlink(), "the hook did not run: {out}");
    assert!(
        !created.status.success(),
        "the container was created: {out}"
    );
    let judged = format!("bind source {source} (opened as /etc) into /hx is refused");
    assert!(out.contains(&judged), "not the judge's refusal: {out}");
    assert!(!out.contains("root:"), "{out}");
}

/// A bind whose source is a socket is refused: connect(2) ignores a
/// read-only bind, and a runtime's socket is host root.
#[test]
fn a_socket_as_a_binds_source_is_refused_even_read_only() {
    let test = "a_socket_as_a_binds_source_is_refused_even_read_only";
    if !runnable(test) {
        return;
    }
    let host = tempfile::tempdir().expect("host dir");
    let socket = host.path().join("engine.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("socket");
    let source = socket.display().to_string();
    let bundle = Bundle::new("true", |config| {
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(ro_bind(&source, "/engine.sock"));
    });
    let created = bundle.create("sockbind", &[]);
    let out = bundle.output();
    assert!(!created.status.success(), "a socket was bound: {out}");
    assert!(
        out.contains("is a Unix socket") && out.contains("engine.sock"),
        "{out}"
    );
}

/// What a container tries in a bound host directory holding root's
/// sockets and files (issue 44): each line says what happened.
const STRANGER: &str = r#"python3 -c "
import socket
for path in ('/hx/engine.sock', '/hx/tmux-0/default'):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(path, 'connected')
    except OSError as e:
        print(path, e.strerror)
for path, mode in (('/hx/secret', 'r'), ('/hx/made', 'w')):
    try:
        open(path, mode).close()
        print(path, 'opened')
    except OSError as e:
        print(path, e.strerror)
""#;

/// A host directory no deny list names, as root leaves one: a runtime's
/// socket (0660), a tmux socket in root's 0700 directory, a 0600 file.
fn roots_directory() -> (tempfile::TempDir, Vec<std::os::unix::net::UnixListener>) {
    use std::os::unix::fs::PermissionsExt;
    let host = tempfile::tempdir().expect("host dir");
    let dir = host.path().join("x");
    std::fs::create_dir(&dir).expect("x");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod x");
    std::fs::create_dir(dir.join("tmux-0")).expect("tmux-0");
    std::fs::set_permissions(dir.join("tmux-0"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod tmux-0");
    let engine = std::os::unix::net::UnixListener::bind(dir.join("engine.sock")).expect("engine");
    std::fs::set_permissions(
        dir.join("engine.sock"),
        std::fs::Permissions::from_mode(0o660),
    )
    .expect("chmod engine.sock");
    let tmux = std::os::unix::net::UnixListener::bind(dir.join("tmux-0/default")).expect("tmux");
    std::fs::write(dir.join("secret"), "root's").expect("secret");
    std::fs::set_permissions(dir.join("secret"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod secret");
    (host, vec![engine, tmux])
}

fn run_stranger(source: &str, id: &str, env: &[(&str, &str)]) -> String {
    let bundle = Bundle::new(STRANGER, |config| {
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({
                "destination": "/hx", "type": "bind", "source": source, "options": ["rbind"]
            }));
    });
    let created = bundle.create(id, env);
    assert!(created.status.success(), "create: {}", bundle.output());
    let pid = pid_of(&bundle.state(id));
    assert!(bundle.oci(&["start", id]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    let out = bundle.output();
    assert!(bundle.oci(&["delete", id]).status.success());
    out
}

/// Issue 44, the class: a host path is shown as it is, so the container is
/// its subordinate uid there, a stranger: root's sockets do not connect,
/// root's files do not open, in a directory no deny list names. Before,
/// the bind was idmapped and container root acted as host root: every
/// line below said `connected` or `opened`. The operator's
/// `idmap_host_paths` grants that back for a named place.
#[test]
fn atk_roots_sockets_and_files_in_a_bound_directory_stay_closed() {
    let test = "atk_roots_sockets_and_files_in_a_bound_directory_stay_closed";
    if !runnable(test) {
        return;
    }
    let (host, _listeners) = roots_directory();
    let source = host.path().join("x").display().to_string();
    let out = run_stranger(&source, "stranger", &[]);
    for line in [
        "/hx/engine.sock Permission denied",
        "/hx/tmux-0/default Permission denied",
        "/hx/secret Permission denied",
        "/hx/made Permission denied",
    ] {
        assert!(out.contains(line), "{line} not in: {out}");
    }
    // Granted by the operator: idmapped, container root acts as host root.
    let config = host.path().join("oci.toml");
    std::fs::write(&config, format!("idmap_host_paths = [\"{source}\"]\n")).expect("config");
    let config = config.display().to_string();
    let out = run_stranger(&source, "granted", &[("SUBSTRAT_OCI_CONFIG", &config)]);
    for line in [
        "/hx/engine.sock connected",
        "/hx/tmux-0/default connected",
        "/hx/secret opened",
        "/hx/made opened",
    ] {
        assert!(out.contains(line), "{line} not in: {out}");
    }
}

/// Issue 44: the operator's `socket = true` grant was keyed on the target
/// alone, so any socket bound at that target connected (the engine's own
/// socket as `/run/substrat/broker.sock`). A grant is now for its source's
/// socket, checked on the descriptor the launcher opened (device, inode).
#[test]
fn atk_a_socket_grant_for_a_target_does_not_admit_another_socket() {
    let test = "atk_a_socket_grant_for_a_target_does_not_admit_another_socket";
    if !runnable(test) {
        return;
    }
    let host = tempfile::tempdir().expect("host dir");
    let granted = host.path().join("broker.sock");
    let other = host.path().join("engine.sock");
    let _listeners =
        [&granted, &other].map(|p| std::os::unix::net::UnixListener::bind(p).expect("socket"));
    // A link to the granted socket, named in the configuration: resolved
    // once, when the configuration is read.
    let link = host.path().join("link.sock");
    std::os::unix::fs::symlink(&granted, &link).expect("link");
    let config = host.path().join("oci.toml");
    std::fs::write(
        &config,
        format!(
            "agent_binds = [{{ target = \"/b.sock\", mode = \"ro\", socket = true, source = \"{}\" }}]\n\
             idmap_host_paths = [\"{}\"]\n",
            link.display(),
            host.path().display()
        ),
    )
    .expect("config");
    let config = config.display().to_string();
    let env = [("SUBSTRAT_OCI_CONFIG", config.as_str())];
    let script = r#"python3 -c "
import socket
s = socket.socket(socket.AF_UNIX)
s.connect('/b.sock')
print('b.sock connected')
""#;
    let bundle_of = |source: &std::path::Path| {
        let source = source.display().to_string();
        Bundle::new(script, |config| {
            config["mounts"].as_array_mut().expect("mounts").push(json!({
                "destination": "/b.sock", "type": "bind", "source": source, "options": ["rbind", "ro"]
            }));
        })
    };
    // The other socket at the granted target: refused at create.
    let bundle = bundle_of(&other);
    let created = bundle.create("othersock", &env);
    let out = bundle.output();
    assert!(!created.status.success(), "another socket was bound: {out}");
    assert!(
        out.contains("not the one the operator granted") && out.contains("/b.sock"),
        "{out}"
    );
    // The granted socket connects.
    let bundle = bundle_of(&granted);
    let created = bundle.create("grantsock", &env);
    assert!(created.status.success(), "{}", bundle.output());
    let pid = pid_of(&bundle.state("grantsock"));
    assert!(bundle.oci(&["start", "grantsock"]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    assert!(
        bundle.output().contains("b.sock connected"),
        "{}",
        bundle.output()
    );
    assert!(bundle.oci(&["delete", "grantsock"]).status.success());
}
