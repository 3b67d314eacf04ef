//! The launch plan: a pure function from a policy and one agent's context to
//! everything the sandbox will be (namespaces, mounts in order, Landlock
//! rules, seccomp, limits, environment, command). Backends apply a plan;
//! tests compare whole plans.

use std::path::{Path, PathBuf};

use serde::Serialize;
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
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockRule {
    pub path: PathBuf,
    pub access: LandlockAccess,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockPlan {
    pub mode: LandlockMode,
    /// Paths inside the new root, applied after all mounting.
    pub rules: Vec<LandlockRule>,
    /// No TCP bind or connect at all (network `none`; ABI 4).
    pub deny_tcp: bool,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RlimitSetting {
    pub kind: RlimitKind,
    pub value: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CgroupLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    pub cpu_max: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("policy path `{template}`: {source}")]
    Path { template: String, source: PathError },
    #[error("the command is empty")]
    EmptyCommand,
    #[error("workspace `{0}` must be an absolute path without `..`")]
    Workspace(PathBuf),
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
                mounts.push(MountStep::Protect {
                    source: source.clone(),
                    target: target.clone(),
                    relative: entry.trim_end_matches('/').to_string(),
                    dir,
                });
            }
        }
    }
    mounts.push(MountStep::RootReadOnly);

    let net = p.network != NetworkMode::Host;
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
        landlock: landlock_plan(p.landlock, &fs_mounts, net),
        seccomp: seccomp_plan(policy, net),
        rlimits: rlimits(policy),
        cgroup: CgroupLimits {
            pids_max: p.cgroup.pids_max,
            memory_max: p.cgroup.memory_max.map(|s| s.0),
            cpu_max: p.cgroup.cpu_max,
        },
        env: environment(policy, ctx, &expand_ctx),
        cwd,
        argv: ctx.argv.clone(),
        mounts,
    })
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
fn landlock_plan(mode: LandlockMode, fs_mounts: &[MountStep], net: bool) -> LandlockPlan {
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
        scope: true,
    }
}

fn seccomp_plan(policy: &LoadedPolicy, net: bool) -> Option<SeccompPlan> {
    match &policy.seccomp {
        SeccompChoice::Unconfined => None,
        SeccompChoice::Profile {
            name,
            path,
            profile,
        } => {
            let mut families = vec![SocketFamily::Unix];
            if !net {
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
) -> Vec<(String, String)> {
    let env = &policy.policy.env;
    let allowed = |name: &str| {
        env.allow
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
    out.into_iter().collect()
}

/// `${HOME}`, `${WORKSPACE}` and `${AGENT_ID}` in an environment value.
fn expand_value(value: &str, ctx: &ExpandContext) -> String {
    value
        .replace("${HOME}", &ctx.home.to_string_lossy())
        .replace("${WORKSPACE}", &ctx.workspace.to_string_lossy())
        .replace("${AGENT_ID}", &ctx.agent_id)
}
