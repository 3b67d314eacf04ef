//! Binds of protected host places, refused unless the operator allows them
//! (issue 44): a Kubernetes `hostPath` volume of `/etc`, read-write, let a
//! container with no capability and a subordinate uid read `/etc/shadow`
//! and write into the host's `/etc` through its idmapped bind.
//!
//! Judged on what the source really is: the object opened (symlinks
//! followed), by its mount's origin (`substrat_sandbox::mount_origin`: a
//! kubelet subPath's bind of `/etc` is `/etc`, whatever path reached it),
//! component-wise containment, never a text prefix, in any mode:
//! - `/`, `/home`, a home, a credential store in a home;
//! - the kernel's interfaces (`/proc`, `/sys`, `/dev`, `/boot`) and the
//!   host's secret places `check` audits (`/etc/shadow`, `/etc/ssh`, the
//!   kubelet's keys...), and any place that holds one (`/etc`, `/var`);
//! - the engines' places (`ENGINE_PLACES`): their sockets (connect(2)
//!   ignores a read-only mount: the runtime's socket is host root), their
//!   state, other pods' volumes and logs.
//!
//! Read-write, everything at or below a system directory (`RW_SYSTEM`:
//! `/etc`, `/usr`, `/var`, `/run`, `/opt`, `/srv`, `/mnt`...) and `/tmp`
//! itself. What stays allowed read-write: the container's own engine
//! files (`own_places`: exact layouts with the container's, its checked
//! sandbox's or its pod's id: containerd's `/etc/hosts`, `/dev/shm`,
//! kubelet's emptyDir), places outside the system directories (`/data`,
//! `/tmp/x`), and the operator's `allow_host_paths`.
//!
//! What is allowed is shown to the container as it is, not idmapped
//! (`BindView::AsIs`): launched by root, the container is its subordinate
//! uid there, an unprivileged stranger, so root's sockets (a k0s, cilium or
//! tmux socket in a directory no list names), root's 0600 files and
//! root's directories stay closed by the kernel's own permission checks,
//! for every path and for sockets made later. Idmapped, where container
//! root acts as host root: the container's own engine places and the
//! operator's `idmap_host_paths`.

use std::path::{Path, PathBuf};

use substrat_policy::workspace_risk::{WorkspaceRisk, workspace_risks};

use substrat_sandbox::bind_judge::BindView;

use crate::own_places::OwnIds;
use crate::spec::Mount;
use crate::translate::Unsupported;

/// The host's secret places (`check`'s, crates/policy's `secrets.rs`;
/// `/etc/ssh` for its host keys).
const SECRET_PLACES: [&str; 21] = [
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
];

/// The kernel's interfaces and the boot files.
const KERNEL_PLACES: [&str; 4] = ["/proc", "/sys", "/dev", "/boot"];

/// Where engines, the kubelet and the host's services keep their sockets
/// and state: refused in any mode. A read-only bind of a socket's
/// directory still connects (a runtime's socket runs any container as
/// root); state holds other containers' filesystems, volumes and logs.
/// Canonical paths (`/var/run` is a link to `/run`).
const ENGINE_PLACES: [&str; 23] = [
    "/run/containerd",
    "/run/docker",
    "/run/docker.sock",
    "/run/crio",
    "/run/podman",
    "/run/containers",
    "/run/k3s",
    "/run/cri-dockerd.sock",
    "/run/systemd",
    "/run/dbus",
    "/run/user",
    "/run/substrat",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/containers",
    "/var/lib/kubelet",
    "/var/lib/etcd",
    "/var/lib/rancher",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/tmp/.X11-unix",
    "/tmp/.ICE-unix",
];

/// Refused read-write at or below: the system's directories.
const RW_SYSTEM: [&str; 19] = [
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/var",
    "/run",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/snap",
    "/root",
    "/home",
    "/nix",
    "/lost+found",
];

/// Refused read-write themselves (below them, a test's or a job's own
/// directory is fine): every user's temporary files at once.
const RW_WHOLE: [&str; 2] = ["/tmp", "/var/tmp"];

/// What a bind's source is judged against.
#[derive(Debug, Clone, Default)]
pub struct HostPathRules {
    /// The operator's `allow_host_paths`: these and everything below.
    pub allowed: Vec<PathBuf>,
    /// The operator's `idmap_host_paths`: shown idmapped (container root
    /// acts as host root there), these and everything below.
    pub idmapped: Vec<PathBuf>,
    /// The container's id, its sandbox's and its pod's (`own_places`).
    pub own: OwnIds,
    /// The operator's granted sockets: target, and the device and inode
    /// of the one socket that may be bound there.
    pub sockets: Vec<(PathBuf, (u64, u64))>,
}

