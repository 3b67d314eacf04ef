//! A substrat policy on top of a container's configuration (the
//! operator's `policy`, a container's `io.substrat.policy`): for every
//! setting the stricter of the two holds. Pure.
//!
//! - Landlock and seccomp: the policy's ruleset and filter are loaded after
//!   the container's own (`LaunchPlan::layers`); the kernel enforces both,
//!   so an access passes only when each allows it. The policy's file rules
//!   name paths inside the container (`/usr`, `${WORKSPACE}`...).
//! - Network, ipc and uts: a policy that wants its own namespace gets one
//!   even where the engine asked to join a pod's (`network = "none"`
//!   leaves only a loopback); `network = "proxy"` is refused: the proxy
//!   beside a container is not built.
//! - Protected paths: kept read-only (created when missing) in every
//!   writable bind from the host, where host tools find what an agent
//!   leaves, also where a later writable bind covers one (not in the
//!   binds the operator grants an agent: its home, as under `substrat-run`).
//! - rlimits and cgroup limits: the lower of each; a limit either requires
//!   is required.
//! - Capabilities: the container has none already.
//!
//! The environment stays the container's (a policy's `[env]` filters a
//! launching host's environment, which a container does not inherit), and
//! `[mcp]`/`[tools]` govern the broker: both are said in the notes.

use std::path::{Path, PathBuf};

use substrat_policy::LoadedPolicy;
use substrat_policy::model::{LimitEnforcement, NetworkMode};
use substrat_sandbox::plan::{
    Access, AgentBind, AgentContext, CgroupLimits, HomeMount, JoinedKind, MountStep, PolicyLayer,
    RlimitSetting, build_plan,
};

use crate::runtime_config::{POLICY_ANNOTATION, WORKSPACE_ANNOTATION};
use crate::spec::Spec;
use crate::translate::{Translated, Unsupported, absolute, refuse};

/// Where a policy's `${WORKSPACE}` and `${HOME}` point inside a container,
/// and the paths the operator's engine binds for an agent, which the
/// policy's Landlock rules allow too (`runtime_config::GrantedBind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPaths {
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub granted: Vec<AgentBind>,
}

impl PolicyPaths {
    /// The workspace: `io.substrat.workspace`, else the process's working
    /// directory; home: the process's `HOME`, else `/`.
    pub fn of(spec: &Spec) -> Result<Self, Unsupported> {
        let process = spec
            .process
            .as_ref()
            .ok_or_else(|| refuse("process", "a container needs a process to run"))?;
        let (field, workspace) = match spec.annotations.get(WORKSPACE_ANNOTATION) {
            Some(path) => {
                let field = format!("annotations.{WORKSPACE_ANNOTATION}");
                let workspace = absolute(&field, path)?;
                (field, workspace)
            }
            None => (
                "process.cwd".to_string(),
                absolute("process.cwd", &process.cwd)?,
            ),
        };
        // The policy makes its workspace writable: `/` or a system
        // directory would open the whole image to it.
        if let Some(risk) = substrat_policy::workspace_risk::system_place(&workspace) {
            return Err(refuse(
                field,
                format!(
                    "the policy's workspace cannot be {}: {risk}; give the container a working \
                     directory of its project, or name it with {WORKSPACE_ANNOTATION}",
                    workspace.display()
                ),
            ));
        }
        let home = process
            .env
            .iter()
            .find_map(|entry| entry.strip_prefix("HOME="))
            .map(|home| absolute("process.env HOME", home))
            .transpose()?
            .unwrap_or_else(|| PathBuf::from("/"));
        Ok(Self {
            workspace,
            home,
            granted: Vec::new(),
        })
    }
}

