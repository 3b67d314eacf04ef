//! The git repositories a launch looks after (SECURITY.md, "git metadata"):
//! where the command can write the workspace, its `.git` is the agent's
//! own (`gitdir`); in every tree the command can write, repositories that
//! exist are read-only inside and ones made during the run are made inert
//! after it (`gitscan`). Used by `substrat-run` and by the daemon's turns
//! as containers alike.

use std::path::{Path, PathBuf};

use crate::gitdir::AgentGit;
use crate::gitscan::{NestedRepo, RepoKind, RootGit};
use crate::plan::{Access, AgentBind, LaunchPlan, MountStep};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceGitError {
    #[error("cannot give the workspace its own git directory: {0}")]
    AgentGit(#[source] crate::gitdir::GitDirError),
    #[error("cannot look for git repositories in {path}: {source}")]
    Scan {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot look into {0} for git repositories (the sandbox keeps those read-only): \
         make it readable to this user, or move it out of the writable tree"
    )]
    Unreadable(PathBuf),
    #[error(
        "{0} is itself a git directory (HEAD, objects, refs): the command could change \
         its config; give it a workspace that is not a repository's git dir"
    )]
    GitDirAsTree(PathBuf),
}

/// One writable tree and the repositories found in it before the run.
#[derive(Debug)]
struct Tree {
    root: PathBuf,
    root_git: RootGit,
    before: Vec<NestedRepo>,
}

#[derive(Debug)]
pub struct WorkspaceGit {
    agent: Option<AgentGit>,
    trees: Vec<Tree>,
    /// The workspace's `.git`, replaced by the agent's git dir: never bound
    /// read-only over it, whichever writable tree holds it.
    replaced: Option<PathBuf>,
}

impl WorkspaceGit {
    /// Looks at the writable trees of `plan` (built without these binds)
    /// and makes the agent's git dir when the workspace is one of them.
    /// `git_state` holds the agent's git dir (outside every bind).
    pub fn prepare(
        git_state: &Path,
        plan: &LaunchPlan,
        workspace: &Path,
    ) -> Result<Self, WorkspaceGitError> {
        let agent = if crate::writable_in_view(plan, workspace) {
            Some(
                crate::gitdir::prepare(workspace, git_state)
                    .map_err(WorkspaceGitError::AgentGit)?,
            )
        } else {
            None
        };
        let mut trees = Vec::new();
        for root in writable_trees(plan) {
            let root_git = if agent.is_some() && root == workspace {
                RootGit::Replaced
            } else {
                RootGit::Scanned
            };
            let scan = crate::gitscan::find_nested(&root, root_git).map_err(|source| {
                WorkspaceGitError::Scan {
                    path: root.clone(),
                    source,
                }
            })?;
            // A directory the launcher cannot look into may hold a
            // repository the command could change: refuse rather than guess.
            if let Some(dir) = scan.unreadable.first() {
                return Err(WorkspaceGitError::Unreadable(dir.clone()));
            }
            if let Some(repo) = scan.found.iter().find(|r| r.path == root) {
                return Err(WorkspaceGitError::GitDirAsTree(repo.path.clone()));
            }
            // Every repository there before the run, the workspace's own
            // `.git` included: after the run it is not new (`binds` leaves
            // it out, since the agent's git dir replaces it).
            let before = scan.found;
            trees.push(Tree {
                root,
                root_git,
                before,
            });
        }
        let replaced = agent.as_ref().map(|_| workspace.join(".git"));
        Ok(Self {
            agent,
            trees,
            replaced,
        })
    }

    /// The agent's git directory (its commits), when the workspace has one.
    pub fn agent_repo(&self) -> Option<PathBuf> {
        self.agent.as_ref().map(|a| a.state.join("repo"))
    }

    pub fn is_empty(&self) -> bool {
        self.agent.is_none() && self.trees.iter().all(|t| t.before.is_empty())
    }

