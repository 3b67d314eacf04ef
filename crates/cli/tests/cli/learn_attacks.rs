//! `learn` against what the learned command did in issue 45's review:
//! each attack attempted in a real launcher, and the exact outcome.

use super::learn::{binds_add, learn, scratch, skipped};
use super::*;

fn dirs(dir: &Path) -> (PathBuf, PathBuf) {
    let (home, ws) = (dir.join("home"), dir.join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    (home, ws)
}

#[test]
fn learn_refuses_what_check_flags_before_a_run_under_it() {
    if skipped("learn_refuses_what_check_flags_before_a_run_under_it") {
        return;
    }
    let dir = scratch();
    let (home, ws) = dirs(dir.path());
    // A name `check` flags (SBX008, high: a D-Bus directory) and the plan
    // does not know.
    let file = dir.path().join("dbus-1/system.conf");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "BUS-CONFIG\n").unwrap();
    let out = dir.path().join("learned.toml");
    let got = learn(&home, &ws, &out, &format!("cat {}; true", file.display()));
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 0, "{stderr}");
    // No run was given it: one run, the file never read.
    assert!(!stderr.contains("BUS-CONFIG"), "{stderr}");
    assert!(!stderr.contains("learn: run 2"), "{stderr}");
    let line = format!(
        "learn: wanted, not granted: {} (check SBX008: ",
        file.display()
    );
    assert!(stderr.contains(&line), "{line} missing:\n{stderr}");
    let policy = std::fs::read_to_string(&out).unwrap();
    assert_eq!(binds_add(&policy), "binds_add = [\n]\n");
}

#[test]
fn learn_never_writes_out_where_the_command_writes_or_through_a_link() {
    if skipped("learn_never_writes_out_where_the_command_writes_or_through_a_link") {
        return;
    }
    let dir = scratch();
    let (home, ws) = dirs(dir.path());
    let victim = home.join(".bashrc");
    std::fs::write(&victim, "echo original\n").unwrap();
    // In the workspace: the command plants a link at the name.
    let planted = ws.join("learned.toml");
    let script = format!("ln -sf {} learned.toml; true", victim.display());
    let got = learn(&home, &ws, &planted, &script);
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 2, "{stderr}");
    assert!(
        stderr.contains("is in the workspace, which the command writes"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("learn: run 1"),
        "refused before any run: {stderr}"
    );
    // Outside it, a link already there is not written through.
    let link = dir.path().join("link.toml");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let got = learn(&home, &ws, &link, "true");
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 2, "{stderr}");
    assert!(
        stderr.contains("is a symbolic link: not written through it"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "echo original\n");
}

#[test]
fn learn_never_binds_a_directory_holding_a_socket() {
    if skipped("learn_never_binds_a_directory_holding_a_socket") {
        return;
    }
    let dir = scratch();
    let (home, ws) = dirs(dir.path());
    let svc = dir.path().join("svc");
    std::fs::create_dir_all(svc.join("sub")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(svc.join("sub/s.sock")).unwrap();
    let out = dir.path().join("learned.toml");
    let script = format!(
        "python3 -c \"import os\ntry: os.listdir('{}')\nexcept OSError: pass\"",
        svc.display()
    );
    let got = learn(&home, &ws, &out, &script);
    let stderr = String::from_utf8_lossy(&got.stderr);
    assert_eq!(code(&got), 0, "{stderr}");
    let line = format!(
        "learn: wanted, not granted: {} (a directory of service sockets",
        svc.display()
    );
    assert!(stderr.contains(&line), "{line} missing:\n{stderr}");
    let policy = std::fs::read_to_string(&out).unwrap();
    assert!(!policy.contains("/svc\""), "{policy}");
}

#[test]
fn learn_grants_a_write_to_one_file_never_a_directory_or_a_toolchain() {
    if skipped("learn_grants_a_write_to_one_file_never_a_directory_or_a_toolchain") {
        return;
    }
    let dir = scratch();
    let (home, ws) = dirs(dir.path());
    std::fs::create_dir_all(home.join(".cache/tool")).unwrap();
    std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
    std::fs::create_dir_all(home.join(".config/systemd")).unwrap();
    std::fs::write(home.join(".cache/tool/data"), "").unwrap();
    std::fs::write(home.join(".cargo/bin/cargo"), "#!/bin/sh\n").unwrap();
    let out = dir.path().join("learned.toml");
    // O_WRONLY of a directory (EISDIR), a toolchain's program, a cache file.
    let script = "(: 3>>\"$HOME/.config/systemd\") 2>/dev/null; \
                  (printf x >> \"$HOME/.cargo/bin/cargo\") 2>/dev/null; \
                  printf x >> \"$HOME/.cache/tool/data\"";
    let got = learn(&home, &ws, &out, script);
    let stderr = String::from_utf8_lossy(&got.stderr);
    // Run 2 binds the one file read-write (a file bind: no protected
    // paths below it) and the write succeeds, as in the replay.
    assert_eq!(code(&got), 0, "{stderr}");
    let policy = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        binds_add(&policy),
        format!(
            "binds_add = [\n  # written: {}/.cache/tool/data\n  {{ source = \"${{HOME}}/.cache/tool/data\", mode = \"rw\" }},\n]\n",
            home.display()
        )
    );
    let line = format!(
        "learn: wanted, not granted: {}/.cargo/bin/cargo (a shell startup file or tool configuration",
        home.display()
    );
    assert!(stderr.contains(&line), "{line} missing:\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(home.join(".cargo/bin/cargo")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".cache/tool/data")).unwrap(),
        "xx"
    );
}
