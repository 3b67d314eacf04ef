//! What a launch checks of its workspace and home before anything is
//! built: a workspace that exposes more than a project is refused (each
//! reason named) unless allowed, and so is a `--home` that does.
//!
//! The daemon's turns pass `--workspace-judged`: the workspace's contents
//! were judged when the agent was made (what the agent writes there since
//! must not end its turns), but its place never is waived: the path must
//! still resolve to itself (no link put on its way since), and `/`, a home
//! or a system directory is refused whatever.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use substrat_policy::LoadedPolicy;
use substrat_policy::workspace_risk::{WorkspaceRisk, workspace_risks_here};
use substrat_sandbox::gitscan::{RootGit, find_nested};
use substrat_sandbox::plan::HomeMount;

use crate::launch::RunArgs;

/// The workspace (default: the current directory), resolved; a directory.
/// A judged workspace (the daemon's) must be its own resolved path.
pub fn resolve_workspace(args: &RunArgs) -> Result<PathBuf> {
    let given = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let workspace = given.canonicalize().with_context(|| {
        format!(
            "workspace {} does not exist or cannot be resolved",
            given.display()
        )
    })?;
    if args.workspace_judged && workspace != given {
        bail!(
            "workspace {} now leads to {}: a link was put on its way since the agent was made; \
             the turn is refused",
            given.display(),
            workspace.display()
        );
    }
    if !workspace.is_dir() {
        bail!("workspace {} is not a directory", workspace.display());
    }
    Ok(workspace)
}

/// Refused, or allowed with a warning per reason.
pub fn guard_workspace(
    args: &RunArgs,
    policy: &LoadedPolicy,
    workspace: &Path,
    program: &str,
) -> Result<()> {
    let risks = workspace_risks_here(workspace);
    if risks.is_empty() {
        return Ok(());
    }
    let reasons: String = risks.iter().map(|r| format!("\n  - {r}")).collect();
    let judged = args.workspace_judged && !risks.iter().any(WorkspaceRisk::is_about_place);
    let allowed_by = if args.allow_workspace_risk {
        "--allow-workspace-risk"
    } else if policy.policy.filesystem.allow_workspace_risk {
        "the policy's filesystem.allow_workspace_risk"
    } else if judged {
        "the daemon, which judged it when the agent was made"
    } else {
        bail!(
            "workspace {} exposes more than a project:{reasons}\nRun in a project directory \
             (--workspace DIR), or pass --allow-workspace-risk if the agent may have all of it",
            workspace.display()
        );
    };
    eprintln!(
        "{program}: warning: workspace {} exposes more than a project (allowed by {allowed_by}):{reasons}",
        workspace.display()
    );
    Ok(())
}

/// `--home DIR`, else a private tmpfs. DIR may not expose more than a home
/// of the command's own (not the real home, not a credential store), nor
/// hold git repositories, whose hooks host git would run (the daemon's
/// agent home, `--workspace-judged`, is the agent's own state).
pub fn home_mount(args: &RunArgs) -> Result<HomeMount> {
    let Some(dir) = &args.home else {
        return Ok(HomeMount::Tmpfs);
    };
    let dir = dir
        .canonicalize()
        .with_context(|| format!("--home {}: no such directory", dir.display()))?;
    if !dir.is_dir() {
        bail!("--home {} is not a directory", dir.display());
    }
    let risks: Vec<WorkspaceRisk> = workspace_risks_here(&dir)
        .into_iter()
        .filter(|r| !args.workspace_judged || r.is_about_place())
        .collect();
    if !risks.is_empty() && !args.allow_workspace_risk {
        let reasons: Vec<String> = risks.iter().map(ToString::to_string).collect();
        bail!(
            "--home {}: {} (give the command a home of its own, e.g. an empty directory)",
            dir.display(),
            reasons.join("; ")
        );
    }
    if !args.workspace_judged {
        let scan = find_nested(&dir, RootGit::Scanned)
            .with_context(|| format!("cannot look for git repositories in {}", dir.display()))?;
        if let Some(repo) = scan.found.first() {
            bail!(
                "--home {}: it holds a git repository ({}), whose hooks and config host git \
                 would run; give the command a home without repositories",
                dir.display(),
                repo.path.display()
            );
        }
    }
    Ok(HomeMount::Bind(dir))
}
