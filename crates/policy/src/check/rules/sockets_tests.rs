//! SBX047-049: sockets judged where `check` resolved the binds on this
//! host (real sockets in a temporary directory).

use super::*;
use crate::load::{LoadOptions, load_str};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// worker with one more bind of `source`; its index.
fn with_bind(source: &Path, marker: &str) -> (LoadedPolicy, usize) {
    let text = format!(
        "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = [{{ source = \"{}\", target = \"/mnt/x\", mode = \"ro\"{marker} }}]\n",
        source.display()
    );
    let policy = load_str(Path::new("t.toml"), &text, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let index = policy.policy.filesystem.binds.len() - 1;
    (policy, index)
}

/// The findings of SBX047-049 with the bind resolved to `source` itself.
fn socket_findings(source: &Path, marker: &str, abi: Option<u32>) -> Vec<(String, String)> {
    let (policy, index) = with_bind(source, marker);
    let mut resolved = vec![None; index + 1];
    resolved[index] = Some(source.to_path_buf());
    check_policy_on(&policy, &resolved, abi)
        .into_iter()
        .filter(|f| ["SBX047", "SBX048", "SBX049"].contains(&f.rule_id))
        .map(|f| {
            assert_eq!(f.key_path, format!("filesystem.binds[{index}]"));
            (format!("{}:{}", f.rule_id, f.severity), f.message)
        })
        .collect()
}

#[test]
fn an_unmarked_socket_is_high_and_a_marked_one_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("docker.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    let s = sock.display();
    assert_eq!(
        socket_findings(&sock, "", Some(7)),
        [(
            "SBX047:high".to_string(),
            format!(
                "bind source `{s}` is a Unix socket and the bind is not marked `socket = true`: \
                 the launch refuses it (it would reach the Docker engine (root on the host) at `{s}`)"
            )
        )]
    );
    assert_eq!(
        socket_findings(&sock, ", socket = true", Some(7)),
        [(
            "SBX048:low".to_string(),
            format!(
                "reachable: the command can connect to the Docker engine (root on the host) at `{s}`"
            )
        )]
    );
}

#[test]
fn a_directory_holding_sockets_is_medium_below_abi_9() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let sock = dir.path().join("sub/app.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let (d, s) = (dir.path().display(), sock.display());
    let medium = |kernel: &str| {
        [(
            "SBX049:medium".to_string(),
            format!(
                "bind source `{d}` holds Unix sockets: `{s}`; Landlock cannot stop a connect {kernel}"
            ),
        )]
    };
    assert_eq!(
        socket_findings(dir.path(), "", Some(7)),
        medium("on this kernel (Landlock ABI 7)")
    );
    assert_eq!(
        socket_findings(dir.path(), "", None),
        medium("before Landlock ABI 9")
    );
    // ABI 9's ruleset denies connecting there: nothing to report.
    assert_eq!(socket_findings(dir.path(), "", Some(9)), []);
    // Marked, the sockets in it are meant to be reached.
    assert_eq!(
        socket_findings(dir.path(), ", socket = true", Some(7)),
        [(
            "SBX048:low".to_string(),
            format!("reachable: the command can connect to the service at `{s}`")
        )]
    );
    // A directory without sockets, and a bind not resolved: nothing.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(socket_findings(empty.path(), "", Some(7)), []);
    let (policy, _) = with_bind(dir.path(), "");
    assert!(
        !check_policy(&policy)
            .iter()
            .any(|f| ["SBX047", "SBX049"].contains(&f.rule_id))
    );
}
