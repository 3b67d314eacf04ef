//! A read-write bind of a file under a policy with protected paths
//! (`.cursor`, `.git/hooks`: made below directory binds only), on both
//! backends.

use super::learn::{scratch, skipped};
use super::*;

#[test]
fn run_binds_a_writable_file_under_a_policy_with_protected_paths() {
    if skipped("run_binds_a_writable_file_under_a_policy_with_protected_paths") {
        return;
    }
    let dir = scratch();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, "a").unwrap();
    let policy = dir.path().join("p.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\nextends = \"worker\"\n[filesystem]\nbinds_add = [ {{ source = \"{}\", mode = \"rw\" }} ]\n",
            data.display()
        ),
    )
    .unwrap();
    let has_bwrap = Command::new("bwrap").arg("--version").output().is_ok();
    let backends: &[&str] = if has_bwrap {
        &["native", "bwrap"]
    } else {
        &["native"]
    };
    if !has_bwrap {
        println!("SKIPPED the bwrap half: no bwrap on this host");
    }
    for backend in backends {
        let script = format!("printf y >> {}", data.display());
        let got = substrat_command(&[
            "run",
            "--backend",
            backend,
            "--policy",
            policy.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
        // Protected paths (`.cursor`, `.git/hooks`) below a file bind made
        // "stat mount point .../data/.cursor: ENOTDIR" before.
        let stderr = String::from_utf8_lossy(&got.stderr);
        assert_eq!(code(&got), 0, "{backend}: {stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(&data).unwrap(),
        "a".to_string() + &"y".repeat(backends.len())
    );
}
