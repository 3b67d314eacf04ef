//! The launch plan: a pure function from a policy and one agent's context to
//! everything the sandbox will be (namespaces, mounts in order, Landlock
//! rules, seccomp, limits, environment, command). Backends apply a plan;
//! tests compare whole plans.

use std::path::{Path, PathBuf};

use serde::Serialize;
use substrat_policy::model::LimitEnforcement;
use substrat_policy::model::{LandlockMode, NetworkMode};
use substrat_policy::paths::{ExpandContext, PathError};
use substrat_policy::seccomp::SeccompProfile;
use substrat_policy::{LoadedPolicy, SeccompChoice};

/// Who the sandbox is for and what it runs.
#[derive(Debug, Clone)]
pub struct AgentContext {
    /// Absolute, symlink-free path of the workspace.
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub agent_id: String,
    /// The launching environment, consulted only through `env.allow`.
    pub host_env: Vec<(String, String)>,
    /// The invoking user: root inside the sandbox maps to these.
    pub uid: u32,
    pub gid: u32,
    pub argv: Vec<String>,
    /// What the launcher adds for an agent's turn (its chats, its broker
    /// socket, the read-only mcp.json, the relay and provider programs).
    pub agent_binds: Vec<AgentBind>,
    /// Variables passed from `host_env` besides the policy's allowlist
    /// (an upstream server's configured environment).
    pub pass_env: Vec<String>,
}

/// A bind the launcher adds on top of the policy's mounts. Never optional:
/// a turn without its socket or its mcp.json is not worth starting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentBind {
    pub source: PathBuf,
    pub target: PathBuf,
    pub access: Access,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchPlan {
    pub policy_name: String,
    pub namespaces: Namespaces,
    /// Single-id maps: 0 inside is the invoking user outside.
    pub uid_map: IdMap,
    pub gid_map: IdMap,
    pub hostname: String,
    pub mounts: Vec<MountStep>,
    pub landlock: LandlockPlan,
    pub seccomp: Option<SeccompPlan>,
    pub rlimits: Vec<RlimitSetting>,
    pub cgroup: CgroupLimits,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub argv: Vec<String>,
    /// `network = "proxy"`: the loopback port bridged to the proxy's socket.
    pub proxy: Option<ProxyPlan>,
}

/// Where the command reaches the egress proxy inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
// Deserialized only by the bwrap helper: an unknown field means a helper
// from another build, refused rather than half understood.
#[serde(deny_unknown_fields)]
pub struct ProxyPlan {
    /// 127.0.0.1:PORT inside, served by the bridge.
    pub port: u16,
    /// The proxy's Unix socket inside (an agent bind from the launcher).
    pub socket: PathBuf,
}

/// The loopback port the proxy is reached on inside the sandbox.
pub const PROXY_PORT: u16 = 3128;
/// Where the launcher binds the proxy's socket.
pub const PROXY_SOCKET_INSIDE: &str = "/run/substrat/proxy.sock";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Namespaces {
    pub user: bool,
    pub mount: bool,
    pub pid: bool,
    pub ipc: bool,
    pub uts: bool,
    pub net: bool,
    /// Whether the command may create user namespaces (else the count is 0).
    pub nested_userns: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Ro,
    Rw,
}