/// `translated` made at least as strict as `policy` (see the module's
/// doc); what changed is added to its notes.
pub fn apply_policy(
    translated: &mut Translated,
    policy: &LoadedPolicy,
    paths: &PolicyPaths,
) -> Result<(), Unsupported> {
    let field = format!("policy {}", policy.name);
    let p = &policy.policy;
    if p.network == NetworkMode::Proxy {
        return Err(refuse(
            format!("{field}: network"),
            "\"proxy\" is not supported under a container (no proxy is started beside it); \
             use a policy with network \"none\"",
        ));
    }
    let own = policy_plan(translated, policy, paths).map_err(|e| refuse(&field, e))?;
    let plan = &mut translated.plan;
    let notes = &mut translated.notes;
    if p.network == NetworkMode::None {
        own_namespace(plan, JoinedKind::Net, &policy.name, notes);
    }
    if p.namespaces.ipc {
        own_namespace(plan, JoinedKind::Ipc, &policy.name, notes);
    }
    if p.namespaces.uts {
        own_namespace(plan, JoinedKind::Uts, &policy.name, notes);
    }
    let before = plan.mounts.len();
    plan.mounts = with_protected_paths(
        std::mem::take(&mut plan.mounts),
        &p.filesystem.protected_paths(),
        &paths.granted,
    )?;
    let protected = plan.mounts.len() - before;
    if protected > 0 {
        notes.push(format!(
            "policy {}: {protected} protected path(s) kept read-only in the container's writable binds",
            policy.name,
        ));
    }
    lower_rlimits(&mut plan.rlimits, &own.rlimits);
    plan.cgroup = stricter_cgroup(plan.cgroup, own.cgroup);
    plan.layers.push(PolicyLayer {
        policy_name: policy.name.clone(),
        landlock: own.landlock,
        seccomp: own.seccomp,
    });
    plan.policy_name = format!("{}+{}", plan.policy_name, policy.name);
    notes.push(format!(
        "policy {}: its Landlock rules and seccomp filter stacked on the container's; \
         its [env], [mcp] and [tools] do not apply to a container",
        policy.name
    ));
    Ok(())
}

/// The plan the policy alone would give the container's command, for its
/// Landlock rules, seccomp filter and limits (its mounts are not used: the
/// container's view is the engine's).
fn policy_plan(
    translated: &Translated,
    policy: &LoadedPolicy,
    paths: &PolicyPaths,
) -> Result<substrat_sandbox::plan::LaunchPlan, String> {
    let ctx = AgentContext {
        workspace: paths.workspace.clone(),
        home: paths.home.clone(),
        agent_id: "container".into(),
        host_env: Vec::new(),
        uid: translated.plan.uid_map.outside,
        gid: translated.plan.gid_map.outside,
        argv: translated.plan.argv.clone(),
        agent_binds: paths.granted.clone(),
        pass_env: Vec::new(),
        home_mount: HomeMount::None,
        terminal: false,
        workspace_layer: None,
        // The container's volumes are the engine's: the sockets in them
        // are noted (log, state), and the layer does not handle connect.
        landlock_abi: 0,
    };
    build_plan(policy, &ctx).map_err(|e| e.to_string())
}

/// The sandbox makes its own `kind` namespace instead of joining the
/// engine's; said when it changes anything.
fn own_namespace(
    plan: &mut substrat_sandbox::plan::LaunchPlan,
    kind: JoinedKind,
    policy: &str,
    notes: &mut Vec<String>,
) {
    let before = plan.joined.len();
    plan.joined.retain(|j| j.kind != kind);
    match kind {
        JoinedKind::Net => plan.namespaces.net = true,
        JoinedKind::Ipc => plan.namespaces.ipc = true,
        JoinedKind::Uts => plan.namespaces.uts = true,
    }
    if plan.joined.len() != before {
        let name = match kind {
            JoinedKind::Net => "network",
            JoinedKind::Ipc => "ipc",
            JoinedKind::Uts => "uts",
        };
        notes.push(format!(
            "policy {policy}: a {name} namespace of the container's own, not the engine's"
        ));
    }
}

