//! Workspaces that expose more than a project: `/`, a home directory, a
//! system directory, or a directory holding credentials or the shell
//! startup files host shells run. The policy binds the workspace (usually
//! read-write), so such a workspace hands the agent keys and a way to run
//! code on the host later. `run` and the daemon refuse them unless the
//! operator says so (`--allow-workspace-risk`, or the policy's
//! `filesystem.allow_workspace_risk`).

use std::fmt;
use std::path::{Path, PathBuf};

/// What a workspace exposes besides a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceRisk {
    /// The workspace is the host's root directory.
    Root,
    /// The workspace is a home directory (the user's, `/root` or `/home/NAME`).
    Home(PathBuf),
    /// A home directory (or all of them) lies below the workspace.
    HoldsHome(PathBuf),
    /// The workspace is, or lies in, a system directory.
    SystemDir(PathBuf),
    /// A credential store at the workspace's top (keys, tokens, cloud logins).
    Credentials(PathBuf),
    /// A shell's startup file, which host shells run.
    StartupFile(PathBuf),
}

impl WorkspaceRisk {
    /// A risk of where the workspace is (`/`, a home, a system directory),
    /// as opposed to what it holds, which an agent can change.
    pub fn is_about_place(&self) -> bool {
        matches!(
            self,
            Self::Root | Self::Home(_) | Self::HoldsHome(_) | Self::SystemDir(_)
        )
    }
}

impl fmt::Display for WorkspaceRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root => write!(f, "it is `/`: every file the user can reach"),
            Self::Home(p) => write!(
                f,
                "it is the home directory {} (keys, tokens, shell startup files)",
                p.display()
            ),
            Self::HoldsHome(p) => write!(f, "it holds the home directory {}", p.display()),
            Self::SystemDir(p) => write!(f, "it is in the system directory {}", p.display()),
            Self::Credentials(p) => write!(f, "it holds credentials: {}", p.display()),
            Self::StartupFile(p) => write!(
                f,
                "it holds a shell startup file the host runs: {}",
                p.display()
            ),
        }
    }
}

/// Credential stores, relative to a home directory (or a workspace).
pub const CREDENTIAL_PATHS: [&str; 17] = [
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker/config.json",
    ".config/gcloud",
    ".config/gh",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".password-store",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".local/share/keyrings",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
];

/// Tokens of agent CLIs, package registries and forges, relative to a
/// home (SBX042 and `learn` judge them; a workspace may hold a project's
/// own `.npmrc`, so `workspace_risks` does not).
pub const HOME_TOKEN_PATHS: [&str; 11] = [
    ".claude",
    ".claude.json",
    ".codex",
    ".gemini",
    ".npmrc",
    ".yarnrc.yml",
    ".docker",
    ".config/hub",
    ".config/op",
    ".config/rclone",
    ".local/share/gh",
];

/// Files shells run at start, relative to a home directory.
pub const STARTUP_FILES: [&str; 8] = [
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".config/fish/config.fish",
];

/// Directories whose every part belongs to the system.
const SYSTEM_TREES: [&str; 12] = [
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc",
    "/sys", "/dev",
];

/// Directories that are the system's themselves, though projects live below them.
const SYSTEM_DIRS: [&str; 5] = ["/var", "/opt", "/srv", "/run", "/tmp"];

/// What `workspace` (absolute, resolved) exposes, given the user's home.
/// Reads only the workspace's top entries: never walks the tree.
pub fn workspace_risks(workspace: &Path, home: Option<&Path>) -> Vec<WorkspaceRisk> {
    if workspace == Path::new("/") {
        return vec![WorkspaceRisk::Root];
    }
    let mut risks: Vec<WorkspaceRisk> = system_place(workspace).into_iter().collect();
    let homes = [home, Some(Path::new("/root")), Some(Path::new("/home"))];
    let is_home = home == Some(workspace)
        || workspace == Path::new("/root")
        || workspace.parent() == Some(Path::new("/home"));
    if is_home {
        risks.push(WorkspaceRisk::Home(workspace.to_path_buf()));
    } else if let Some(held) = homes
        .into_iter()
        .flatten()
        .find(|h| h.starts_with(workspace) && *h != workspace)
    {
        risks.push(WorkspaceRisk::HoldsHome(held.to_path_buf()));
    }
    // Inside a credential store of a home (`~/.ssh`, `~/.config/gh`...):
    // the workspace is the secret.
    for home in [home, Some(Path::new("/root"))].into_iter().flatten() {
        if let Some(store) = CREDENTIAL_PATHS
            .iter()
            .map(|entry| home.join(entry))
            .find(|store| workspace.starts_with(store))
        {
            risks.push(WorkspaceRisk::Credentials(store));
        }
    }
    if let Ok(rest) = workspace.strip_prefix("/home")
        && let Some(user) = rest.components().next()
    {
        let home = Path::new("/home").join(user);
        if let Some(store) = CREDENTIAL_PATHS
            .iter()
            .map(|entry| home.join(entry))
            .find(|store| workspace.starts_with(store))
            && !risks.contains(&WorkspaceRisk::Credentials(store.clone()))
        {
            risks.push(WorkspaceRisk::Credentials(store));
        }
    }
    for entry in CREDENTIAL_PATHS {
        let path = workspace.join(entry);
        if path.symlink_metadata().is_ok() {
            risks.push(WorkspaceRisk::Credentials(path));
        }
    }
    for entry in STARTUP_FILES {
        let path = workspace.join(entry);
        if path.symlink_metadata().is_ok() {
            risks.push(WorkspaceRisk::StartupFile(path));
        }
    }
    risks
}

