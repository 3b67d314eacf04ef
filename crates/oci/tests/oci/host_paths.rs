//! Host binds (issue 44): a socket as a bind's source.

use serde_json::json;

use super::{Bundle, runnable};

fn ro_bind(source: &str, destination: &str) -> serde_json::Value {
    json!({"destination": destination, "type": "bind", "source": source, "options": ["rbind", "ro"]})
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
