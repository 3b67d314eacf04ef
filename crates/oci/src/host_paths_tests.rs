//! The host path rules, judged on paths as given (issue 44).
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

/// A container of sandbox `SANDBOX` (checked against the state by
/// `OwnIds::new`, given here) in pod `POD_UID`.
fn rules(allowed: &[&str]) -> HostPathRules {
    let mut rules = HostPathRules::new(
        &allowed.iter().map(PathBuf::from).collect::<Vec<_>>(),
        "c0ffee",
        &Default::default(),
        Some(&format!("/kubepods/besteffort/pod{POD_UID}/c0ffee")),
        None,
    );
    rules.own.sandboxes = vec![SANDBOX.to_string()];
    rules
}

/// Issue 44: a pod's annotations (passed through by the handler's
/// `pod_annotations`) naming another pod's uid made that pod's volumes
/// "the container's own". The uid is the engine's cgroup path's only.
#[test]
fn atk_a_pod_uid_annotation_does_not_make_another_pods_volumes_own() {
    let other = "11111111-2222-4333-8444-555566667777";
    let annotations = ["io.kubernetes.pod.uid", "io.kubernetes.cri.sandbox-uid"]
        .map(|k| (k.to_string(), other.to_string()))
        .into_iter()
        .collect();
    let volume = format!("/var/lib/kubelet/pods/{other}/volumes/kubernetes.io~empty-dir/x");
    let own = format!("/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/x");
    let cgroups = format!("/kubepods/besteffort/pod{POD_UID}/c0ffee");
    let rules = HostPathRules::new(&[], "c0ffee", &annotations, Some(&cgroups), None);
    assert!(rules.judge(Path::new(&volume), false).is_some(), "{volume}");
    assert!(rules.judge(Path::new(&own), false).is_none(), "{own}");
    // No cgroup path: no pod is the container's.
    let rules = HostPathRules::new(&[], "c0ffee", &annotations, None, None);
    assert!(rules.judge(Path::new(&own), false).is_some(), "{own}");
}

#[test]
fn the_pod_uid_is_read_from_the_engines_cgroup_path() {
    let uid = "5e0c1b2a-1111-4222-8333-944455556666";
    for (path, expected) in [
        (format!("/kubepods/besteffort/pod{uid}/abc"), Some(uid)),
        (format!("kubepods/pod{uid}/abc"), Some(uid)),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice:cri-containerd:abc",
                uid.replace('-', "_")
            ),
            Some(uid),
        ),
        ("/substrat-cri/abc".into(), None),
        ("/kubepods/pod/abc".into(), None),
        ("".into(), None),
    ] {
        assert_eq!(
            pod_uid_of_cgroups_path(&path).as_deref(),
            expected,
            "{path}"
        );
    }
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

/// Attacker's review (finding 4): a bind translation drops (the runtime's
/// /dev has its own /dev/shm) was judged all the same, so a podman pod's
/// member, whose /dev/shm is the infra container's `userdata/shm`, was
/// refused. What is never mounted is not judged; what is, still is.
#[test]
fn a_mount_translation_drops_is_not_judged() {
    let shm = bind("/dev/shm", "/dev/shm", false);
    assert!(crate::mounts::dropped(&shm));
    assert!(refuse_protected_binds(&[shm], &rules(&[])).is_ok());
    let elsewhere = bind("/dev/shm", "/shm", false);
    assert!(!crate::mounts::dropped(&elsewhere));
    let err = refuse_protected_binds(&[elsewhere], &rules(&[])).expect_err("/dev/shm at /shm");
    assert_eq!(err.field, "mounts[0]");
}