/// Whether `workspace` is `/` or a system directory, from its path alone
/// (nothing read): the risks that hold in any filesystem tree, a
/// container's included.
pub fn system_place(workspace: &Path) -> Option<WorkspaceRisk> {
    if workspace == Path::new("/") {
        return Some(WorkspaceRisk::Root);
    }
    // Sources below /usr/src and /usr/local/src are projects (a container's
    // usual /usr/src/app), not the system.
    let project_in_usr = ["/usr/src", "/usr/local/src"]
        .iter()
        .any(|d| workspace.starts_with(d) && workspace != Path::new(d));
    let system = (SYSTEM_TREES.iter().any(|d| workspace.starts_with(d)) && !project_in_usr)
        || SYSTEM_DIRS.iter().any(|d| workspace == Path::new(d));
    system.then(|| WorkspaceRisk::SystemDir(workspace.to_path_buf()))
}

/// `workspace_risks` with this process's `$HOME` (resolved) as the home.
pub fn workspace_risks_here(workspace: &Path) -> Vec<WorkspaceRisk> {
    let home = std::env::var_os("HOME").map(|h| {
        let h = PathBuf::from(h);
        h.canonicalize().unwrap_or(h)
    });
    workspace_risks(workspace, home.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ws-risk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_project_directory_exposes_nothing() {
        let dir = scratch("project");
        std::fs::write(dir.join("Cargo.toml"), "").unwrap();
        std::fs::create_dir(dir.join(".git")).unwrap();
        assert_eq!(
            workspace_risks(&dir, Some(Path::new("/home/ana"))),
            Vec::new()
        );
        // Below /srv, /opt, /var, /tmp and /usr/src projects are fine.
        for ok in ["/srv/app", "/opt/app", "/var/www/site", "/usr/src/app"] {
            assert_eq!(
                workspace_risks(Path::new(ok), Some(Path::new("/home/ana"))),
                Vec::new(),
                "{ok}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn root_homes_and_system_directories_are_named() {
        let home = Some(Path::new("/home/ana"));
        assert_eq!(workspace_risks(Path::new("/"), home), [WorkspaceRisk::Root]);
        assert_eq!(
            workspace_risks(Path::new("/home"), home),
            [WorkspaceRisk::HoldsHome("/home/ana".into())]
        );
        assert_eq!(
            workspace_risks(Path::new("/home/bo"), home),
            [WorkspaceRisk::Home("/home/bo".into())]
        );
        // (/root's own startup files, where it has them, follow.)
        assert_eq!(
            workspace_risks(Path::new("/root"), home)[0],
            WorkspaceRisk::Home("/root".into())
        );
        assert_eq!(
            workspace_risks(
                Path::new("/data/users/ana"),
                Some(Path::new("/data/users/ana"))
            ),
            [WorkspaceRisk::Home("/data/users/ana".into())]
        );
        assert_eq!(
            workspace_risks(Path::new("/etc/nginx"), home),
            [WorkspaceRisk::SystemDir("/etc/nginx".into())]
        );
        assert_eq!(
            workspace_risks(Path::new("/var"), home),
            [WorkspaceRisk::SystemDir("/var".into())]
        );
    }

    #[test]
    fn a_workspace_inside_a_credential_store_is_named() {
        let home = Some(Path::new("/home/ana"));
        assert_eq!(
            workspace_risks(Path::new("/home/ana/.ssh"), home),
            [WorkspaceRisk::Credentials("/home/ana/.ssh".into())]
        );
        assert_eq!(
            workspace_risks(Path::new("/home/bo/.config/gh/x"), home),
            [WorkspaceRisk::Credentials("/home/bo/.config/gh".into())]
        );
        assert!(workspace_risks(Path::new("/home/ana/.config/nvim"), home).is_empty());
        assert!(WorkspaceRisk::Root.is_about_place());
        assert!(!WorkspaceRisk::Credentials("/x".into()).is_about_place());
    }

    #[test]
    fn credentials_and_startup_files_at_the_top_are_named() {
        let dir = scratch("secrets");
        std::fs::create_dir(dir.join(".ssh")).unwrap();
        std::fs::create_dir_all(dir.join(".config/gcloud")).unwrap();
        // A dangling symlink counts: it still names a credential store.
        std::os::unix::fs::symlink("/nowhere", dir.join(".aws")).unwrap();
        std::fs::write(dir.join(".bashrc"), "").unwrap();
        assert_eq!(
            workspace_risks(&dir, None),
            [
                WorkspaceRisk::Credentials(dir.join(".ssh")),
                WorkspaceRisk::Credentials(dir.join(".aws")),
                WorkspaceRisk::Credentials(dir.join(".config/gcloud")),
                WorkspaceRisk::StartupFile(dir.join(".bashrc")),
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
