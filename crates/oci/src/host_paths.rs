//! Binds of protected host places, refused unless the operator allows them
//! (issue 44): a Kubernetes `hostPath` volume of `/etc`, read-write, let a
//! container with no capability and a subordinate uid read `/etc/shadow`
//! and write into the host's `/etc` through its idmapped bind.
//!
//! Judged on the source as the launch resolves it (symlinks followed,
//! component-wise containment, never a text prefix), in any mode:
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
//! places (a path with the container's, its sandbox's or its pod's id as a
//! component below an engine place: containerd's `/etc/hosts`, `/dev/shm`,
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

use std::path::{Component, Path, PathBuf};

use substrat_policy::workspace_risk::{WorkspaceRisk, workspace_risks};

use substrat_sandbox::bind_judge::BindView;

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

/// The engine's annotations naming the container's sandbox and pod: paths
/// below an engine place with one of these as a component are theirs.
const OWN_ID_ANNOTATIONS: [&str; 3] = [
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-uid",
    "io.kubernetes.pod.uid",
];

/// An id shorter than this never marks a place as the container's own:
/// engines' ids are 64 hex digits, pods' uids 36 characters.
const MIN_OWN_ID: usize = 16;

/// What a bind's source is judged against.
#[derive(Debug, Clone, Default)]
pub struct HostPathRules {
    /// The operator's `allow_host_paths`: these and everything below.
    pub allowed: Vec<PathBuf>,
    /// The operator's `idmap_host_paths`: shown idmapped (container root
    /// acts as host root there), these and everything below.
    pub idmapped: Vec<PathBuf>,
    /// The container's id, its sandbox's and its pod's (from the engine).
    pub own_ids: Vec<String>,
}

