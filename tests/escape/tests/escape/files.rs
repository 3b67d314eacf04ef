//! Files: reads and writes outside the binds, protected paths (made,
//! replaced, swapped for links).

use super::*;

// ---------------------------------------------------------------- files

attack!(read_planted_secret_outside_workspace, |case| {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "s3cret").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        case.probe(&["read", secret.to_str().unwrap()]),
        "errno:ENOENT"
    );
    assert_eq!(case.probe(&["read", "/etc/passwd"]), "errno:ENOENT");
    // The probe can read what it should: the attack path is real.
    assert_eq!(case.probe(&["read", "./substrat-probe"]), "ok");
});

attack!(write_outside_workspace, |case| {
    assert_eq!(
        case.probe(&["write", "/usr/bin/substrat-pwned"]),
        "errno:EROFS"
    );
    assert_eq!(case.probe(&["write", "/etc/substrat-pwned"]), "errno:EROFS");
    assert_eq!(case.probe(&["write", "/substrat-pwned"]), "errno:EROFS");
    assert!(!Path::new("/usr/bin/substrat-pwned").exists());
    // The workspace itself is writable, so the probe's writes do work.
    assert_eq!(case.probe(&["write", "allowed.txt"]), "ok");
    assert_eq!(
        std::fs::read_to_string(case.path().join("allowed.txt")).unwrap(),
        "pwned"
    );
});

attack!(write_existing_protected_file, |case| {
    std::fs::create_dir_all(case.path().join(".cursor")).unwrap();
    std::fs::write(case.path().join(".cursor/mcp.json"), "{}").unwrap();
    case.fix_ownership();
    assert_eq!(case.probe(&["write", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["append", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["write", ".cursor/other.json"]), "errno:EROFS");
    assert_eq!(
        std::fs::read_to_string(case.path().join(".cursor/mcp.json")).unwrap(),
        "{}"
    );
});

attack!(create_missing_protected_files, |case| {
    assert_eq!(case.probe(&["write", ".cursor/mcp.json"]), "errno:EROFS");
    assert_eq!(case.probe(&["mkdir", ".cursor/x"]), "errno:EROFS");
    assert!(!case.path().join(".cursor/mcp.json").exists());
});

attack!(replace_protected_dir, |case| {
    assert_eq!(case.probe(&["remove-dir", ".cursor"]), "errno:EBUSY");
    assert_eq!(
        case.probe(&["rename", ".cursor", "cursor-old"]),
        "errno:EBUSY"
    );
    assert_eq!(
        case.probe(&["symlink", "/tmp", ".cursor/link"]),
        "errno:EROFS"
    );
    // The workspace's `.git` is the agent's own git dir, mounted: it cannot
    // be renamed away or replaced either.
    assert_eq!(case.probe(&["rename", ".git", "git-old"]), "errno:EBUSY");
    assert_eq!(case.probe(&["remove-dir", ".git"]), "errno:EBUSY");
    // Nothing got through: the mount point was removed after the run, empty.
    assert!(!case.path().join(".cursor").exists() && !case.path().join(".cursor").is_symlink());
});

attack!(protected_symlink_planted_before_launch, |case| {
    std::fs::create_dir_all(case.path().join("evil")).unwrap();
    std::os::unix::fs::symlink("evil", case.path().join(".cursor")).unwrap();
    case.fix_ownership();
    let out = case.run("worker", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".cursor is a symlink"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("OUTCOME"),
        "nothing may run"
    );
    // A `.git` that is a symlink (to a git dir the agent made) is refused too.
    std::fs::remove_file(case.path().join(".cursor")).unwrap();
    std::os::unix::fs::symlink("evil", case.path().join(".git")).unwrap();
    case.fix_ownership();
    let out = case.run("worker", &["./substrat-probe", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".git is a symlink"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("OUTCOME"));
});
