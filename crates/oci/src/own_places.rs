//! The container's own files in the engines' places (issue 44): exact
//! layouts, never "any component below an engine place named like an id".
//!
//! A path is the container's own only when it is, component for component,
//! one of the files or volumes an engine makes for this container, its
//! sandbox or its pod:
//! - kubelet: `pods/<POD>/etc-hosts`, `pods/<POD>/containers/<name>/<n>`,
//!   `pods/<POD>/volumes/kubernetes.io~{empty-dir,secret,configmap,projected,
//!   downward-api}/<name>[/...]` (the kubelet's own per-pod volumes; a
//!   subPath's `volume-subpaths/` bind, a local or CSI volume are not);
//! - containerd: `io.containerd.grpc.v1.cri/sandboxes/<SANDBOX>/{hosts,
//!   hostname,resolv.conf,shm}`, `io.containerd.grpc.v1.cri/containers/<ID>/...`;
//! - podman: `storage/overlay-containers/<ID or INFRA>/userdata/...`.
//!
//! The ids are the engine's: the container's id from its command line, a
//! sandbox's only when it has containerd's shape and names a container
//! this runtime made under its own `--root` (an annotation can be a pod
//! author's: podman copies a kube yaml's into the spec), the pod's uid
//! from `linux.cgroupsPath` and only with a UUID's shape. The path judged
//! is the source's origin (`substrat_sandbox::mount_origin`), not the path
//! it was reached by.

use std::collections::BTreeMap;
use std::path::{Component, Path};

/// The annotations that may name the container's sandbox (containerd's
/// CRI) or its pod's infra container (podman, CRI-O's name).
const SANDBOX_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri-o.SandboxID",
];

/// The kubelet's per-pod volumes, written by the kubelet itself.
const KUBELET_VOLUMES: [&str; 5] = [
    "kubernetes.io~empty-dir",
    "kubernetes.io~secret",
    "kubernetes.io~configmap",
    "kubernetes.io~projected",
    "kubernetes.io~downward-api",
];

/// The files containerd's CRI makes in a sandbox's directory.
const SANDBOX_FILES: [&str; 4] = ["hosts", "hostname", "resolv.conf", "shm"];

/// The ids that make an engine's file the container's own.
#[derive(Debug, Clone, Default)]
pub struct OwnIds {
    /// The container's id (the engine's command line).
    pub container: String,
    /// Its sandbox's or pod infra container's, checked against our state.
    pub sandboxes: Vec<String>,
    /// Its pod's uid (a UUID, from `linux.cgroupsPath`).
    pub pod: Option<String>,
}

impl OwnIds {
    /// The ids of container `id`: the annotated sandboxes that this
    /// runtime made under `state_root` (none without one), the pod's
    /// uid when `pod` has a UUID's shape.
    pub fn new(
        id: &str,
        annotations: &BTreeMap<String, String>,
        pod: Option<String>,
        state_root: Option<&Path>,
    ) -> Self {
        let sandboxes = SANDBOX_ANNOTATIONS
            .iter()
            .filter_map(|k| annotations.get(*k))
            .filter(|sid| is_engine_id(sid) && sid.as_str() != id)
            .filter(|sid| state_root.is_some_and(|root| ours(root, sid)))
            .cloned()
            .collect();
        Self {
            container: id.to_string(),
            sandboxes,
            pod: pod.filter(|uid| is_uuid(uid)),
        }
    }

    fn is_container_or_sandbox(&self, name: &str) -> bool {
        (!self.container.is_empty() && name == self.container)
            || self.sandboxes.iter().any(|s| s == name)
    }

    /// Whether `origin` (absolute, where the object really is) is one of
    /// the container's own engine files, by the exact layouts above.
    pub fn owns(&self, origin: &Path) -> bool {
        let Some(parts) = normal_parts(origin) else {
            return false;
        };
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        match parts.as_slice() {
            ["var", "lib", "kubelet", "pods", pod, rest @ ..] => {
                self.pod.as_deref() == Some(*pod) && kubelet_own(rest)
            }
            [
                "var",
                "lib",
                "containerd",
                "io.containerd.grpc.v1.cri",
                rest @ ..,
            ]
            | ["run", "containerd", "io.containerd.grpc.v1.cri", rest @ ..] => match rest {
                ["sandboxes", sid, file] => {
                    self.is_container_or_sandbox(sid) && SANDBOX_FILES.contains(file)
                }
                ["containers", cid, _, ..] => *cid == self.container,
                _ => false,
            },
            [
                "var",
                "lib",
                "containers",
                "storage",
                "overlay-containers",
                cid,
                "userdata",
                ..,
            ]
            | [
                "run",
                "containers",
                "storage",
                "overlay-containers",
                cid,
                "userdata",
                ..,
            ] => self.is_container_or_sandbox(cid),
            _ => false,
        }
    }
}

fn kubelet_own(rest: &[&str]) -> bool {
    match rest {
        ["etc-hosts"] => true,
        ["containers", _, _] => true,
        ["volumes", kind, _, ..] => KUBELET_VOLUMES.contains(kind),
        _ => false,
    }
}

/// The components of an absolute path, none of them `..` or `.`.
fn normal_parts(path: &Path) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => parts.push(name.to_str()?.to_string()),
            _ => return None,
        }
    }
    path.is_absolute().then_some(parts)
}