    /// The agent's git dir, then every repository found, read-only. (A
    /// `.git` symlink cannot be bound; replacing it makes a new entry,
    /// which `after_run` renames aside.)
    pub fn binds(&self) -> Vec<AgentBind> {
        let mut binds = self
            .agent
            .as_ref()
            .map(|a| a.binds.clone())
            .unwrap_or_default();
        let repos = self.trees.iter().flat_map(|t| &t.before);
        binds.extend(
            repos
                .filter(|repo| repo.kind != RepoKind::Other)
                .filter(|repo| Some(&repo.path) != self.replaced.as_ref())
                .map(|repo| AgentBind {
                    source: repo.path.clone(),
                    target: repo.path.clone(),
                    access: Access::Ro,
                }),
        );
        binds
    }

    /// Where the mount points of this launch are listed (the agent's git
    /// state, when there is one).
    pub fn mount_point_record(&self) -> Option<PathBuf> {
        self.agent
            .as_ref()
            .map(|a| a.state.join(format!("mountpoints.{}", std::process::id())))
    }

    /// Whatever the launch did: repositories the command made are renamed
    /// aside; then the agent's git dir names the host's objects again (so
    /// the person can fetch from it). The warnings, one per line to say
    /// loudly: after a run the command's exit code is the run's.
    pub fn after_run(&mut self) -> Vec<String> {
        let mut warnings = Vec::new();
        for tree in &self.trees {
            quarantine_warnings(&tree.root, tree.root_git, &tree.before, &mut warnings);
        }
        if let Some(agent) = &mut self.agent
            && let Err(e) = agent.after_run()
        {
            warnings.push(format!("the agent's git directory: {e}"));
        }
        warnings
    }
}

/// Makes inert every repository below `root` that is not one of `before`
/// (`gitscan::quarantine_new`), a warning each in `warnings`. Also after a
/// layer's apply: a bare repository is made of names apply does not
/// refuse. Returns whether every repository made was made inert (or none
/// was).
pub fn quarantine_warnings(
    root: &Path,
    root_git: RootGit,
    before: &[NestedRepo],
    warnings: &mut Vec<String>,
) -> bool {
    match crate::gitscan::quarantine_new(root, root_git, before) {
        Ok(scan) => {
            for q in scan.found {
                warnings.push(format!(
                    "the command made a git repository: renamed {} to {} so that git does not \
                     take it for one (look inside before renaming it back)",
                    q.from.display(),
                    q.to.display()
                ));
            }
            for repo in scan.held {
                warnings.push(format!(
                    "the command made a git repository at {}, which another running sandbox \
                     holds read-only; that launch renames it aside when it ends",
                    repo.display()
                ));
            }
            let clean = scan.unreadable.is_empty();
            for dir in scan.unreadable {
                warnings.push(format!(
                    "could not look into {} for git repositories the command made; do not run \
                     git in it before looking",
                    dir.display()
                ));
            }
            clean
        }
        Err(e) => {
            warnings.push(format!(
                "could not check {} for git repositories the command made: {e}; do not run git \
                 below it before looking",
                root.display()
            ));
            false
        }
    }
}

/// The host trees the command can write: writable binds' sources that are
/// directories, outermost only (a tree inside another is walked with it).
fn writable_trees(plan: &LaunchPlan) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = plan
        .mounts
        .iter()
        .filter_map(|step| match step {
            MountStep::Bind {
                source,
                access: Access::Rw,
                ..
            } if std::fs::symlink_metadata(source).is_ok_and(|m| m.is_dir()) => {
                Some(source.clone())
            }
            _ => None,
        })
        .collect();
    roots.sort();
    roots.dedup();
    let outer: Vec<PathBuf> = roots
        .iter()
        .filter(|r| !roots.iter().any(|o| o != *r && r.starts_with(o)))
        .cloned()
        .collect();
    outer
}