/// One step of building the new root, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum MountStep {
    /// A host path made visible at `target` (inside the new root).
    Bind {
        source: PathBuf,
        target: PathBuf,
        access: Access,
        optional: bool,
    },
    /// An empty private tmpfs.
    Tmpfs { target: PathBuf, mode: u32 },
    /// A minimal /dev: tmpfs with the host's harmless device nodes bound in,
    /// a private devpts instance, /dev/shm, and the usual symlinks.
    Dev { target: PathBuf },
    /// A new procfs for the new pid namespace.
    Proc { target: PathBuf },
    /// Keep `relative` read-only inside the writable bind whose host source
    /// is `source` and which appears at `target`; create it (as a directory
    /// when `dir`, else as an empty file) when absent, so it cannot be
    /// created inside. Resolved at apply time without following symlinks.
    Protect {
        source: PathBuf,
        target: PathBuf,
        relative: String,
        dir: bool,
    },
    /// The new root itself becomes read-only once everything is mounted.
    RootReadOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockAccess {
    /// Read files and directories, execute.
    ReadExec,
    /// Everything a writable tree needs, execute included.
    ReadWriteExec,
    /// Device files: read, write, ioctl.
    Device,
    /// procfs: read, and write to the few writable files of self.
    Proc,
    /// Listing directories only (the new root's mount points).
    ListDirs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
// Deserialized only by the bwrap helper: an unknown field means a helper
// from another build, refused rather than half understood.
#[serde(deny_unknown_fields)]
pub struct LandlockRule {
    pub path: PathBuf,
    pub access: LandlockAccess,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
// Deserialized only by the bwrap helper: an unknown field means a helper
// from another build, refused rather than half understood.
#[serde(deny_unknown_fields)]
pub struct LandlockPlan {
    pub mode: LandlockMode,
    /// Paths inside the new root, applied after all mounting.
    pub rules: Vec<LandlockRule>,
    /// No TCP bind or connect (ABI 4), except connecting to `tcp_connect`
    /// ports (the proxy's bridge).
    pub deny_tcp: bool,
    #[serde(default)]
    pub tcp_connect: Vec<u16>,
    /// Scope abstract Unix sockets and signals to the sandbox (ABI 6).
    pub scope: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompPlan {
    pub name: String,
    pub path: PathBuf,
    pub profile: SeccompProfile,
    /// `socket()` families allowed: decided by the policy, not the profile
    /// (AF_UNIX always, AF_INET and AF_INET6 with network `host`).
    pub socket_families: Vec<SocketFamily>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketFamily {
    Unix,
    Inet,
    Inet6,
}

impl SocketFamily {
    pub fn number(self) -> u64 {
        match self {
            Self::Unix => 1,
            Self::Inet => 2,
            Self::Inet6 => 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RlimitKind {
    Nofile,
    Nproc,
    Core,
    Fsize,
    AddressSpace,
    CpuSeconds,
    /// Only as the stand-in for a memory cgroup a best-effort policy could not get.
    Data,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
// Deserialized only by the bwrap helper: an unknown field means a helper
// from another build, refused rather than half understood.
#[serde(deny_unknown_fields)]
pub struct RlimitSetting {
    pub kind: RlimitKind,
    pub value: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CgroupLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    pub cpu_max: Option<f64>,
    pub enforcement: LimitEnforcement,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("policy path `{template}`: {source}")]
    Path { template: String, source: PathError },
    #[error("the command is empty")]
    EmptyCommand,
    #[error("workspace `{0}` must be an absolute path without `..`")]
    Workspace(PathBuf),
    #[error(
        "network = \"proxy\" needs the proxy's socket bound at {PROXY_SOCKET_INSIDE} (the launcher starts the proxy)"
    )]
    ProxySocketMissing,
}

/// Harmless device nodes bound from the host into the sandbox's /dev.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

pub fn build_plan(policy: &LoadedPolicy, ctx: &AgentContext) -> Result<LaunchPlan, PlanError> {
    if ctx.argv.is_empty() {
        return Err(PlanError::EmptyCommand);
    }
    let clean = ctx.workspace.is_absolute()
        && ctx.workspace.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
    if !clean {
        return Err(PlanError::Workspace(ctx.workspace.clone()));
    }
    let p = &policy.policy;
    let expand_ctx = ExpandContext {
        home: ctx.home.clone(),
        workspace: ctx.workspace.clone(),
        agent_id: ctx.agent_id.clone(),
    };
    let expand = |t: &substrat_policy::paths::PathTemplate| {
        t.expand(&expand_ctx).map_err(|source| PlanError::Path {
            template: t.to_string(),
            source,
        })
    };

    // Policy binds and tmpfs mounts, parents before children: a mount on a
    // child placed before its parent's would be hidden by it. Stable within
    // one depth, so the policy's order decides ties.
    let mut fs_mounts: Vec<MountStep> = Vec::new();
    for bind in &p.filesystem.binds {
        fs_mounts.push(MountStep::Bind {
            source: expand(&bind.source)?,
            target: expand(bind.target())?,
            access: if bind.writable() {
                Access::Rw
            } else {
                Access::Ro
            },
            optional: bind.optional,
        });
    }
    for tmpfs in &p.filesystem.tmpfs {
        fs_mounts.push(MountStep::Tmpfs {
            target: expand(tmpfs)?,
            mode: 0o1777,
        });
    }
    fs_mounts.sort_by_key(|step| target_of(step).map(|t| t.components().count()).unwrap_or(0));

    let mut mounts = fs_mounts.clone();
    // Kernel interfaces after the policy's mounts, so a policy cannot hide them.
    mounts.push(MountStep::Dev {
        target: "/dev".into(),
    });
    mounts.push(MountStep::Proc {
        target: "/proc".into(),
    });
    // Protected paths last among the mounts: they sit on top of writable binds.
    for step in &fs_mounts {
        if let MountStep::Bind {
            source,
            target,
            access: Access::Rw,
            ..
        } = step
        {
            for entry in p.filesystem.protected_paths() {
                let dir = entry.ends_with('/');
                // An agent bind over the path replaces whatever is there
                // (the agent's own git dir at the workspace's `.git`): no
                // protection, and nothing created on the host for it.
                let path = target.join(entry.trim_end_matches('/'));
                if ctx.agent_binds.iter().any(|b| path.starts_with(&b.target)) {
                    continue;
                }
                mounts.push(MountStep::Protect {
                    source: source.clone(),
                    target: target.clone(),
                    relative: entry.trim_end_matches('/').to_string(),
                    dir,
                });
            }
        }
    }
    // Agent binds after the protected paths: mcp.json lands inside the
    // read-only `.cursor/` of the workspace, and nothing the policy mounts
    // may cover the socket or the chats.
    let agent_mounts: Vec<MountStep> = ctx
        .agent_binds
        .iter()
        .map(|b| MountStep::Bind {
            source: b.source.clone(),
            target: b.target.clone(),
            access: b.access,
            optional: false,
        })
        .collect();
    mounts.extend(agent_mounts.iter().cloned());
    mounts.push(MountStep::RootReadOnly);
    let mut landlock_mounts = fs_mounts.clone();
    landlock_mounts.extend(agent_mounts);

    let net = p.network != NetworkMode::Host;
    let proxy = (p.network == NetworkMode::Proxy).then(|| ProxyPlan {
        port: PROXY_PORT,
        socket: PROXY_SOCKET_INSIDE.into(),
    });
    if proxy.is_some()
        && !ctx
            .agent_binds
            .iter()
            .any(|b| b.target == Path::new(PROXY_SOCKET_INSIDE))
    {
        return Err(PlanError::ProxySocketMissing);
    }
    let cwd = fs_mounts
        .iter()
        .filter_map(target_of)
        .find(|t| *t == ctx.workspace)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));

    Ok(LaunchPlan {
        policy_name: policy.name.clone(),
        namespaces: Namespaces {
            user: true,
            mount: true,
            pid: p.namespaces.pid,
            ipc: p.namespaces.ipc,
            uts: p.namespaces.uts,
            net,
            nested_userns: p.namespaces.nested_userns,
        },
        uid_map: IdMap {
            inside: 0,
            outside: ctx.uid,
        },
        gid_map: IdMap {
            inside: 0,
            outside: ctx.gid,
        },
        hostname: "substrat".to_string(),
        landlock: landlock_plan(p.landlock, &landlock_mounts, net, proxy.as_ref()),
        seccomp: seccomp_plan(policy, net && proxy.is_none()),
        rlimits: rlimits(policy),
        cgroup: CgroupLimits {
            pids_max: p.cgroup.pids_max,
            memory_max: p.cgroup.memory_max.map(|s| s.0),
            cpu_max: p.cgroup.cpu_max,
            enforcement: p.cgroup.enforcement,
        },
        env: environment(policy, ctx, &expand_ctx, proxy.as_ref()),
        cwd,
        argv: ctx.argv.clone(),
        mounts,
        proxy,
    })
}

/// Whether the command can write `path` (or below it): the deepest mount
/// holding it is a writable bind.
pub fn writable_in_view(plan: &LaunchPlan, path: &Path) -> bool {
    matches!(
        mount_holding(plan, path, Holding::ItselfOrBelow),
        Some((
            MountStep::Bind {
                access: Access::Rw,
                ..
            },
            _
        ))
    )
}

/// Which mounts `mount_holding` considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// A mount at the path itself holds it (what the command sees there).
    ItselfOrBelow,
    /// Only mounts strictly above the path (what a mount point at the
    /// path is made in).
    Below,
}

/// The mount step that holds `path` (absolute, inside) in the view, and
/// `path` relative to its target: the deepest one, and of two at the same
/// target the later, which covers the earlier. `None` when no mount does.
pub fn mount_holding<'a>(
    plan: &'a LaunchPlan,
    path: &Path,
    holding: Holding,
) -> Option<(&'a MountStep, PathBuf)> {
    let (step, target) = plan
        .mounts
        .iter()
        .filter_map(|step| {
            let target = target_of(step)?;
            let counts =
                path.starts_with(target) && (holding == Holding::ItselfOrBelow || path != target);
            counts.then_some((step, target))
        })
        .max_by_key(|(_, target)| target.components().count())?;
    Some((step, path.strip_prefix(target).ok()?.to_path_buf()))
}

fn target_of(step: &MountStep) -> Option<&Path> {
    match step {
        MountStep::Bind { target, .. } | MountStep::Tmpfs { target, .. } => Some(target),
        MountStep::Dev { target } | MountStep::Proc { target } => Some(target),
        MountStep::Protect { .. } | MountStep::RootReadOnly => None,
    }
}

/// Landlock mirrors the mount view: what is mounted read-only may be read
/// and executed, what is writable may be written; nothing else exists.
fn landlock_plan(
    mode: LandlockMode,
    fs_mounts: &[MountStep],
    net: bool,
    proxy: Option<&ProxyPlan>,
) -> LandlockPlan {
    let mut rules = Vec::new();
    for step in fs_mounts {
        match step {
            MountStep::Bind { target, access, .. } => rules.push(LandlockRule {
                path: target.clone(),
                access: match access {
                    Access::Ro => LandlockAccess::ReadExec,
                    Access::Rw => LandlockAccess::ReadWriteExec,
                },
            }),
            MountStep::Tmpfs { target, .. } => rules.push(LandlockRule {
                path: target.clone(),
                access: LandlockAccess::ReadWriteExec,
            }),
            _ => {}
        }
    }
    rules.push(LandlockRule {
        path: "/".into(),
        access: LandlockAccess::ListDirs,
    });
    rules.push(LandlockRule {
        path: "/dev".into(),
        access: LandlockAccess::Device,
    });
    rules.push(LandlockRule {
        path: "/proc".into(),
        access: LandlockAccess::Proc,
    });
    LandlockPlan {
        mode,
        rules,
        deny_tcp: net,
        tcp_connect: proxy.map(|p| vec![p.port]).unwrap_or_default(),
        scope: true,
    }
}

/// `no_inet`: only AF_UNIX sockets (network `none`). With `proxy` the
/// command needs TCP sockets to reach the bridge on loopback; the network
/// namespace has nothing else, and Landlock allows only the bridge's port.
fn seccomp_plan(policy: &LoadedPolicy, no_inet: bool) -> Option<SeccompPlan> {
    match &policy.seccomp {
        SeccompChoice::Unconfined => None,
        SeccompChoice::Profile {
            name,
            path,
            profile,
        } => {
            let mut families = vec![SocketFamily::Unix];
            if !no_inet {
                families.extend([SocketFamily::Inet, SocketFamily::Inet6]);
            }
            Some(SeccompPlan {
                name: name.clone(),
                path: path.clone(),
                profile: profile.clone(),
                socket_families: families,
            })
        }
    }
}

fn rlimits(policy: &LoadedPolicy) -> Vec<RlimitSetting> {
    let r = &policy.policy.rlimits;
    let entries = [
        (RlimitKind::Nofile, r.nofile),
        (RlimitKind::Nproc, r.nproc),
        (RlimitKind::Core, r.core.map(|s| s.0)),
        (RlimitKind::Fsize, r.fsize.map(|s| s.0)),
        (RlimitKind::AddressSpace, r.address_space.map(|s| s.0)),
        (RlimitKind::CpuSeconds, r.cpu_seconds),
    ];
    entries
        .into_iter()
        .filter_map(|(kind, value)| value.map(|value| RlimitSetting { kind, value }))
        .collect()
}

/// An empty environment plus the allowed host variables, then the policy's
/// fixed values (which win). Sorted, so plans compare stably.
fn environment(
    policy: &LoadedPolicy,
    ctx: &AgentContext,
    expand: &ExpandContext,
    proxy: Option<&ProxyPlan>,
) -> Vec<(String, String)> {
    let env = &policy.policy.env;
    let allowed = |name: &str| {
        ctx.pass_env.iter().any(|n| n == name)
            || env
                .allow
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name == pattern,
                })
    };
    let mut out: std::collections::BTreeMap<String, String> = ctx
        .host_env
        .iter()
        .filter(|(name, _)| allowed(name))
        .cloned()
        .collect();
    for (name, value) in &env.set {
        out.insert(name.clone(), expand_value(value, expand));
    }
    // The proxy's variables last: the only way out is through it.
    if let Some(proxy) = proxy {
        let url = format!("http://127.0.0.1:{}", proxy.port);
        for name in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "ALL_PROXY",
            "https_proxy",
            "http_proxy",
            "all_proxy",
        ] {
            out.insert(name.to_string(), url.clone());
        }
        for name in ["NO_PROXY", "no_proxy"] {
            out.insert(name.to_string(), "localhost,127.0.0.1,::1".to_string());
        }
    }
    out.into_iter().collect()
}

