//! The mount steps of a plan, in the order they must be made, and which
//! mount holds a path in the view.

use std::path::{Path, PathBuf};

use substrat_policy::Policy;
use substrat_policy::paths::{ExpandContext, PathTemplate};

use super::{
    Access, AgentContext, HomeMount, LAUNCHER_SOCKETS, LaunchPlan, MountStep, PlanError, SocketUse,
};

/// The view: every mount step, those Landlock mirrors (the policy's and
/// the agent's binds and tmpfs), and where the command starts.
pub(super) struct View {
    pub(super) mounts: Vec<MountStep>,
    pub(super) landlock_mounts: Vec<MountStep>,
    pub(super) cwd: PathBuf,
}

pub(super) fn plan_mounts(
    p: &Policy,
    ctx: &AgentContext,
    expand_ctx: &ExpandContext,
) -> Result<View, PlanError> {
    let fs_mounts = policy_mounts(p, ctx, expand_ctx)?;
    let mut mounts = fs_mounts.clone();
    // Kernel interfaces after the policy's mounts, so a policy cannot hide them.
    mounts.push(MountStep::Dev {
        target: "/dev".into(),
    });
    mounts.push(MountStep::Proc {
        target: "/proc".into(),
    });
    // Protected paths last among the mounts: they sit on top of writable binds.
    mounts.extend(protected_paths(p, ctx, &fs_mounts));
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
            socket: if LAUNCHER_SOCKETS.iter().any(|s| b.target == Path::new(s)) {
                SocketUse::Connect
            } else {
                SocketUse::Unjudged
            },
        })
        .collect();
    mounts.extend(agent_mounts.iter().cloned());
    mounts.push(MountStep::RootReadOnly);
    let cwd = fs_mounts
        .iter()
        .filter_map(target_of)
        .find(|t| *t == ctx.workspace)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let mut landlock_mounts = fs_mounts;
    landlock_mounts.extend(agent_mounts);
    Ok(View {
        mounts,
        landlock_mounts,
        cwd,
    })
}

/// Policy binds and tmpfs mounts, and the agent's home unless the policy
/// mounts something there itself; parents before children: a mount on a
/// child placed before its parent's would be hidden by it (the workspace
/// in `~/proj` stays visible over the home). Stable within one depth, so
/// the policy's order decides ties.
fn policy_mounts(
    p: &Policy,
    ctx: &AgentContext,
    expand_ctx: &ExpandContext,
) -> Result<Vec<MountStep>, PlanError> {
    let expand = |t: &PathTemplate| {
        t.expand(expand_ctx).map_err(|source| PlanError::Path {
            template: t.to_string(),
            source,
        })
    };
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
            socket: if bind.socket {
                SocketUse::Connect
            } else {
                SocketUse::Refuse
            },
        });
    }
    for tmpfs in &p.filesystem.tmpfs {
        fs_mounts.push(MountStep::Tmpfs {
            target: expand(tmpfs)?,
            mode: 0o1777,
            size: None,
        });
    }
    let home_taken = fs_mounts.iter().any(|m| target_of(m) == Some(&ctx.home));
    if !home_taken && ctx.home != Path::new("/") {
        match &ctx.home_mount {
            HomeMount::None => {}
            HomeMount::Tmpfs => fs_mounts.push(MountStep::Tmpfs {
                target: ctx.home.clone(),
                mode: 0o700,
                size: None,
            }),
            HomeMount::Bind(source) => fs_mounts.push(MountStep::Bind {
                source: source.clone(),
                target: ctx.home.clone(),
                access: Access::Rw,
                optional: false,
                socket: SocketUse::Unjudged,
            }),
        }
    }
    fs_mounts.sort_by_key(|step| target_of(step).map(|t| t.components().count()).unwrap_or(0));
    Ok(fs_mounts)
}

/// The policy's protected paths in each of its writable binds.
fn protected_paths(p: &Policy, ctx: &AgentContext, fs_mounts: &[MountStep]) -> Vec<MountStep> {
    let mut steps = Vec::new();
    for step in fs_mounts {
        let MountStep::Bind {
            source,
            target,
            access: Access::Rw,
            ..
        } = step
        else {
            continue;
        };
        // The agent's own home is no host tree: nothing there runs on the
        // host, and its CLI writes its settings (`~/.cursor`) there.
        if *target == ctx.home && ctx.home_mount == HomeMount::Bind(source.clone()) {
            continue;
        }
        for entry in p.filesystem.protected_paths() {
            let dir = entry.ends_with('/');
            // An agent bind over the path replaces whatever is there
            // (the agent's own git dir at the workspace's `.git`): no
            // protection, and nothing created on the host for it.
            let path = target.join(entry.trim_end_matches('/'));
            if ctx.agent_binds.iter().any(|b| path.starts_with(&b.target)) {
                continue;
            }
            steps.push(MountStep::Protect {
                source: source.clone(),
                target: target.clone(),
                relative: entry.trim_end_matches('/').to_string(),
                dir,
            });
        }
    }
    steps
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

pub(super) fn target_of(step: &MountStep) -> Option<&Path> {
    match step {
        MountStep::Bind { target, .. } | MountStep::Tmpfs { target, .. } => Some(target),
        MountStep::Dev { target } | MountStep::Proc { target } => Some(target),
        MountStep::Sysfs { target }
        | MountStep::Mqueue { target }
        | MountStep::Mask { target }
        | MountStep::Empty { target } => Some(target),
        MountStep::Protect { .. } | MountStep::RootReadOnly | MountStep::ReadOnly { .. } => None,
    }
}
