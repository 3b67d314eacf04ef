//! A container turn's host places as given, never as a link leads
//! (issue 44): the workspace and each bind source the agent or its parent
//! could have changed must resolve to itself, as `substrat-run
//! --workspace-judged` requires of the workspace. What substrat-oci is
//! told to allow and idmap (`oci.toml`) is the given paths only; a source
//! swapped for a link after this check resolves elsewhere, which
//! substrat-oci then judges by its own rules, never as granted.

use std::path::{Path, PathBuf};

use substrat_policy::workspace_risk::workspace_risks_here;
use substrat_sandbox::plan::{Access, MountStep};

use super::TurnError;

/// The workspace must be its own resolved path: a link put on its way
/// since the agent was made (a parent agent replacing its child's
/// workspace) would bind the link's target instead.
pub(in crate::turns) fn check_workspace(workspace: &Path) -> Result<(), TurnError> {
    let resolved = workspace.canonicalize().map_err(|e| {
        TurnError::Container(format!(
            "workspace {} cannot be resolved: {e}",
            workspace.display()
        ))
    })?;
    if resolved != workspace {
        return Err(TurnError::Container(format!(
            "workspace {} now leads to {}: a link was put on its way since the agent was made; \
             the turn is refused",
            workspace.display(),
            resolved.display()
        )));
    }
    Ok(())
}

/// What `substrat-run --workspace-judged` refuses of its workspace, for a
/// container turn, which never reaches it: `/`, a system directory, a
/// home or a directory holding homes, unless the role allows workspace
/// risks. Judged at every turn, not only when the agent was made: the
/// agent's row is the database's, and its writer could name `/etc/cron.d`
/// (which substrat-oci would then be told to allow and idmap).
pub(in crate::turns) fn check_workspace_place(
    workspace: &Path,
    allow_workspace_risk: bool,
) -> Result<(), TurnError> {
    if allow_workspace_risk {
        return Ok(());
    }
    let places: Vec<String> = workspace_risks_here(workspace)
        .iter()
        .filter(|r| r.is_about_place())
        .map(ToString::to_string)
        .collect();
    if places.is_empty() {
        return Ok(());
    }
    Err(TurnError::Container(format!(
        "workspace {} exposes more than a project ({}): the turn is refused",
        workspace.display(),
        places.join("; ")
    )))
}

/// The plan's bind sources substrat-oci may allow and idmap: each as
/// given, when it resolves to itself. A source that resolves elsewhere is
/// refused when it is writable or lies in the workspace or the daemon's
/// state directory (places an agent can change); a read-only bind of the
/// operator's elsewhere (`/bin` -> `usr/bin`) is mounted but not granted.
pub(super) fn granted_sources(
    mounts: &[MountStep],
    workspace: &Path,
    state_dir: &Path,
) -> Result<Vec<PathBuf>, TurnError> {
    let mut granted = Vec::new();
    for step in mounts {
        let MountStep::Bind {
            source,
            access,
            optional,
            ..
        } = step
        else {
            continue;
        };
        let Ok(resolved) = source.canonicalize() else {
            if *optional {
                continue;
            }
            return Err(TurnError::Container(format!(
                "bind source {} cannot be resolved",
                source.display()
            )));
        };
        if resolved == *source {
            granted.push(source.clone());
            continue;
        }
        let agents =
            *access == Access::Rw || source.starts_with(workspace) || source.starts_with(state_dir);
        if agents {
            return Err(TurnError::Container(format!(
                "bind source {} leads to {}: a link is on its way; the turn is refused",
                source.display(),
                resolved.display()
            )));
        }
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_sandbox::plan::SocketUse;

    fn bind(source: &Path, access: Access) -> MountStep {
        MountStep::Bind {
            source: source.to_path_buf(),
            target: "/t".into(),
            access,
            optional: false,
            socket: SocketUse::Unjudged,
        }
    }

    /// Read-only review (HIGH): a database writer naming a system place or
    /// a home as an agent's workspace got it allowed and idmapped in a
    /// container turn (substrat-run refuses it, container turns never ran
    /// that check).
    #[test]
    fn a_workspace_in_a_system_place_or_a_home_is_refused_unless_the_role_allows_it() {
        for place in ["/etc/cron.d", "/usr/local/bin", "/", "/var"] {
            let err = check_workspace_place(Path::new(place), false)
                .expect_err(place)
                .to_string();
            assert!(
                err.contains("exposes more than a project"),
                "{place}: {err}"
            );
            assert!(
                check_workspace_place(Path::new(place), true).is_ok(),
                "{place}"
            );
        }
        let project = tempfile::tempdir().unwrap();
        assert!(check_workspace_place(project.path(), false).is_ok());
    }

    #[test]
    fn a_workspace_or_writable_source_through_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let (real, link) = (base.join("real"), base.join("ws"));
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(check_workspace(&real).is_ok());
        let err = check_workspace(&link).unwrap_err().to_string();
        assert!(err.contains(&link.display().to_string()), "{err}");
        let state = base.join("state");
        let plan = |step| vec![step];
        let ok = granted_sources(&plan(bind(&real, Access::Rw)), &real, &state).unwrap();
        assert_eq!(ok, vec![real.clone()]);
        let err = granted_sources(&plan(bind(&link, Access::Rw)), &real, &state).unwrap_err();
        assert!(err.to_string().contains("leads to"), "{err}");
        // Read-only, the operator's, elsewhere: mounted, never granted.
        let ro = granted_sources(&plan(bind(&link, Access::Ro)), &state, &state).unwrap();
        assert!(ro.is_empty());
    }
}
