//! Whole plans compared.

use super::fs::target_of;
use super::*;
use substrat_policy::{LoadOptions, SeccompChoice, load_builtin, load_str};

pub(super) fn context() -> AgentContext {
    AgentContext {
        workspace: "/srv/ws".into(),
        home: "/home/ana".into(),
        agent_id: "a1".into(),
        host_env: vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("LC_ALL".into(), "C".into()),
            ("GITHUB_TOKEN".into(), "s3cret".into()),
            ("PATH".into(), "/home/ana/bin:/usr/bin".into()),
        ],
        uid: 1000,
        gid: 1001,
        argv: vec!["make".into(), "test".into()],
        agent_binds: vec![],
        pass_env: vec![],
        home_mount: HomeMount::None,
        terminal: false,
        workspace_layer: None,
        landlock_abi: 7,
    }
}

fn bind(source: &str, access: Access, optional: bool) -> MountStep {
    MountStep::Bind {
        source: source.into(),
        target: source.into(),
        access,
        optional,
        socket: SocketUse::Refuse,
    }
}

fn protect(relative: &str, dir: bool) -> MountStep {
    MountStep::Protect {
        source: "/srv/ws".into(),
        target: "/srv/ws".into(),
        relative: relative.into(),
        dir,
    }
}

fn rule(path: &str, access: LandlockAccess) -> LandlockRule {
    LandlockRule {
        path: path.into(),
        access,
    }
}

