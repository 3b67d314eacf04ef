//! A volume holding a host Unix socket: the container can connect to it
//! (Landlock on this kernel has no right to stop that), and the runtime
//! says so in its log rather than promise a wall.

use serde_json::json;

use super::{Bundle, pid_of, runnable, wait_launcher};

#[test]
fn a_volume_holding_a_host_socket_is_reported_in_the_log_and_state() {
    let test = "a_volume_holding_a_host_socket_is_reported_in_the_log_and_state";
    if !runnable(test) {
        return;
    }
    let host = tempfile::tempdir().expect("host dir");
    std::fs::create_dir(host.path().join("sub")).expect("sub");
    let socket = host.path().join("sub/service.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("socket");
    let source = host.path().display().to_string();
    let bundle = Bundle::new("true", |config| {
        config["mounts"].as_array_mut().expect("mounts").push(
            json!({"destination": "/srv", "type": "bind", "source": source, "options": ["rbind", "ro"]}),
        );
    });
    assert!(
        bundle.create("sock", &[]).status.success(),
        "{}",
        bundle.output()
    );
    let record_path = bundle.runtime_root.path().join("sock/state.json");
    let record = std::fs::read_to_string(&record_path).unwrap_or_default();
    let pid = pid_of(&bundle.state("sock"));
    assert!(bundle.oci(&["start", "sock"]).status.success());
    assert_eq!(wait_launcher(pid), 0, "{}", bundle.output());
    let log = std::fs::read_to_string(bundle.path().join("log.json")).expect("log");
    let expected = format!(
        "sock: /srv: holds 1 host Unix socket(s) ({})",
        socket.display()
    );
    assert!(log.contains(&expected), "{log}");
    assert!(
        record.contains("/srv: holds 1 host Unix socket(s)"),
        "{record}"
    );
    assert!(bundle.oci(&["delete", "sock"]).status.success());
}