/// `${HOME}`, `${WORKSPACE}` and `${AGENT_ID}` in an environment value.
fn expand_value(value: &str, ctx: &ExpandContext) -> String {
    value
        .replace("${HOME}", &ctx.home.to_string_lossy())
        .replace("${WORKSPACE}", &ctx.workspace.to_string_lossy())
        .replace("${AGENT_ID}", &ctx.agent_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_policy::{LoadOptions, load_builtin, load_str};

    fn context() -> AgentContext {
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
        }
    }

    fn bind(source: &str, access: Access, optional: bool) -> MountStep {
        MountStep::Bind {
            source: source.into(),
            target: source.into(),
            access,
            optional,
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
                deny_tcp: true,
                tcp_connect: vec![],
                scope: true,
            },
            seccomp: Some(SeccompPlan {
                name: "default".into(),
                path: path.clone(),
                profile: profile.clone(),
                socket_families: vec![SocketFamily::Unix],
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
            Some(ProxyPlan {
                port: 3128,
                socket: "/run/substrat/proxy.sock".into()
            })
        );
        assert!(plan.namespaces.net, "its own network namespace");
        assert!(plan.landlock.deny_tcp && plan.landlock.tcp_connect == [3128]);
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
    fn host_network_allows_inet_sockets_and_tcp() {
        let text = "version = 1\nextends = \"worker\"\nnetwork = \"host\"\n";
        let policy = load_str(
            std::path::Path::new("p.toml"),
            text,
            &LoadOptions::default(),
        )
        .unwrap();
        let plan = build_plan(&policy, &context()).unwrap();
        assert!(!plan.namespaces.net && !plan.landlock.deny_tcp);
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
}

#[cfg(test)]
mod agent_bind_tests {
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