impl HostPathRules {
    /// The rules for container `id` of `annotations`, in the pod
    /// `cgroups_path` names, made by this runtime under `state_root`.
    pub fn new(
        allowed: &[PathBuf],
        id: &str,
        annotations: &std::collections::BTreeMap<String, String>,
        cgroups_path: Option<&str>,
        state_root: Option<&Path>,
    ) -> Self {
        let pod = cgroups_path.and_then(pod_uid_of_cgroups_path);
        Self {
            allowed: allowed.to_vec(),
            idmapped: Vec::new(),
            own: OwnIds::new(id, annotations, pod, state_root),
            sockets: Vec::new(),
        }
    }

    /// These rules with the operator's granted sockets (`agent_binds`
    /// with `socket = true`, resolved).
    pub fn with_sockets(mut self, granted: &[crate::runtime_config::GrantedBind]) -> Self {
        self.sockets = granted
            .iter()
            .filter(|g| g.socket)
            .filter_map(|g| Some((g.target.clone(), g.source_inode?)))
            .collect();
        self
    }

    /// Why a socket (device `dev`, inode `ino`, as opened) bound at
    /// `target` is refused, if it is: only the socket granted at that
    /// target, not another one bound there.
    pub fn judge_socket(&self, target: &Path, dev: u64, ino: u64) -> Option<String> {
        let granted: Vec<_> = self.sockets.iter().filter(|(t, _)| t == target).collect();
        if granted.iter().any(|(_, id)| *id == (dev, ino)) {
            return None;
        }
        Some(format!(
            "the socket bound at {} is not the one the operator granted there \
             (agent_binds: a grant is for its source's socket, device and inode)",
            target.display()
        ))
    }

    /// These rules with the operator's `idmap_host_paths`.
    pub fn with_idmapped(mut self, idmapped: &[PathBuf]) -> Self {
        self.idmapped = idmapped.to_vec();
        self
    }

    /// How an allowed bind of `source` (resolved) is shown: idmapped only
    /// when it is the container's own engine place or the operator grants
    /// it; as it is otherwise, the container a stranger to the host's files.
    pub fn view(&self, source: &Path) -> BindView {
        if self.own.owns(source) || self.idmapped.iter().any(|p| source.starts_with(p)) {
            BindView::Idmapped
        } else {
            BindView::AsIs
        }
    }

    /// Why a bind of `source` (absolute, resolved: where the bind really
    /// comes from) is refused, if it is.
    pub fn judge(&self, source: &Path, read_only: bool) -> Option<String> {
        if self.allowed.iter().any(|a| source.starts_with(a)) {
            return None;
        }
        if let Some(place) = ENGINE_PLACES
            .iter()
            .map(Path::new)
            .find(|p| p.starts_with(source) || source.starts_with(p))
        {
            if self.own.owns(source) {
                return None;
            }
            return Some(format!(
                "{} is, holds or lies in {}, an engine's or a service's place (its sockets \
                 connect even through a read-only bind)",
                source.display(),
                place.display()
            ));
        }
        if let Some(risk) = protected(source, read_only) {
            return Some(risk.to_string());
        }
        if read_only {
            return None;
        }
        let system = RW_SYSTEM
            .iter()
            .map(Path::new)
            .find(|d| source.starts_with(d));
        let whole = RW_WHOLE.iter().map(Path::new).find(|d| source == *d);
        system.or(whole).map(|dir| {
            format!(
                "{} is at or below the system directory {}, which no container writes",
                source.display(),
                dir.display()
            )
        })
    }

    /// Judges a bind by its origins (`mount_origin`: where the object
    /// really is, whatever path reached it): refused when any is, idmapped
    /// only when every one is. None known: another namespace's mount.
    pub fn judge_origins(
        &self,
        reached: &Path,
        origins: &[PathBuf],
        read_only: bool,
    ) -> Result<BindView, String> {
        if origins.is_empty() {
            return Err(
                "the source's mount is not one of this mount namespace's (another \
                        namespace's /proc/PID/root?), so what it is cannot be told"
                    .to_string(),
            );
        }
        for origin in origins {
            match self.judge(origin, read_only) {
                Some(why) if origin != reached => {
                    return Err(format!(
                        "it is a bind mount of {} (its mount's origin): {why}",
                        origin.display()
                    ));
                }
                Some(why) => return Err(why),
                None => {}
            }
        }
        if origins.iter().all(|o| self.view(o) == BindView::Idmapped) {
            Ok(BindView::Idmapped)
        } else {
            Ok(BindView::AsIs)
        }
    }
}

