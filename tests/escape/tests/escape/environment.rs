//! What the command starts with: the environment, descriptors, signal
//! dispositions.

use super::*;

// ---------------------------------------------------------------- environment

attack!(host_env_secret_invisible, |case| {
    let mut secret = case.command(
        "worker",
        &["./substrat-probe", "getenv", "SUBSTRAT_TEST_API_TOKEN"],
    );
    assert_eq!(
        outcome_of(secret.env("SUBSTRAT_TEST_API_TOKEN", "s3cret")),
        "value:unset"
    );
    // An allowed variable does pass: the probe reads the environment.
    let mut lang = case.command("worker", &["./substrat-probe", "getenv", "LANG"]);
    assert_eq!(outcome_of(lang.env("LANG", "C.UTF-8")), "value:set");
});

attack!(inherited_descriptor_to_a_host_secret_closed, |case| {
    // A careless parent leaves descriptor 7 open on a host file outside the
    // view; the sandboxed command must not get it (nor any of the
    // launcher's own descriptors: bind sources, the helper, pipes).
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "host secret").unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let leaking = |inner: &Command| {
        let script = "exec 7<\"$0\"; exec \"$@\"";
        run_through(
            &[
                "sh".as_ref(),
                "-c".as_ref(),
                script.as_ref(),
                secret.path().as_os_str(),
            ],
            inner,
        )
    };
    // The probe sees a leaked descriptor when nothing closes it...
    let direct = Command::new(case.path().join("substrat-probe"));
    let mut direct = leaking(&direct);
    direct.arg("open-fds");
    let seen = outcome_of(&mut direct);
    assert!(
        seen.starts_with("value:fds:") && seen.contains(&format!("7={}", secret.path().display())),
        "{seen}"
    );
    // ...and inside the sandbox there is none.
    let sandboxed = case.command("worker", &["./substrat-probe", "open-fds"]);
    assert_eq!(outcome_of(&mut leaking(&sandboxed)), "value:none");
});

attack!(command_starts_with_the_hosts_signal_dispositions, |case| {
    // The launcher and the bwrap helper are Rust programs, which ignore
    // SIGPIPE; an ignored signal survives exec, so the command would get
    // EPIPE errors where it dies quietly on the host (`yes | head -1`).
    // grep reads its own masks (the probe cannot: Rust ignores SIGPIPE
    // before its main).
    let masks = ["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"];
    let stdout = |out: Output| {
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = |shell: &str| {
        stdout(
            Command::new("sh")
                .args(["-c", shell, "sh"])
                .args(masks)
                .stdin(Stdio::null())
                .output()
                .unwrap(),
        )
    };
    // What this test's environment leaves ignored, with SIGPIPE's bit (12)
    // clear...
    let host = direct("exec \"$@\"");
    let ignored = |text: &str| {
        let hex = text
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .unwrap();
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    assert_eq!(ignored(&host) & (1 << 12), 0, "{host}");
    // ...grep does report an ignored SIGPIPE when its parent leaves one...
    let trapped = direct("trap '' PIPE; exec \"$@\"");
    assert_eq!(ignored(&trapped), ignored(&host) | (1 << 12), "{trapped}");
    // ...and the sandboxed command starts as the host's does: SIGPIPE not
    // ignored, nothing blocked...
    assert_eq!(stdout(case.run("worker", &masks)), host);
    // ...even when the launcher was started with SIGPIPE ignored and
    // SIGUSR1 (bit 9) blocked, which GNU env really does:
    let env = ["env", "--ignore-signal=PIPE", "--block-signal=USR1"].map(std::ffi::OsStr::new);
    let mut grep = Command::new(masks[0]);
    grep.args(&masks[1..]);
    let changed = stdout(run_through(&env, &grep).output().unwrap());
    assert!(
        changed.contains(&format!("SigBlk:\t{:016x}\n", 1 << 9)),
        "{changed}"
    );
    assert_eq!(ignored(&changed), ignored(&host) | (1 << 12), "{changed}");
    let launcher = case.command("worker", &masks);
    assert_eq!(stdout(run_through(&env, &launcher).output().unwrap()), host);
});
