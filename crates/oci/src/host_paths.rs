//! Binds of protected host places, refused unless the operator allows them
//! (issue 44): a Kubernetes `hostPath` volume of `/etc`, read-write, let a
//! container with no capability and a subordinate uid read `/etc/shadow`
//! and write into the host's `/etc` through its idmapped bind.
//!
//! Refused, read-only or not: `/`, a home or `/home`, a credential store,
//! the kernel's interfaces (`/proc`, `/sys`, `/dev`, `/boot`), and any
//! place that is, holds or lies in one of the host's secret places `check`
//! audits (`/etc/shadow`, `/etc/ssh`, the kubelet's keys...: so `/etc` and
//! `/var` whole). Refused read-write: every system place `run` refuses as
//! a workspace (`/etc/...`, `/usr/...`, `/var`, `/run`...). Read-only
//! binds of the rest of the system stay allowed: the policies' own binds
//! (`/usr`, `/etc/ld.so.cache`, `/etc/ssl/certs`). The operator's
//! `allow_host_paths` allows more.

use std::path::{Path, PathBuf};

use substrat_policy::workspace_risk::{WorkspaceRisk, workspace_risks};

use crate::spec::Mount;
use crate::translate::Unsupported;

/// The host's secret places (`check`'s, crates/policy's `secrets.rs`;
/// `/etc/ssh` for its host keys).
const SECRET_PLACES: [&str; 22] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh",
    "/etc/krb5.keytab",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/doas.conf",
    "/etc/kubernetes",
    "/etc/rancher",
    "/etc/docker",
    "/etc/substrat",
    "/var/lib/sss/db",
    "/var/lib/kubelet/pki",
    "/var/lib/kubelet/kubeconfig",
    "/var/lib/rancher/k3s/server",
    "/run/secrets",
    "/var/run/secrets",
];

/// The kernel's interfaces and the boot files.
const KERNEL_PLACES: [&str; 4] = ["/proc", "/sys", "/dev", "/boot"];

/// Refuses the first bind of `mounts` whose source is a protected host
/// place, naming its field, unless `allowed` holds the source or a
/// directory above it.
pub fn refuse_protected_binds(mounts: &[Mount], allowed: &[PathBuf]) -> Result<(), Unsupported> {
    for (index, mount) in mounts.iter().enumerate() {
        let is_bind = mount.kind.as_deref() == Some("bind")
            || mount.options.iter().any(|o| o == "bind" || o == "rbind");
        let Some(source) = mount.source.as_deref().filter(|_| is_bind) else {
            continue;
        };
        // Where the bind really comes from: a link to /etc is /etc.
        let source = std::fs::canonicalize(source).unwrap_or_else(|_| PathBuf::from(source));
        if allowed.iter().any(|a| source.starts_with(a)) {
            continue;
        }
        let read_only = mount.options.iter().any(|o| o == "ro");
        if let Some(risk) = protected(&source, read_only) {
            let access = if read_only { "read-only" } else { "read-write" };
            return Err(Unsupported {
                field: format!("mounts[{index}]"),
                reason: format!(
                    "a {access} bind of the host's {} into {} (a hostPath volume?) is refused: {risk}; \
                     the node's operator can allow it with allow_host_paths in the runtime's configuration",
                    source.display(),
                    mount.destination
                ),
            });
        }
    }
    Ok(())
}

/// Why `source` is protected, if it is, for a bind of this access.
fn protected(source: &Path, read_only: bool) -> Option<WorkspaceRisk> {
    // Every account's home at once.
    if source == Path::new("/home") {
        return Some(WorkspaceRisk::HoldsHome(source.to_path_buf()));
    }
    let secret = SECRET_PLACES
        .iter()
        .chain(&KERNEL_PLACES)
        .map(Path::new)
        .find(|place| place.starts_with(source) || source.starts_with(place));
    if let Some(place) = secret {
        return Some(WorkspaceRisk::SystemDir(place.to_path_buf()));
    }
    workspace_risks(source, None)
        .into_iter()
        .find(|risk| match risk {
            // What a directory holds is the engine's business (a volume may
            // hold a `.profile`); where it is and what it is are not.
            WorkspaceRisk::StartupFile(_) => false,
            WorkspaceRisk::Credentials(store) => source.starts_with(store),
            WorkspaceRisk::SystemDir(_) => !read_only,
            WorkspaceRisk::Root | WorkspaceRisk::Home(_) | WorkspaceRisk::HoldsHome(_) => true,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(source: &str, destination: &str, ro: bool) -> Mount {
        let mut options = vec!["rbind".to_string()];
        if ro {
            options.push("ro".into());
        }
        Mount {
            destination: destination.into(),
            kind: Some("bind".into()),
            source: Some(source.into()),
            options,
            uid_mappings: None,
            gid_mappings: None,
        }
    }

    #[test]
    fn protected_places_are_refused_by_field_and_source() {
        for (source, ro) in [
            ("/etc", false),
            ("/etc", true),
            ("/etc/shadow", true),
            ("/etc/ssh", true),
            ("/etc/ld.so.cache", false),
            ("/", true),
            ("/root", true),
            ("/root/.ssh", true),
            ("/home", false),
            ("/usr", false),
            ("/var", true),
            ("/var/lib/kubelet/pki", true),
            ("/proc", true),
            ("/dev/sda", true),
        ] {
            let mounts = [
                bind("/var/lib/c/hosts", "/etc/hosts", true),
                bind(source, "/host", ro),
            ];
            let err = refuse_protected_binds(&mounts, &[])
                .expect_err(&format!("{source} ro={ro} was not refused"));
            assert_eq!(err.field, "mounts[1]", "{source}");
            assert!(err.reason.contains("into /host"), "{}", err.reason);
        }
    }

    #[test]
    fn engine_files_programs_read_only_and_operator_grants_pass() {
        let mounts = [
            bind("/var/lib/containerd/sandboxes/x/hosts", "/etc/hosts", false),
            bind("/run/containerd/x/shm", "/dev/shm", false),
            bind("/usr", "/usr", true),
            bind("/opt", "/opt", true),
            // The shipped policies' system binds, as daemon --engine passes them.
            bind("/etc/ld.so.cache", "/etc/ld.so.cache", true),
            bind("/etc/alternatives", "/etc/alternatives", true),
            bind("/srv/data", "/data", false),
        ];
        assert!(refuse_protected_binds(&mounts, &[]).is_ok());
        let etc = [bind("/etc/ssl/certs", "/etc/ssl/certs", false)];
        assert!(refuse_protected_binds(&etc, &[]).is_err());
        assert!(refuse_protected_binds(&etc, &[PathBuf::from("/etc/ssl")]).is_ok());
    }
}
