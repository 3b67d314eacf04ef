//! The launch plan: a pure function from a policy and one agent's context to
//! everything the sandbox will be (namespaces, mounts in order, Landlock
//! rules, seccomp, limits, environment, command). Backends apply a plan;
//! tests compare whole plans.
//!
//! `build_plan` puts together: `fs` (the mount steps, in the order they
//! must be made, and what holds a path in the view), `access` (Landlock
//! rules mirroring the mounts, and connect to Unix sockets on ABI 9),
//! `limits` (seccomp, rlimits), `env` (the command's environment);
//! `socket_use` says what a socket as a bind's source means.

mod access;
mod bridges;
#[cfg(test)]
mod connect_tests;
mod env;
mod fs;
mod limits;
mod socket_use;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use serde::Serialize;
use substrat_policy::LoadedPolicy;
use substrat_policy::model::{LandlockMode, LimitEnforcement, NetworkMode};
use substrat_policy::paths::{ExpandContext, PathError};
use substrat_policy::seccomp::SeccompProfile;

pub use access::{LANDLOCK_UNIX_CONNECT_ABI, landlock_plan, with_unix_connect};
pub use bridges::{
    BridgePlan, GATEWAY_PORT, GATEWAY_SOCKET_INSIDE, MCP_PATH, MCP_PORT, PROXY_PORT,
    PROXY_SOCKET_INSIDE, mcp_url,
};
pub use fs::{Holding, mount_holding, writable_in_view};
pub use socket_use::{BROKER_SOCKET_INSIDE, LAUNCHER_SOCKETS, SocketUse};

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
    /// What the command finds at `home`.
    pub home_mount: HomeMount,
    /// The command's stdin is a pseudo-terminal it should control (`run -t`).
    pub terminal: bool,
    /// The workspace seen through a layer of the agent's own: every write
    /// lands there, the host tree stays as it was (`workspace_mode = overlay`).
    pub workspace_layer: Option<LayerDirs>,
    /// This kernel's Landlock ABI (0: none): a right newer than the ones
    /// every kernel since ABI 6 has (connect to a Unix socket, 9) is
    /// planned only where the kernel has it.
    pub landlock_abi: u32,
}

/// The directories of a workspace layer for one launch (host paths, all on
/// one filesystem, made by the launcher, never visible inside).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerDirs {
    /// The directory holding every turn of the layer (staged as one tree
    /// for a sandbox that runs as a subordinate id).
    pub root: PathBuf,
    /// Earlier turns' upper directories under `root`, newest first: read-only
    /// layers between this launch's upper and the workspace.
    pub frozen: Vec<PathBuf>,
    /// This launch's upper directory under `root`: what the command writes.
    pub upper: PathBuf,
    /// overlayfs's work directory under `root`, empty, beside `upper`.
    pub work: PathBuf,
    /// What this launch may write, in bytes (the layer's quota less what
    /// earlier turns hold): the upper is then a tmpfs of that size in the
    /// sandbox's mount namespace (writes beyond fail with ENOSPC), copied
    /// into `upper` when the command has ended.
    pub quota: Option<u64>,
}

/// The workspace mounted as an overlay instead of its read-write bind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverlayPlan {
    /// The workspace's bind step this overlay replaces (its target is the
    /// workspace inside; its source the lowest, read-only layer).
    pub target: PathBuf,
    pub dirs: LayerDirs,
}