#[test]
fn worker_plan_as_a_whole() {
    let policy = load_builtin("worker", &LoadOptions::default())
        .unwrap()
        .unwrap();
    let plan = build_plan(&policy, &context()).unwrap();
    let SeccompChoice::Profile { profile, path, .. } = &policy.seccomp else {
        panic!("worker has a profile")
    };
    let expected = LaunchPlan {
        policy_name: "worker".into(),
        namespaces: Namespaces {
            user: true,
            mount: true,
            pid: true,
            ipc: true,
            uts: true,
            net: true,
            nested_userns: false,
            cgroup: false,
        },
        uid_map: IdMap {
            inside: 0,
            outside: 1000,
        },
        gid_map: IdMap {
            inside: 0,
            outside: 1001,
        },
        hostname: "substrat".into(),
        mounts: vec![
            // Depth 1 first (policy order within a depth), then depth 2...
            bind("/usr", Access::Ro, false),
            bind("/bin", Access::Ro, true),
            bind("/sbin", Access::Ro, true),
            bind("/lib", Access::Ro, true),
            bind("/lib64", Access::Ro, true),
            MountStep::Tmpfs {
                target: "/tmp".into(),
                mode: 0o1777,
                size: None,
            },
            bind("/etc/alternatives", Access::Ro, true),
            bind("/etc/ld.so.cache", Access::Ro, true),
            bind("/etc/localtime", Access::Ro, true),
            bind("/srv/ws", Access::Rw, false),
            bind("/etc/ssl/certs", Access::Ro, true),
            MountStep::Dev {
                target: "/dev".into(),
            },
            MountStep::Proc {
                target: "/proc".into(),
            },
            protect(".cursor", true),
            protect(".git/hooks", true),
            protect(".git/config", false),
            MountStep::RootReadOnly,
        ],
        landlock: LandlockPlan {
            mode: LandlockMode::Required,
            rules: vec![
                rule("/usr", LandlockAccess::ReadExec),
                rule("/bin", LandlockAccess::ReadExec),
                rule("/sbin", LandlockAccess::ReadExec),
                rule("/lib", LandlockAccess::ReadExec),
                rule("/lib64", LandlockAccess::ReadExec),
                rule("/tmp", LandlockAccess::ReadWriteExec),
                rule("/etc/alternatives", LandlockAccess::ReadExec),
                rule("/etc/ld.so.cache", LandlockAccess::ReadExec),
                rule("/etc/localtime", LandlockAccess::ReadExec),
                rule("/srv/ws", LandlockAccess::ReadWriteExec),
                rule("/etc/ssl/certs", LandlockAccess::ReadExec),
                rule("/", LandlockAccess::ListDirs),
                rule("/dev", LandlockAccess::Device),
                rule("/proc", LandlockAccess::Proc),
            ],
            scope: true,
            unix_connect: false,
        },
        seccomp: Some(SeccompPlan {
            name: "default".into(),
            path: path.clone(),
            profile: profile.clone(),
            socket_families: vec![SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6],
            spec_allow: true,
        }),
        rlimits: vec![
            RlimitSetting {
                kind: RlimitKind::Nofile,
                value: 4096,
            },
            RlimitSetting {
                kind: RlimitKind::Core,
                value: 0,
            },
            RlimitSetting {
                kind: RlimitKind::Fsize,
                value: 8 << 30,
            },
        ],
        cgroup: CgroupLimits {
            pids_max: Some(512),
            memory_max: Some(4 << 30),
            cpu_max: Some(2.0),
            enforcement: LimitEnforcement::Required,
        },
        // LANG and LC_* pass; the token and the host PATH do not; HOME and PATH are the policy's.
        env: vec![
            ("HOME".into(), "/home/ana".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("LC_ALL".into(), "C".into()),
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ],
        cwd: "/srv/ws".into(),
        argv: vec!["make".into(), "test".into()],
        proxy: None,
        gateway: None,
        mcp: None,
        terminal: false,
        overlay: None,
        joined: Vec::new(),
        oom_score_adj: None,
        layers: Vec::new(),
        max_ptys: super::DEFAULT_MAX_PTYS,
    };
    assert_eq!(plan, expected);
}

#[test]
fn proxy_network_bridges_one_port_and_sets_the_proxy_variables() {
    let text = "version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\nallow = [\"api2.cursor.sh\"]\n";
    let policy = load_str(
        std::path::Path::new("p.toml"),
        text,
        &LoadOptions::default(),
    )
    .unwrap();
    assert!(matches!(
        build_plan(&policy, &context()),
        Err(PlanError::ProxySocketMissing)
    ));
    let ctx = AgentContext {
        agent_binds: vec![AgentBind {
            source: "/tmp/p/proxy.sock".into(),
            target: PROXY_SOCKET_INSIDE.into(),
            access: Access::Ro,
        }],
        ..context()
    };
    let plan = build_plan(&policy, &ctx).unwrap();
    assert_eq!(
        plan.proxy,
        Some(BridgePlan {
            port: 3128,
            socket: "/run/substrat/proxy.sock".into()
        })
    );
    assert!(plan.namespaces.net, "its own network namespace");
    let families = &plan.seccomp.as_ref().unwrap().socket_families;
    assert_eq!(
        families,
        &[SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6]
    );
    let env: std::collections::BTreeMap<_, _> = plan.env.iter().cloned().collect();
    for name in [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "ALL_PROXY",
        "https_proxy",
        "http_proxy",
        "all_proxy",
    ] {
        assert_eq!(env[name], "http://127.0.0.1:3128", "{name}");
    }
    assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1,::1");
}

#[test]
fn the_gateways_socket_bound_in_bridges_its_port_and_never_on_the_hosts_network() {
    let gateway = AgentBind {
        source: "/tmp/p/gateway.sock".into(),
        target: GATEWAY_SOCKET_INSIDE.into(),
        access: Access::Ro,
    };
    let proxy = AgentBind {
        source: "/tmp/p/proxy.sock".into(),
        target: PROXY_SOCKET_INSIDE.into(),
        access: Access::Ro,
    };
    let load = |text: &str| {
        load_str(
            std::path::Path::new("p.toml"),
            text,
            &LoadOptions::default(),
        )
        .unwrap()
    };
    let worker = load("version = 1\nextends = \"worker\"\n");
    let ctx = AgentContext {
        agent_binds: vec![gateway.clone()],
        ..context()
    };
    let plan = build_plan(&worker, &ctx).unwrap();
    let bridged = BridgePlan {
        port: 3129,
        socket: "/run/substrat/gateway.sock".into(),
    };
    assert_eq!(
        (plan.proxy.as_ref(), plan.gateway.as_ref()),
        (None, Some(&bridged))
    );
    assert!(plan.namespaces.net);
    let families = &plan.seccomp.as_ref().unwrap().socket_families;
    assert!(
        families.contains(&SocketFamily::Inet),
        "a TCP socket to reach the port"
    );
    assert!(
        !plan.env.iter().any(|(k, _)| k.ends_with("PROXY")),
        "no proxy variables"
    );
    // With the proxy too: both ports, each its own bridge.
    let proxied = load(
        "version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\nallow = [\"x.test\"]\n",
    );
    let ctx = AgentContext {
        agent_binds: vec![proxy, gateway.clone()],
        ..context()
    };
    let plan = build_plan(&proxied, &ctx).unwrap();
    assert_eq!(
        plan.bridges().map(|b| b.port).collect::<Vec<_>>(),
        [3128, 3129]
    );
    // The host's network has no loopback of the sandbox's own.
    let host = load("version = 1\nextends = \"worker\"\nnetwork = \"host\"\n");
    let ctx = AgentContext {
        agent_binds: vec![gateway],
        ..context()
    };
    assert!(matches!(
        build_plan(&host, &ctx),
        Err(PlanError::GatewayOnHostNetwork)
    ));
}

#[test]
fn host_network_allows_inet_sockets_and_tcp() {
    let text = "version = 1\nextends = \"worker\"\nnetwork = \"host\"\n";
    let policy = load_str(
        std::path::Path::new("p.toml"),
        text,
        &LoadOptions::default(),
    )
    .unwrap();
    let plan = build_plan(&policy, &context()).unwrap();
    assert!(!plan.namespaces.net);
    let families = plan.seccomp.unwrap().socket_families;
    assert_eq!(
        families,
        [SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6]
    );
}

#[test]
fn bad_context_is_refused() {
    let policy = load_builtin("worker", &LoadOptions::default())
        .unwrap()
        .unwrap();
    let empty = AgentContext {
        argv: vec![],
        ..context()
    };
    assert!(matches!(
        build_plan(&policy, &empty),
        Err(PlanError::EmptyCommand)
    ));
    let relative = AgentContext {
        workspace: "ws".into(),
        ..context()
    };
    assert!(matches!(
        build_plan(&policy, &relative),
        Err(PlanError::Workspace(_))
    ));
    let dotdot = AgentContext {
        workspace: "/srv/../etc".into(),
        ..context()
    };
    assert!(matches!(
        build_plan(&policy, &dotdot),
        Err(PlanError::Workspace(_))
    ));
    let steering = AgentContext {
        agent_id: "../x".into(),
        ..context()
    };
    let text = "version = 1\nextends = \"worker\"\n[filesystem]\nbinds = [{ source = \"/var/lib/${AGENT_ID}\", mode = \"ro\" }]\n";
    let policy = load_str(
        std::path::Path::new("p.toml"),
        text,
        &LoadOptions::default(),
    )
    .unwrap();
    assert!(matches!(
        build_plan(&policy, &steering),
        Err(PlanError::Path { .. })
    ));
}

#[test]
fn a_bind_inside_tmp_comes_after_the_tmpfs() {
    let ctx = AgentContext {
        workspace: "/tmp/ws".into(),
        ..context()
    };
    let policy = load_builtin("strict", &LoadOptions::default())
        .unwrap()
        .unwrap();
    let plan = build_plan(&policy, &ctx).unwrap();
    let position = |wanted: &str| {
        plan.mounts
            .iter()
            .position(|m| target_of(m) == Some(std::path::Path::new(wanted)))
            .unwrap()
    };
    assert!(position("/tmp") < position("/tmp/ws"));
    assert_eq!(plan.cwd, std::path::PathBuf::from("/tmp/ws"));
}

#[test]
fn the_home_sits_below_the_workspace_and_the_policys_binds_in_it() {
    let policy = load_str(
        std::path::Path::new("p.toml"),
        "version = 1\nextends = \"worker\"\n[filesystem]\nbinds = [\n\
         { source = \"${WORKSPACE}\", mode = \"rw\" },\n\
         { source = \"${HOME}/.gitconfig\", mode = \"ro\", optional = true },\n]\n",
        &LoadOptions::default(),
    )
    .unwrap();
    let home_steps = |home_mount: HomeMount| {
        let ctx = AgentContext {
            workspace: "/home/ana/proj".into(),
            home_mount,
            ..context()
        };
        build_plan(&policy, &ctx).unwrap().mounts
    };
    let gitconfig = MountStep::Bind {
        source: "/home/ana/.gitconfig".into(),
        target: "/home/ana/.gitconfig".into(),
        access: Access::Ro,
        optional: true,
        socket: SocketUse::Refuse,
    };
    let workspace = bind("/home/ana/proj", Access::Rw, false);
    let protect = |relative: &str, dir| MountStep::Protect {
        source: "/home/ana/proj".into(),
        target: "/home/ana/proj".into(),
        relative: relative.into(),
        dir,
    };
    let tail = |home: MountStep| {
        vec![
            MountStep::Tmpfs {
                target: "/tmp".into(),
                mode: 0o1777,
                size: None,
            },
            home,
            workspace.clone(),
            gitconfig.clone(),
            MountStep::Dev {
                target: "/dev".into(),
            },
            MountStep::Proc {
                target: "/proc".into(),
            },
            protect(".cursor", true),
            protect(".git/hooks", true),
            protect(".git/config", false),
            MountStep::RootReadOnly,
        ]
    };
    // A private tmpfs at home, made before what the policy and the
    // workspace put inside it.
    let mounts = home_steps(HomeMount::Tmpfs);
    assert_eq!(
        mounts[mounts.len() - 10..],
        tail(MountStep::Tmpfs {
            target: "/home/ana".into(),
            mode: 0o700,
            size: None,
        })[..]
    );
    // The agent's own home: read-write, and no protected paths in it.
    let mounts = home_steps(HomeMount::Bind("/st/agents/a1/home".into()));
    assert_eq!(
        mounts[mounts.len() - 10..],
        tail(MountStep::Bind {
            source: "/st/agents/a1/home".into(),
            target: "/home/ana".into(),
            access: Access::Rw,
            optional: false,
            socket: SocketUse::Unjudged,
        })[..]
    );
    // A policy that mounts the home itself decides what is there.
    let own = load_str(
        std::path::Path::new("p.toml"),
        "version = 1\nextends = \"worker\"\n[filesystem]\ntmpfs = [\"/tmp\", \"${HOME}\"]\n",
        &LoadOptions::default(),
    )
    .unwrap();
    let ctx = AgentContext {
        home_mount: HomeMount::Bind("/st/agents/a1/home".into()),
        ..context()
    };
    let plan = build_plan(&own, &ctx).unwrap();
    let at_home: Vec<&MountStep> = plan
        .mounts
        .iter()
        .filter(|m| target_of(m) == Some(std::path::Path::new("/home/ana")))
        .collect();
    assert_eq!(
        at_home,
        [&MountStep::Tmpfs {
            target: "/home/ana".into(),
            mode: 0o1777,
            size: None,
        }]
    );
}

mod agent_binds {
    use super::*;
    use substrat_policy::{LoadOptions, load_builtin};

    #[test]
    fn agent_binds_sit_on_top_of_protected_paths_with_landlock_rules() {
        let policy = load_builtin("worker", &LoadOptions::default())
            .unwrap()
            .unwrap();
        let bind = |source: &str, target: &str, access| AgentBind {
            source: source.into(),
            target: target.into(),
            access,
        };
        let ctx = AgentContext {
            workspace: "/srv/ws".into(),
            home: "/home/ana".into(),
            agent_id: "a1".into(),
            host_env: vec![],
            uid: 1000,
            gid: 1000,
            argv: vec!["agent".into()],
            home_mount: HomeMount::None,
            terminal: false,
            workspace_layer: None,
            landlock_abi: 7,
            agent_binds: vec![
                bind("/st/agents/a1/chats", "/home/ana/.cursor/chats", Access::Rw),
                bind(
                    "/st/agents/a1/mcp.json",
                    "/srv/ws/.cursor/mcp.json",
                    Access::Ro,
                ),
                bind(
                    "/st/agents/a1/broker.sock",
                    "/run/substrat/broker.sock",
                    Access::Ro,
                ),
            ],
            pass_env: vec![],
        };
        let plan = build_plan(&policy, &ctx).unwrap();
        let tail: Vec<&MountStep> = plan.mounts.iter().rev().take(5).rev().collect();
        let step = |source: &str, target: &str, access| MountStep::Bind {
            source: source.into(),
            target: target.into(),
            access,
            optional: false,
            socket: if target == BROKER_SOCKET_INSIDE {
                SocketUse::Connect
            } else {
                SocketUse::Unjudged
            },
        };
        assert_eq!(
            tail,
            [
                &MountStep::Protect {
                    source: "/srv/ws".into(),
                    target: "/srv/ws".into(),
                    relative: ".git/config".into(),
                    dir: false,
                },
                &step("/st/agents/a1/chats", "/home/ana/.cursor/chats", Access::Rw),
                &step(
                    "/st/agents/a1/mcp.json",
                    "/srv/ws/.cursor/mcp.json",
                    Access::Ro
                ),
                &step(
                    "/st/agents/a1/broker.sock",
                    "/run/substrat/broker.sock",
                    Access::Ro
                ),
                &MountStep::RootReadOnly,
            ]
        );
        let rule = |path: &str, access| LandlockRule {
            path: path.into(),
            access,
        };
        let rules = &plan.landlock.rules;
        for wanted in [
            rule("/home/ana/.cursor/chats", LandlockAccess::ReadWriteExec),
            rule("/srv/ws/.cursor/mcp.json", LandlockAccess::ReadExec),
            rule("/run/substrat/broker.sock", LandlockAccess::ReadExec),
        ] {
            assert!(rules.contains(&wanted), "{wanted:?} in {rules:?}");
        }
    }
}
