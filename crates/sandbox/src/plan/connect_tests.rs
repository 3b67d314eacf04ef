//! connect(2) to a pathname Unix socket in the plan: handled by Landlock
//! only on a kernel whose ABI has the right (9), granted only on the binds
//! that are sockets the command may reach; below 9, the plan as before.

use super::*;
use substrat_policy::{LoadOptions, load_str};

/// worker + network proxy, a marked socket bind, an unmarked directory
/// bind; the launcher's broker and proxy sockets and mcp.json bound in.
fn policy_and_context(abi: u32) -> (LoadedPolicy, AgentContext) {
    let text = "version = 1\nextends = \"worker\"\nnetwork = \"proxy\"\n[proxy]\nallow = [\"a.test\"]\n\
                [filesystem]\nbinds_add = [\
                { source = \"/run/dbus/system_bus_socket\", mode = \"ro\", socket = true }, \
                { source = \"/srv/data\", mode = \"ro\" }]\n";
    let policy = load_str(
        std::path::Path::new("p.toml"),
        text,
        &LoadOptions::default(),
    )
    .unwrap();
    let bind = |source: &str, target: &str| AgentBind {
        source: source.into(),
        target: target.into(),
        access: Access::Ro,
    };
    let ctx = AgentContext {
        workspace: "/srv/ws".into(),
        home: "/home/ana".into(),
        agent_id: "a1".into(),
        host_env: vec![],
        uid: 1000,
        gid: 1000,
        argv: vec!["agent".into()],
        agent_binds: vec![
            bind("/st/a1/broker.sock", BROKER_SOCKET_INSIDE),
            bind("/st/a1/mcp.json", "/srv/ws/.cursor/mcp.json"),
            bind("/tmp/p/proxy.sock", PROXY_SOCKET_INSIDE),
        ],
        pass_env: vec![],
        home_mount: HomeMount::None,
        terminal: false,
        workspace_layer: None,
        landlock_abi: abi,
    };
    (policy, ctx)
}

fn plan_at(abi: u32) -> LaunchPlan {
    let (policy, ctx) = policy_and_context(abi);
    build_plan(&policy, &ctx).unwrap()
}

fn connect(path: &str) -> LandlockRule {
    LandlockRule {
        path: path.into(),
        access: LandlockAccess::Connect,
    }
}

#[test]
fn abi_9_handles_connect_and_grants_it_exactly_on_the_sockets() {
    let below = plan_at(8);
    let plan = plan_at(9);
    let mut rules = below.landlock.rules.clone();
    rules.extend([
        connect("/run/dbus/system_bus_socket"),
        connect(BROKER_SOCKET_INSIDE),
        connect(PROXY_SOCKET_INSIDE),
    ]);
    assert_eq!(
        plan.landlock,
        LandlockPlan {
            mode: LandlockMode::Required,
            rules,
            scope: true,
            unix_connect: true,
        }
    );
    // Nothing else differs.
    assert_eq!(
        LaunchPlan {
            landlock: below.landlock.clone(),
            ..plan
        },
        below
    );
}

#[test]
fn below_abi_9_the_plan_does_not_handle_connect() {
    let plan = plan_at(7);
    assert!(!plan.landlock.unix_connect);
    assert!(
        plan.landlock
            .rules
            .iter()
            .all(|r| r.access != LandlockAccess::Connect)
    );
    // The same as Landlock's rules mirroring the view, as before the right.
    assert_eq!(plan, plan_at(0));
    assert_eq!(plan, plan_at(8));
    // The marked bind and the launcher's sockets are Connect, the others
    // the policy's (refused if a socket) or unjudged.
    let sockets: Vec<(&std::path::Path, SocketUse)> = plan
        .mounts
        .iter()
        .filter_map(|step| match step {
            MountStep::Bind { target, socket, .. } => Some((target.as_path(), *socket)),
            _ => None,
        })
        .filter(|(target, _)| {
            ["/run", "/srv/data", "/srv/ws/.cursor/mcp.json"]
                .iter()
                .any(|t| target.starts_with(t))
        })
        .collect();
    assert_eq!(
        sockets,
        [
            (std::path::Path::new("/srv/data"), SocketUse::Refuse),
            (
                std::path::Path::new("/run/dbus/system_bus_socket"),
                SocketUse::Connect
            ),
            (
                std::path::Path::new(BROKER_SOCKET_INSIDE),
                SocketUse::Connect
            ),
            (
                std::path::Path::new("/srv/ws/.cursor/mcp.json"),
                SocketUse::Unjudged
            ),
            (
                std::path::Path::new(PROXY_SOCKET_INSIDE),
                SocketUse::Connect
            ),
        ]
    );
}

#[test]
fn landlock_off_stays_off_on_abi_9() {
    let (policy, ctx) = policy_and_context(9);
    let mut policy = policy;
    policy.policy.landlock = LandlockMode::Off;
    let plan = build_plan(&policy, &ctx).unwrap();
    assert!(!plan.landlock.unix_connect);
    assert_eq!(
        plan.landlock,
        landlock_plan(LandlockMode::Off, &fs_view(&plan))
    );
}

/// The steps Landlock mirrors: the binds and tmpfs, in the plan's order.
fn fs_view(plan: &LaunchPlan) -> Vec<MountStep> {
    plan.mounts
        .iter()
        .filter(|s| matches!(s, MountStep::Bind { .. } | MountStep::Tmpfs { .. }))
        .cloned()
        .collect()
}
