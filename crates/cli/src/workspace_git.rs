//! The git repositories a launch looks after: `substrat_sandbox::workspace_git`,
//! with the default git state of a one-off run and the warnings on stderr.

use std::path::{Path, PathBuf};

use anyhow::Result;
use substrat_policy::text;
use substrat_sandbox::gitscan::{NestedRepo, RootGit};
use substrat_sandbox::plan::LaunchPlan;
pub use substrat_sandbox::workspace_git::WorkspaceGit;

/// `WorkspaceGit::prepare` with `git_state`, or the one-off default.
pub fn prepare(
    git_state: Option<&Path>,
    plan: &LaunchPlan,
    workspace: &Path,
) -> Result<WorkspaceGit> {
    // The default is looked for only when the workspace is writable (the
    // only case it is used in): a read-only run needs no HOME.
    let state = match git_state {
        Some(dir) => dir.to_path_buf(),
        None if substrat_sandbox::writable_in_view(plan, workspace) => {
            default_git_state(workspace)?
        }
        None => PathBuf::new(),
    };
    Ok(WorkspaceGit::prepare(&state, plan, workspace)?)
}

/// `after_run`, each warning on stderr.
pub fn after_run(git: &mut WorkspaceGit, program: &str) {
    for warning in git.after_run() {
        eprintln!("{program}: warning: {}", text::escape_text(&warning));
    }
}

/// `quarantine_warnings`, each on stderr; whether all was made inert.
pub fn quarantine_and_say(
    root: &Path,
    root_git: RootGit,
    before: &[NestedRepo],
    program: &str,
) -> bool {
    let mut warnings = Vec::new();
    let clean =
        substrat_sandbox::workspace_git::quarantine_warnings(root, root_git, before, &mut warnings);
    for warning in warnings {
        eprintln!("{program}: warning: {}", text::escape_text(&warning));
    }
    clean
}

/// The agent git state of a one-off run: per workspace, under the user's
/// state directory (never inside the workspace; `state_dirs`).
fn default_git_state(workspace: &Path) -> Result<PathBuf> {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    let base = crate::state_dirs::user_state_dir("XDG_STATE_HOME")?;
    let digest = sha2::Sha256::digest(workspace.as_os_str().as_bytes());
    let name: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(base.join("git").join(name))
}