impl HostPathRules {
    /// The rules for container `id` of `annotations`.
    pub fn new(
        allowed: &[PathBuf],
        id: &str,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        let own_ids = std::iter::once(id)
            .chain(
                OWN_ID_ANNOTATIONS
                    .iter()
                    .filter_map(|k| annotations.get(*k).map(String::as_str)),
            )
            .filter(|id| id.len() >= MIN_OWN_ID && !id.contains('/'))
            .map(str::to_string)
            .collect();
        Self {
            allowed: allowed.to_vec(),
            idmapped: Vec::new(),
            own_ids,
        }
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
        let own = ENGINE_PLACES
            .iter()
            .map(Path::new)
            .any(|place| self.is_own(place, source));
        if own || self.idmapped.iter().any(|p| source.starts_with(p)) {
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
            if self.is_own(place, source) {
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

    /// `source` lies below `place` in a directory named by one of the
    /// container's own ids (its sandbox's files, its pod's volumes).
    fn is_own(&self, place: &Path, source: &Path) -> bool {
        let Ok(below) = source.strip_prefix(place) else {
            return false;
        };
        below.components().any(|c| match c {
            Component::Normal(name) => self.own_ids.iter().any(|id| name == id.as_str()),
            _ => false,
        })
    }
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
        let Some(text) = bind_source(mount) else {
            continue;
        };
        let read_only = mount.options.iter().any(|o| o == "ro");
        // Where the bind really comes from: a link to /etc is /etc. A
        // source that does not resolve is not judged by its text.
        let source = std::fs::canonicalize(text).map_err(|e| Unsupported {
            field: format!("mounts[{index}]"),
            reason: format!("the bind's source {text} cannot be resolved: {e}"),
        })?;
        if let Some(why) = rules.judge(&source, read_only) {
            return Err(refusal(index, &source, &mount.destination, read_only, &why));
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

    const SANDBOX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const POD_UID: &str = "5e0c1b2a-1111-4222-8333-944455556666";

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

    fn rules(allowed: &[&str]) -> HostPathRules {
        let annotations = [
            (
                "io.kubernetes.cri.sandbox-id".to_string(),
                SANDBOX.to_string(),
            ),
            (
                "io.kubernetes.cri.sandbox-uid".to_string(),
                POD_UID.to_string(),
            ),
        ];
        HostPathRules::new(
            &allowed.iter().map(PathBuf::from).collect::<Vec<_>>(),
            "c0ffee",
            &annotations.into_iter().collect(),
        )
    }

    /// Judged on the path as given (these tests do not depend on what
    /// this machine has): `judge` takes resolved paths.
    fn refused(source: &str, ro: bool) -> bool {
        rules(&[]).judge(Path::new(source), ro).is_some()
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
            ("/home", false),
            ("/usr", false),
            ("/var", true),
            ("/proc", true),
            ("/dev/null", true),
        ] {
            let mounts = [
                bind("/etc/hosts", "/etc/hosts", true),
                bind(source, "/host", ro),
            ];
            let err = refuse_protected_binds(&mounts, &rules(&[]))
                .expect_err(&format!("{source} ro={ro} was not refused"));
            assert_eq!(err.field, "mounts[1]", "{source}");
            assert!(err.reason.contains("into /host"), "{}", err.reason);
        }
    }

    #[test]
    fn a_missing_source_is_refused_not_judged_by_its_text() {
        let mounts = [bind("/nonexistent-substrat/x", "/host", false)];
        let err = refuse_protected_binds(&mounts, &rules(&[])).expect_err("missing passed");
        assert!(err.reason.contains("cannot be resolved"), "{}", err.reason);
    }

    /// Attacker's review (k8s): system places below /var, /run, /opt are
    /// read-write binds that give the host (a runtime's socket, a root
    /// crontab, the CNI plugins containerd runs as root, other pods'
    /// volumes); all passed, read-write, at 0f9b01a.
    #[test]
    fn atk_system_places_below_var_run_opt_are_refused_read_write() {
        for source in [
            "/run/containerd",
            "/run/containerd/containerd.sock",
            "/run/docker.sock",
            "/var/lib/containerd",
            "/var/lib/kubelet/pods",
            "/var/lib/etcd",
            "/var/spool/cron/crontabs",
            "/var/log",
            "/opt/cni/bin",
            "/run/systemd",
            // Variants: deeper, other top directories, temp as a whole.
            "/var/spool/cron/crontabs/root",
            "/srv/www",
            "/mnt/disk",
            "/usr/local/bin",
            "/home/alice",
            "/home/alice/.bashrc",
            "/tmp",
            "/var/tmp",
            "/lib/modules",
        ] {
            assert!(
                refused(source, false),
                "{source} read-write was not refused"
            );
        }
    }

    /// Read-only, an engine's socket is the engine: connect(2) ignores ro.
    #[test]
    fn atk_engine_sockets_are_refused_read_only() {
        for source in [
            "/run/containerd",
            "/run/containerd/containerd.sock",
            "/var/lib/kubelet/pods",
            // Variants: every engine's and the kubelet's sockets and state.
            "/run",
            "/run/docker.sock",
            "/run/crio/crio.sock",
            "/run/podman/podman.sock",
            "/run/dbus/system_bus_socket",
            "/run/systemd/private",
            "/var/lib/kubelet/pod-resources",
            "/var/lib/kubelet/device-plugins/kubelet.sock",
            "/var/lib/containerd",
            "/var/lib/docker",
            "/var/log/pods",
            "/var/lib/etcd/member",
            "/tmp/.X11-unix",
            // Another pod's volume, another sandbox's files.
            "/var/lib/kubelet/pods/11111111-2222-4333-8444-555566667777/volumes",
            "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/ffff/shm",
        ] {
            assert!(refused(source, true), "{source} read-only was not refused");
        }
    }

    #[test]
    fn containment_is_by_component_not_by_text() {
        for source in ["/etcetera", "/usrdata", "/var2", "/tmpx", "/home2"] {
            assert!(!refused(source, false), "{source} refused as if below");
        }
        for source in [
            "/run/containerd2",
            "/etc/ssh2",
            "/var/lib/kubelet2",
            "/devx",
        ] {
            assert!(!refused(source, true), "{source} refused as if below");
        }
        assert!(!refused("/tmp/job-1", false));
        assert!(!refused("/data/volume", false));
    }

    #[test]
    fn engine_files_programs_read_only_and_operator_grants_pass() {
        let cri = "io.containerd.grpc.v1.cri/sandboxes";
        for (source, ro) in [
            (format!("/var/lib/containerd/{cri}/{SANDBOX}/hosts"), false),
            (format!("/run/containerd/{cri}/{SANDBOX}/shm"), false),
            (
                format!("/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/x"),
                false,
            ),
            (
                format!("/var/lib/kubelet/pods/{POD_UID}/containers/c/0"),
                false,
            ),
            ("/usr".into(), true),
            ("/opt".into(), true),
            ("/opt/cni/bin".into(), true),
            ("/etc/ld.so.cache".into(), true),
            ("/etc/alternatives".into(), true),
        ] {
            assert!(!refused(&source, ro), "{source} ro={ro} refused");
        }
        // An id too short to be an engine's marks nothing as the container's.
        assert!(refused("/var/lib/docker/containers/c0ffee/hosts", false));
        assert!(refused("/etc/ssl/certs", false));
        let granted = rules(&["/etc/ssl", "/run/containerd"]);
        assert!(granted.judge(Path::new("/etc/ssl/certs"), false).is_none());
        assert!(
            granted
                .judge(Path::new("/run/containerd/containerd.sock"), true)
                .is_none()
        );
    }

    /// Issue 44: only the container's own engine places and the operator's
    /// grants are idmapped; every other host path is shown as it is.
    #[test]
    fn only_own_places_and_granted_paths_are_idmapped() {
        let cri = "io.containerd.grpc.v1.cri/sandboxes";
        let rules = rules(&["/etc/ssl"]).with_idmapped(&["/srv/agent".into()]);
        for own in [
            format!("/var/lib/containerd/{cri}/{SANDBOX}/hosts"),
            format!("/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/x"),
            "/srv/agent".into(),
            "/srv/agent/chats".into(),
        ] {
            assert_eq!(rules.view(Path::new(&own)), BindView::Idmapped, "{own}");
        }
        for stranger in [
            "/data",
            "/tmp/tmux-0",
            "/etc/ssl",
            "/usr",
            "/srv/agent2",
            "/srv",
            // Another pod's, another sandbox's, and an id outside every
            // engine place.
            "/var/lib/kubelet/pods/11111111-2222-4333-8444-555566667777/volumes",
            "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/ffff/shm",
            "/data/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(
                rules.view(Path::new(stranger)),
                BindView::AsIs,
                "{stranger}"
            );
        }
    }
}