/// The policy's protected paths in every writable bind from the host, each
/// right after its bind (a later mount below it, a file the engine binds
/// into the volume, lands on top as it would without them), and those of
/// an enclosing writable bind that fall inside a later one (a volume at
/// `/work/.git` below one at `/work` keeps `hooks` protected). Not in the
/// root filesystem (the engine's storage, not a tree host tools use), nor
/// in the writable binds the operator grants an agent (its home, its
/// chats: its own, as under `substrat-run`). A writable bind at a
/// protected path itself is refused.
fn with_protected_paths(
    mounts: Vec<MountStep>,
    protected: &[String],
    granted: &[AgentBind],
) -> Result<Vec<MountStep>, Unsupported> {
    let is_granted = |target: &Path| {
        granted
            .iter()
            .any(|g| g.access == Access::Rw && g.target == target)
    };
    let mut out = Vec::with_capacity(mounts.len());
    // The writable binds seen so far: (source, target).
    let mut writable: Vec<(PathBuf, PathBuf)> = Vec::new();
    for step in mounts {
        let bind = match &step {
            MountStep::Bind {
                source,
                target,
                access: Access::Rw,
                ..
            } if target != Path::new("/") && !is_granted(target) => {
                Some((source.clone(), target.clone()))
            }
            _ => None,
        };
        out.push(step);
        let Some((source, target)) = bind else {
            continue;
        };
        let mut entries: Vec<(String, bool)> = protected
            .iter()
            .map(|e| (e.trim_end_matches('/').to_string(), e.ends_with('/')))
            .collect();
        for (_, outer) in &writable {
            for entry in protected {
                let path = outer.join(entry.trim_end_matches('/'));
                if path == target {
                    return Err(refuse(
                        format!("mounts ({})", target.display()),
                        format!(
                            "a writable bind at {}, a protected path of the writable bind at {}",
                            target.display(),
                            outer.display()
                        ),
                    ));
                }
                if let Ok(inner) = path.strip_prefix(&target) {
                    entries.push((inner.display().to_string(), entry.ends_with('/')));
                }
            }
        }
        // A granted bind over the path replaces whatever is there (the
        // agent's own git dir at the workspace's `.git`): no protection,
        // as under substrat-run.
        // Only a bind inside this one counts (the agent's home around a
        // workspace below it does not).
        entries.retain(|(relative, _)| {
            let path = target.join(relative);
            !granted
                .iter()
                .any(|g| g.target.starts_with(&target) && path.starts_with(&g.target))
        });
        for (relative, dir) in entries {
            out.push(MountStep::Protect {
                source: source.clone(),
                target: target.clone(),
                relative,
                dir,
            });
        }
        writable.push((source, target));
    }
    Ok(out)
}

/// Each of `policy`'s rlimits lowers the container's of the same kind, or
/// is added.
fn lower_rlimits(container: &mut Vec<RlimitSetting>, policy: &[RlimitSetting]) {
    for limit in policy {
        match container.iter_mut().find(|c| c.kind == limit.kind) {
            Some(own) => own.value = own.value.min(limit.value),
            None => container.push(*limit),
        }
    }
}

/// The lower of each cgroup limit; required when either requires.
fn stricter_cgroup(a: CgroupLimits, b: CgroupLimits) -> CgroupLimits {
    fn lower<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b < a { b } else { a }),
            (a, b) => a.or(b),
        }
    }
    let required = [a.enforcement, b.enforcement].contains(&LimitEnforcement::Required);
    CgroupLimits {
        pids_max: lower(a.pids_max, b.pids_max),
        memory_max: lower(a.memory_max, b.memory_max),
        cpu_max: lower(a.cpu_max, b.cpu_max),
        enforcement: if required {
            LimitEnforcement::Required
        } else {
            LimitEnforcement::BestEffort
        },
    }
}

/// The policies a container gets: the operator's, then its annotation's
/// (both apply; one named twice once).
pub fn policy_names(operator: Option<&str>, spec: &Spec) -> Vec<String> {
    let mut names: Vec<String> = operator.map(str::to_string).into_iter().collect();
    if let Some(asked) = spec.annotations.get(POLICY_ANNOTATION)
        && !names.contains(asked)
    {
        names.push(asked.clone());
    }
    names
}