/// containerd's and podman's container ids: 64 lowercase hex digits.
pub fn is_engine_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A pod's uid: `8-4-4-4-12` hex digits.
pub fn is_uuid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether this runtime made container `id` under `root`: its state
/// directory holds its record, naming it.
fn ours(root: &Path, id: &str) -> bool {
    crate::state::load(root, id).is_ok_and(|(_, record)| record.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDBOX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const POD: &str = "5e0c1b2a-1111-4222-8333-944455556666";
    const CTR: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn ids() -> OwnIds {
        OwnIds {
            container: CTR.into(),
            sandboxes: vec![SANDBOX.into()],
            pod: Some(POD.into()),
        }
    }

    /// Attacker's review of hostsock (issue 44, CRITICAL): "own" was any
    /// component below an engine place named like an id, so the kubelet's
    /// subPath bind of a hostPath `/` at `volume-subpaths/` (and a local
    /// or CSI volume under the pod's directory) was the pod's own,
    /// idmapped: host root on host /etc.
    #[test]
    fn atk_only_exact_layouts_are_own() {
        let pod = format!("/var/lib/kubelet/pods/{POD}");
        let cri = "io.containerd.grpc.v1.cri";
        for own in [
            format!("{pod}/etc-hosts"),
            format!("{pod}/containers/app/0"),
            format!("{pod}/volumes/kubernetes.io~empty-dir/cache"),
            format!("{pod}/volumes/kubernetes.io~empty-dir/cache/sub"),
            format!("{pod}/volumes/kubernetes.io~projected/kube-api-access-x"),
            format!("/var/lib/containerd/{cri}/sandboxes/{SANDBOX}/hosts"),
            format!("/run/containerd/{cri}/sandboxes/{SANDBOX}/shm"),
            format!("/var/lib/containerd/{cri}/containers/{CTR}/volumes/v"),
            format!("/var/lib/containers/storage/overlay-containers/{SANDBOX}/userdata/hosts"),
            format!("/run/containers/storage/overlay-containers/{CTR}/userdata/shm"),
        ] {
            assert!(ids().owns(Path::new(&own)), "{own} is not own");
        }
        for stranger in [
            format!("{pod}/volume-subpaths/vol/ctr/0"),
            format!("{pod}/volumes/kubernetes.io~local-volume/pv"),
            format!("{pod}/volumes/kubernetes.io~csi/pv/mount"),
            format!("{pod}/volumes/kubernetes.io~host-path/h"),
            format!("{pod}/plugins/x"),
            format!("{pod}/containers/app/0/x"),
            format!("{pod}/etc-hosts/../volumes"),
            pod.clone(),
            "/var/lib/kubelet/pods/11111111-2222-4333-8444-555566667777/etc-hosts".into(),
            format!("/var/lib/containerd/{cri}/sandboxes/{SANDBOX}"),
            format!("/var/lib/containerd/{cri}/sandboxes/{SANDBOX}/other"),
            format!("/var/lib/containerd/{cri}/containers/{SANDBOX}/volumes/v"),
            format!("/var/lib/containerd/x/{SANDBOX}/hosts"),
            format!("/var/lib/containers/storage/overlay-containers/{SANDBOX}/config.json"),
            "/var/lib/containers/storage/overlay-containers/ffff/userdata/hosts".into(),
            format!("/data/{SANDBOX}/userdata/hosts"),
        ] {
            assert!(!ids().owns(Path::new(&stranger)), "{stranger} is own");
        }
    }

    fn record(root: &Path, id: &str) {
        let record = crate::state::Record {
            id: id.into(),
            bundle: "/b".into(),
            pid: 1,
            pid_start: 1,
            created: 0,
            annotations: BTreeMap::new(),
            notes: Vec::new(),
            policies: Vec::new(),
        };
        crate::state::make_dir(root, id, &record).expect("record");
    }

    /// Attacker's review (HIGH): podman copies a kube yaml's annotations
    /// into the spec, so `io.kubernetes.cri.sandbox-id: overlay-containers`
    /// made podman's whole state directory own. A sandbox id counts only
    /// with containerd's shape and when this runtime made it.
    #[test]
    fn atk_an_annotated_sandbox_counts_only_when_it_is_ours() {
        let root = std::env::temp_dir().join(format!("substrat-own-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        record(&root, SANDBOX);
        let other = "a".repeat(64);
        for (key, value, counted) in [
            ("io.kubernetes.cri.sandbox-id", SANDBOX, true),
            ("io.kubernetes.cri-o.SandboxID", SANDBOX, true),
            ("io.kubernetes.cri.sandbox-id", "overlay-containers", false),
            ("io.kubernetes.cri.sandbox-id", other.as_str(), false),
            (
                "io.kubernetes.cri.sandbox-id",
                &SANDBOX.to_uppercase(),
                false,
            ),
            ("io.kubernetes.pod.uid", SANDBOX, false),
        ] {
            let annotations = [(key.to_string(), value.to_string())].into_iter().collect();
            let ids = OwnIds::new(CTR, &annotations, None, Some(&root));
            assert_eq!(ids.sandboxes.len(), usize::from(counted), "{key}={value}");
            let hosts =
                format!("/var/lib/containers/storage/overlay-containers/{value}/userdata/hosts");
            assert_eq!(ids.owns(Path::new(&hosts)), counted, "{hosts}");
        }
        let annotations = [(
            "io.kubernetes.cri.sandbox-id".to_string(),
            SANDBOX.to_string(),
        )];
        let no_root = OwnIds::new(CTR, &annotations.into_iter().collect(), None, None);
        assert!(no_root.sandboxes.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_pod_uid_must_be_a_uuid() {
        for (uid, kept) in [
            (POD, true),
            ("storage", false),
            ("5e0c1b2a11114222833394445555666612", false),
            ("5e0c1b2a-1111-4222-8333-94445555666g", false),
        ] {
            let ids = OwnIds::new(CTR, &BTreeMap::new(), Some(uid.into()), None);
            assert_eq!(ids.pod.is_some(), kept, "{uid}");
        }
    }
}
