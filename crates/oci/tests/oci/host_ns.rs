//! A bundle naming the host's own namespace to join (issue 44): the
//! network refusal (no `hostNetwork`) was bypassed by giving the path of
//! the host's network namespace in `linux.namespaces`.

use serde_json::json;

use super::{Bundle, runnable};

#[test]
fn joining_the_hosts_own_namespace_by_path_is_refused() {
    let test = "joining_the_hosts_own_namespace_by_path_is_refused";
    if !runnable(test) {
        return;
    }
    // The test's namespaces are the host's here, and the launcher's. (Pid
    // 1's are checked too, but this machine's pid 1 holds a capability
    // the test lacks: its /proc/1/ns cannot be opened at all here.)
    let me = std::process::id();
    for (kind, path) in [
        ("network", format!("/proc/{me}/ns/net")),
        ("network", "/proc/self/ns/net".to_string()),
        ("network", format!("/proc/{me}/task/{me}/ns/net")),
        ("ipc", format!("/proc/{me}/ns/ipc")),
        ("uts", format!("/proc/{me}/ns/uts")),
    ] {
        let path = path.as_str();
        let bundle = Bundle::new("true", |config| {
            let namespaces = config["linux"]["namespaces"]
                .as_array_mut()
                .expect("namespaces");
            namespaces.retain(|ns| ns["type"] != kind);
            namespaces.push(json!({"type": kind, "path": path}));
        });
        let created = bundle.create("hostns", &[]);
        let out = bundle.output();
        assert!(
            !created.status.success(),
            "{kind} at {path} was joined: {out}"
        );
        assert!(
            out.contains("(the host's): refused") && out.contains(path),
            "{kind} at {path}: {out}"
        );
        let _ = bundle.oci(&["delete", "--force", "hostns"]);
    }
}
