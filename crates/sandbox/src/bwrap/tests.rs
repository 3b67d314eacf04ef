//! The bwrap backend's pure parts: the argv and the helper's arguments
//! and configuration.

use super::helper::parse_helper_config;
use super::*;
use crate::plan::{AgentContext, build_plan};
use substrat_policy::{LoadOptions, load_str};

/// A small policy so the whole argv fits on a page.
fn plan() -> LaunchPlan {
    let text = r#"
version = 1
network = "none"
[filesystem]
binds = [
  { source = "/usr", mode = "ro" },
  { source = "/lib64", mode = "ro", optional = true },
  { source = "${WORKSPACE}", mode = "rw" },
]
protected = [".git/hooks/", ".git/config"]
[env]
set = { PATH = "/usr/bin" }
[rlimits]
core = 0
"#;
    let policy = load_str(Path::new("p.toml"), text, &LoadOptions::default()).unwrap();
    let ctx = AgentContext {
        home_mount: crate::plan::HomeMount::None,
        terminal: false,
        workspace_layer: None,
        workspace: "/ws".into(),
        home: "/home/a".into(),
        agent_id: "a1".into(),
        host_env: vec![],
        uid: 1000,
        gid: 1000,
        argv: vec!["make".into(), "test".into()],
        agent_binds: vec![],
        pass_env: vec![],
        landlock_abi: 7,
    };
    build_plan(&policy, &ctx).unwrap()
}

#[test]
fn argv_as_a_whole() {
    let plan = plan();
    // Mount steps: /usr, /lib64, /ws, /tmp (one depth: binds in policy
    // order, then tmpfs), /dev, /proc, protect hooks, protect config, root ro.
    let fds = BwrapFds {
        binds: vec![Some(3), None, Some(4), None, None, None, None, None, None],
        protected: vec![
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![(".git".into(), 5, false), (".git/hooks".into(), 6, true)],
            vec![(".git".into(), 7, false), (".git/config".into(), 8, true)],
            vec![],
        ],
        helper: 9,
        seccomp: vec![10, 11],
        sync: None,
        status: 12,
        config: 13,
    };
    let argv = bwrap_argv(
        &plan,
        &fds,
        BwrapFeatures {
            disable_userns: true,
        },
    );
    let strings = |v: &[OsString]| -> Vec<String> {
        v.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    };
    let expected_options: Vec<&str> = vec![
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--disable-userns",
        "--assert-userns-disabled",
        "--hostname",
        "substrat",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin",
        "--ro-bind-fd",
        "3",
        "/usr",
        // /lib64 is absent and optional: no argument at all.
        "--bind-fd",
        "4",
        "/ws",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        // .git pinned once (fd 7 is not used), then both protected paths.
        "--bind-fd",
        "5",
        "/ws/.git",
        "--ro-bind-fd",
        "6",
        "/ws/.git/hooks",
        "--ro-bind-fd",
        "8",
        "/ws/.git/config",
        "--remount-ro",
        "/",
        "--cap-drop",
        "ALL",
        "--add-seccomp-fd",
        "10",
        "--add-seccomp-fd",
        "11",
        "--chdir",
        "/ws",
    ];
    assert_eq!(strings(&argv.options), expected_options);
    // The command: the helper with its descriptors, then the policy's.
    let expected_command = vec![
        "/proc/self/fd/9",
        "--status-fd",
        "12",
        "--config-fd",
        "13",
        "--",
        "make",
        "test",
    ];
    assert_eq!(strings(&argv.command), expected_command);
    // What `--args` reads: the options, each ended by a NUL.
    let file = argv.options_file();
    // (\x30 is the uid, "0".)
    assert!(file.starts_with(b"--unshare-user\0--uid\0\x30\0"));
    assert!(file.ends_with(b"--chdir\0/ws\0"));
    assert_eq!(
        file.iter().filter(|&&b| b == 0).count(),
        expected_options.len()
    );
}

#[test]
fn helper_arguments_are_exactly_what_the_argv_writes() {
    // What bwrap_argv puts after the helper's path parses back whole.
    let fds = BwrapFds {
        helper: 9,
        status: 12,
        config: 13,
        ..BwrapFds::default()
    };
    let features = BwrapFeatures {
        disable_userns: true,
    };
    let command: Vec<String> = bwrap_argv(&plan(), &fds, features)
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        HelperArgs::parse(&command[1..]),
        Ok(HelperArgs {
            status_fd: 12,
            config_fd: 13,
            command: vec!["make".into(), "test".into()],
        })
    );
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for bad in [
        &["--status-fd", "x", "--config-fd", "13", "--", "make"][..],
        &["--status-fd", "12", "--config-fd", "{}", "--", "make"][..],
        &["--status-fd", "12", "--config-fd", "13", "--"][..],
        &["--config-fd", "13", "--status-fd", "12", "--", "make"][..],
        &["--status-fd", "12", "--config-fd", "13", "make"][..],
        &["--status-fd", "12", "--config", "{}", "--", "make"][..],
        &[][..],
    ] {
        assert!(HelperArgs::parse(&args(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn a_configuration_from_another_build_is_refused() {
    let features = BwrapFeatures {
        disable_userns: true,
    };
    let config = helper_config(&plan(), features, RlimitFallback::default());
    let json = serde_json::to_value(&config).unwrap();
    assert!(parse_helper_config(&json.to_string()).is_ok());
    let mut other = json.clone();
    other["build"] = "0.0.1".into();
    let err = parse_helper_config(&other.to_string())
        .unwrap_err()
        .to_string();
    assert!(err.contains("install both from one build"), "{err}");
    // A field this build does not know, at the top or inside the plan.
    for pointer in ["", "/landlock", "/landlock/rules/0"] {
        let mut newer = json.clone();
        newer.pointer_mut(pointer).unwrap()["added_later"] = true.into();
        let err = parse_helper_config(&newer.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `added_later`"),
            "{pointer}: {err}"
        );
    }
}

#[test]
fn old_bwrap_and_nested_userns_leave_userns_flags_out() {
    let plan = plan();
    let argv = bwrap_argv(
        &plan,
        &BwrapFds::default(),
        BwrapFeatures {
            disable_userns: false,
        },
    );
    assert!(!argv.options.iter().any(|a| a == "--disable-userns"));
}