/// The system place `path` is or holds, or lies in when a secret or a
/// kernel one: never granted idmapped (`idmap_host_paths`), where
/// container root acts as host root. `/` holds them all.
pub fn system_root(path: &Path) -> Option<&'static Path> {
    let holds = RW_SYSTEM
        .iter()
        .chain(&ENGINE_PLACES)
        .chain(&SECRET_PLACES)
        .chain(&KERNEL_PLACES)
        .map(Path::new)
        .find(|place| place.starts_with(path));
    let within = SECRET_PLACES
        .iter()
        .chain(&KERNEL_PLACES)
        .map(Path::new)
        .find(|place| path.starts_with(place));
    holds.or(within)
}

/// The pod's uid in the cgroup path the engine gives a container, as the
/// kubelet names pods' groups: `/kubepods/burstable/pod<UID>/<id>`
/// (cgroupfs) or `kubepods-burstable-pod<UID_>.slice` (systemd, `_` for
/// `-`). The last such component; none when there is none.
pub fn pod_uid_of_cgroups_path(path: &str) -> Option<String> {
    let path = path.split(':').next().unwrap_or(path);
    path.split('/').rev().find_map(|name| {
        if let Some(slice) = name.strip_suffix(".slice") {
            let (_, uid) = slice.rsplit_once("-pod")?;
            return Some(uid.replace('_', "-"));
        }
        name.strip_prefix("pod")
            .filter(|uid| !uid.is_empty())
            .map(str::to_string)
    })
}

/// Whether `mount` binds a host path, and its source.
pub fn bind_source(mount: &Mount) -> Option<&str> {
    let is_bind = mount.kind.as_deref() == Some("bind")
        || mount.options.iter().any(|o| o == "bind" || o == "rbind");
    mount.source.as_deref().filter(|_| is_bind)
}

/// The refusal of bind `index` of `source` (resolved) into `destination`.
pub fn refusal(
    index: usize,
    source: &Path,
    destination: &str,
    read_only: bool,
    why: &str,
) -> Unsupported {
    let access = if read_only { "read-only" } else { "read-write" };
    Unsupported {
        field: format!("mounts[{index}]"),
        reason: format!(
            "a {access} bind of the host's {} into {destination} (a hostPath volume?) is refused: {why}; \
             the node's operator can allow it with allow_host_paths in the runtime's configuration",
            source.display(),
        ),
    }
}

/// Refuses the first bind of `mounts` whose source is a protected host
/// place or missing, naming its field. The source is resolved here as the
/// path stands now: the launcher judges again the source it opened
/// (`substrat_sandbox::RunOptions::bind_judge`), which is what is mounted.
pub fn refuse_protected_binds(mounts: &[Mount], rules: &HostPathRules) -> Result<(), Unsupported> {
    for (index, mount) in mounts.iter().enumerate() {
        // What translation drops (podman's /dev/shm, the infra container's
        // userdata/shm: the runtime's /dev has its own) is never mounted.
        if crate::mounts::dropped(mount) {
            continue;
        }
        let Some(text) = bind_source(mount) else {
            continue;
        };
        let read_only = mount.options.iter().any(|o| o == "ro");
        // Where the bind really comes from: a link to /etc is /etc, a
        // bind mount of /etc (a kubelet subPath) is /etc, judged on the
        // object opened. A source that does not open is not judged by its
        // text.
        let (source, origins) = substrat_sandbox::mount_origin::origins_of_path(Path::new(text))
            .map_err(|e| Unsupported {
                field: format!("mounts[{index}]"),
                reason: format!("the bind's source {text} cannot be resolved: {e}"),
            })?;
        if let Err(why) = rules.judge_origins(&source, &origins, read_only) {
            return Err(refusal(index, &source, &mount.destination, read_only, &why));
        }
    }
    Ok(())
}

/// Test builds only (`debug_assertions`): exchanges the two paths that
/// `SUBSTRAT_OCI_TEST_EXCHANGE` names (`A:B`, renameat2 RENAME_EXCHANGE),
/// called by the launcher between its check of the binds' text and their
/// opening, so a test swaps a source for a link exactly in that window and
/// only the judge of the opened descriptor stands between it and the
/// mount. Compiled out of release builds; the engine's environment is the
/// engine's (root's) anyway.
pub fn test_exchange_after_check() {
    #[cfg(debug_assertions)]
    if let Some((a, b)) = std::env::var("SUBSTRAT_OCI_TEST_EXCHANGE")
        .ok()
        .as_deref()
        .and_then(|v| v.split_once(':'))
    {
        let cwd = nix::fcntl::AT_FDCWD;
        let _ = nix::fcntl::renameat2(cwd, a, cwd, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE);
    }
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
#[path = "host_paths_tests.rs"]
mod tests;