/// What is mounted at the agent's `HOME`, below whatever the policy binds
/// inside it (`${HOME}/.gitconfig` read-only...). Tools expect a writable
/// home; the real one, with its keys and startup files, is never it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HomeMount {
    /// Nothing: only what the policy binds there.
    #[default]
    None,
    /// An empty private tmpfs (one-off runs).
    Tmpfs,
    /// This host directory, read-write: an agent's own home (the daemon's
    /// `STATE/agents/ID/home`, or `run --home DIR`).
    Bind(PathBuf),
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
    pub proxy: Option<BridgePlan>,
    /// The model gateway's socket is bound in: the loopback port bridged
    /// to it (the agent CLI's model endpoint).
    pub gateway: Option<BridgePlan>,
    /// The agent's broker socket is bound in and the sandbox has a
    /// loopback of its own: the loopback port bridged to it (the agent
    /// CLI's MCP streamable HTTP endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<BridgePlan>,
    /// The command makes its stdin, a pseudo-terminal, its controlling
    /// terminal (job control inside; `run -t`).
    pub terminal: bool,
    /// The workspace's read-write bind made an overlay (its writes kept in
    /// a layer on the host).
    pub overlay: Option<OverlayPlan>,
    /// Namespaces of the host to join instead of making new ones
    /// (`substrat-oci`: an engine's or a pod's network, ipc or uts
    /// namespace). Joined by the holder while it is still root, before its
    /// user namespace exists: the sandbox holds no capability over them.
    /// The matching `namespaces` flag is off (no new one is made).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub joined: Vec<JoinedNamespace>,
    /// The OOM killer's adjustment for the sandbox's processes, 0 to 1000
    /// (a sandbox is never favoured: init may only raise it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<u16>,
    /// Policies applied on top of this plan (`substrat-oci`'s
    /// `io.substrat.policy`): each one's Landlock ruleset and seccomp
    /// filter are loaded after the plan's own. The kernel enforces every
    /// ruleset and every filter, so an access passes only when each of
    /// them allows it. Only the native backend applies them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PolicyLayer>,
    /// The most pseudo-terminals the sandbox's devpts holds (its `max=`):
    /// every new devpts instance draws on the host's one pool
    /// (`kernel.pty.max` less `kernel.pty.reserve`), which one sandbox
    /// must not empty for the others. Only the native backend sets it.
    pub max_ptys: u32,
}

/// A policy's own Landlock ruleset and seccomp filter (`LaunchPlan::layers`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyLayer {
    pub policy_name: String,
    pub landlock: LandlockPlan,
    pub seccomp: Option<SeccompPlan>,
}

/// A namespace joined by path (`LaunchPlan::joined`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JoinedNamespace {
    pub kind: JoinedKind,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JoinedKind {
    Net,
    Ipc,
    Uts,
}

impl LaunchPlan {
    /// Every loopback port bridged to a socket outside.
    pub fn bridges(&self) -> impl Iterator<Item = &BridgePlan> {
        self.proxy
            .iter()
            .chain(self.gateway.iter())
            .chain(self.mcp.iter())
    }

    /// The plan's seccomp filter, then each layer's, in loading order.
    pub fn seccomp_filters(&self) -> impl Iterator<Item = &SeccompPlan> {
        self.seccomp
            .iter()
            .chain(self.layers.iter().filter_map(|l| l.seccomp.as_ref()))
    }

    /// Whether the filters load with SECCOMP_FILTER_FLAG_SPEC_ALLOW: only
    /// when every one of them asks it (keeping the mitigation is stricter).
    pub fn seccomp_spec_allow(&self) -> bool {
        let mut filters = self.seccomp_filters().peekable();
        filters.peek().is_some() && filters.all(|s| s.spec_allow)
    }
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
    /// A cgroup namespace of its own, rooted at the sandbox's group (init
    /// makes it, once inside): the host's cgroup paths are not shown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cgroup: bool,
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
        /// What a Unix socket as the source means.
        #[serde(skip_serializing_if = "SocketUse::is_unjudged")]
        socket: SocketUse,
    },
    /// An empty private tmpfs, of at most `size` bytes when given.
    Tmpfs {
        target: PathBuf,
        mode: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    },
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
    /// A new sysfs, read-only (of the sandbox's own network namespace).
    /// Only under a root filesystem (`substrat-oci`).
    Sysfs { target: PathBuf },
    /// A new mqueue filesystem (of the sandbox's own ipc namespace). Only
    /// under a root filesystem (`substrat-oci`).
    Mqueue { target: PathBuf },
    /// What is at `target`, if anything, hidden: a directory under an empty
    /// read-only tmpfs, a file under /dev/null. Only under a root
    /// filesystem (`substrat-oci`'s masked paths).
    Mask { target: PathBuf },
    /// What is at `target`, if anything, made read-only (its whole
    /// subtree). Only under a root filesystem (`substrat-oci`).
    ReadOnly { target: PathBuf },
    /// An empty read-only directory at `target` (made when missing): a
    /// filesystem the sandbox cannot have (a cgroup one; a sysfs in an
    /// engine's network namespace). Only under a root filesystem.
    Empty { target: PathBuf },
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
    /// connect(2) to the Unix socket at the path, or beneath it (ABI 9).
    Connect,
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
    /// Scope abstract Unix sockets and signals to the sandbox (ABI 6).
    pub scope: bool,
    /// connect(2) to a pathname Unix socket is handled (ABI 9): allowed
    /// only where a `Connect` rule says. Without it (an older kernel) the
    /// ruleset does not restrict it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unix_connect: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompPlan {
    pub name: String,
    pub path: PathBuf,
    pub profile: SeccompProfile,
    /// `socket()` families allowed: decided by the policy, not the profile
    /// (AF_UNIX always, AF_INET and AF_INET6 with network `host`).
    pub socket_families: Vec<SocketFamily>,
    /// Load with SECCOMP_FILTER_FLAG_SPEC_ALLOW (the policy's
    /// `speculative_store_bypass = "allow"`, the default).
    pub spec_allow: bool,
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
    #[error(
        "the model gateway's socket is bound at {GATEWAY_SOCKET_INSIDE}, but network = \"host\" gives the \
         sandbox no loopback of its own to bridge it on (it would be the host's): use \"none\" or \"proxy\""
    )]
    GatewayOnHostNetwork,
    #[error(
        "workspace mode `overlay` needs a policy that binds the workspace ({0}) read-write at its own \
         path; this policy does not, so there is nothing to keep in a layer"
    )]
    OverlayWithoutWorkspaceBind(PathBuf),
}

/// The pseudo-terminals a sandbox's devpts holds unless configured
/// (`LaunchPlan::max_ptys`): far more than a shell, tmux or an editor
/// open, a small part of the host's pool (3072 by default).
pub const DEFAULT_MAX_PTYS: u32 = 128;

/// Harmless device nodes bound from the host into the sandbox's /dev.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The plan for running `ctx.argv` under `policy`.
pub fn build_plan(policy: &LoadedPolicy, ctx: &AgentContext) -> Result<LaunchPlan, PlanError> {
    check_context(ctx)?;
    let p = &policy.policy;
    let expand_ctx = ExpandContext {
        home: ctx.home.clone(),
        workspace: ctx.workspace.clone(),
        agent_id: ctx.agent_id.clone(),
    };
    let view = fs::plan_mounts(p, ctx, &expand_ctx)?;
    let net = p.network != NetworkMode::Host;
    let proxy = bridges::proxy_plan(p.network, ctx)?;
    let gateway = bridges::gateway_plan(p.network, ctx)?;
    let mcp = bridges::mcp_plan(p.network, ctx);
    let overlay = overlay_plan(&view.mounts, ctx)?;
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
            cgroup: false,
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
        landlock: access::with_unix_connect(
            access::landlock_plan(p.landlock, &view.landlock_mounts),
            &view.landlock_mounts,
            ctx.landlock_abi,
        ),
        seccomp: limits::seccomp_plan(policy),
        rlimits: limits::rlimits(policy),
        cgroup: CgroupLimits {
            pids_max: p.cgroup.pids_max,
            memory_max: p.cgroup.memory_max.map(|s| s.0),
            cpu_max: p.cgroup.cpu_max,
            enforcement: p.cgroup.enforcement,
        },
        env: env::environment(policy, ctx, &expand_ctx, proxy.as_ref()),
        cwd: view.cwd,
        argv: ctx.argv.clone(),
        mounts: view.mounts,
        proxy,
        gateway,
        mcp,
        terminal: ctx.terminal,
        overlay,
        joined: Vec::new(),
        oom_score_adj: None,
        layers: Vec::new(),
        max_ptys: DEFAULT_MAX_PTYS,
    })
}

/// The overlay over the workspace's read-write bind, when the agent has a
/// layer; refused when the policy binds no workspace to lay it over.
fn overlay_plan(
    mounts: &[MountStep],
    ctx: &AgentContext,
) -> Result<Option<OverlayPlan>, PlanError> {
    let Some(dirs) = &ctx.workspace_layer else {
        return Ok(None);
    };
    let binds_workspace = mounts.iter().any(|step| {
        matches!(step, MountStep::Bind { source, target, access: Access::Rw, .. }
            if *source == ctx.workspace && *target == ctx.workspace)
    });
    if !binds_workspace {
        return Err(PlanError::OverlayWithoutWorkspaceBind(
            ctx.workspace.clone(),
        ));
    }
    Ok(Some(OverlayPlan {
        target: ctx.workspace.clone(),
        dirs: dirs.clone(),
    }))
}

/// A command to run, and a workspace path that means one thing.
fn check_context(ctx: &AgentContext) -> Result<(), PlanError> {
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
    Ok(())
}
