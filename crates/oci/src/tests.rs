//! The translation as a whole: a configuration like the ones engines write,
//! its whole plan compared; then each refusal, by the field it names.

use std::path::Path;

use serde_json::{Value, json};

use crate::spec::parse;
use crate::translate::{HostIds, Translated, Unsupported, translate};

const IDS: HostIds = HostIds {
    uid: 200_000,
    gid: 200_000,
};

/// A configuration close to what podman and containerd write.
pub(crate) fn engine_config() -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 1000, "gid": 1000, "umask": 18, "additionalGids": [1000]},
            "args": ["/bin/sh", "-c", "echo hi"],
            "env": ["PATH=/usr/bin:/bin", "HOSTNAME=box"],
            "cwd": "/home/app",
            "capabilities": {"bounding": ["CAP_CHOWN"], "effective": ["CAP_CHOWN"]},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 1024}],
            "oomScoreAdj": 0
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "box",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance"]},
            {"destination": "/dev/shm", "type": "bind", "source": "/var/lib/shm", "options": ["bind", "rprivate", "nosuid", "noexec", "nodev"]},
            {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/c/hosts", "options": ["bind", "rprivate", "ro"]},
            {"destination": "/data", "source": "/srv/data", "options": ["rbind", "rw"]},
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rprivate", "nosuid", "noexec", "nodev", "relatime", "ro"]}
        ],
        "annotations": {"io.kubernetes.cri.container-type": "container"},
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "network"}],
            "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
            "resources": {
                "devices": [{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
                "memory": {"limit": 536870912},
                "cpu": {"quota": 50000, "period": 100000},
                "pids": {"limit": 64}
            },
            "cgroupsPath": "/kubepods/pod1/c1",
            "sysctl": {"net.ipv4.ping_group_range": "0 0"},
            "maskedPaths": ["/proc/kcore", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys"],
            "rootfsPropagation": "rprivate",
            "seccomp": {
                "defaultAction": "SCMP_ACT_ERRNO",
                "defaultErrnoRet": 1,
                "flags": ["SECCOMP_FILTER_FLAG_SPEC_ALLOW"],
                "syscalls": [{"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"}]
            }
        }
    })
}

pub(crate) fn translated(config: &Value) -> Result<Translated, Unsupported> {
    let bytes = serde_json::to_vec(config).expect("json");
    let spec = parse(&bytes).map_err(|e| Unsupported {
        field: "parse".into(),
        reason: e.to_string(),
    })?;
    translate(&spec, Path::new("/b"), IDS)
}

/// Sets `pointer` (a JSON pointer whose parent exists) in `config`.
fn with(mut config: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let object = config
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .expect("the parent exists");
    object.insert(key.to_string(), value);
    config
}

#[test]
fn an_engines_configuration_becomes_this_whole_plan() {
    let t = translated(&engine_config()).expect("translates");
    let expected: Value =
        serde_json::from_str(include_str!("../fixtures/engine_plan.json")).expect("fixture");
    assert_eq!(serde_json::to_value(&t.plan).expect("plan"), expected);
    assert_eq!(
        t.notes,
        [
            "process.capabilities: the container gets none",
            "process.noNewPrivileges: set anyway",
            "linux.namespaces: ipc, uts, user, cgroup made new too (never the host's)",
            "linux.uidMappings: only id 1000 is mapped (to an unprivileged host id)",
            "linux.sysctl: net.ipv4.ping_group_range left unset (no unprivileged ping)",
            "mounts[1]: /dev is the runtime's own (null, zero, full, random, urandom, tty, pts, shm; its size not limited)",
            "mounts[2]: /dev/pts comes with the runtime's /dev (its size not limited)",
            "mounts[3]: /dev/shm comes with the runtime's /dev (its size not limited)",
            "mounts[9]: /sys/fs/cgroup is an empty read-only directory (no cgroup is shown)",
            "linux.resources.devices: /dev holds only the runtime's harmless nodes",
            "linux.seccomp: substrat's default profile stacked on it (a syscall passes only when both allow it)",
            "process.rlimits[0]: RLIMIT_NOFILE hard limit set to the soft one",
        ]
    );
    assert_eq!(t.cgroups_path.as_deref(), Some("/kubepods/pod1/c1"));
}

#[test]
fn without_seccomp_the_default_profile_applies() {
    let mut config = engine_config();
    config["linux"]
        .as_object_mut()
        .expect("linux")
        .remove("seccomp");
    let t = translated(&config).expect("translates");
    let seccomp = t.plan.seccomp.expect("a filter");
    assert_eq!(seccomp.name, "default");
    assert!(!seccomp.profile.default_action.permits());
    assert!(t.plan.layers.is_empty(), "the default profile once");
}

#[test]
fn a_writable_root_is_writable_to_landlock_and_stays_writable() {
    let t = translated(&with(engine_config(), "/root/readonly", json!(false))).expect("translates");
    assert_eq!(
        serde_json::to_value(&t.plan.landlock.rules[0]).expect("rule"),
        json!({"path": "/", "access": "read-write-exec"})
    );
    assert!(
        !t.plan
            .mounts
            .contains(&substrat_sandbox::plan::MountStep::RootReadOnly)
    );
}

/// Each setting the runtime cannot honour, and the field its refusal names.
#[test]
fn what_cannot_be_honoured_is_refused_by_name() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/ociVersion", json!("2.0.0"), "ociVersion"),
        (
            "/hooks",
            json!({"prestart": [{"path": "/bin/true"}]}),
            "hooks",
        ),
        ("/domainname", json!("corp"), "domainname"),
        ("/windows", json!({}), "windows"),
        (
            "/process/consoleSize",
            json!({"height": 24, "width": 80}),
            "process.consoleSize",
        ),
        (
            "/linux/cgroupsPath",
            json!("machine.slice:libpod:c1"),
            "linux.cgroupsPath",
        ),
        (
            "/linux/cgroupsPath",
            json!("/kubepods/../c1"),
            "linux.cgroupsPath",
        ),
        ("/linux/cgroupsPath", json!("/"), "linux.cgroupsPath"),
        ("/process/args", json!([]), "process.args"),
        (
            "/process/apparmorProfile",
            json!("docker-default"),
            "process.apparmorProfile",
        ),
        (
            "/process/selinuxLabel",
            json!("system_u:system_r:container_t"),
            "process.selinuxLabel",
        ),
        ("/process/oomScoreAdj", json!(5000), "process.oomScoreAdj"),
        (
            "/linux/resources/cpu/cpus",
            json!("0-1"),
            "linux.resources.cpu",
        ),
        (
            "/linux/resources/memory/useHierarchy",
            json!(true),
            "linux.resources.memory",
        ),
        (
            "/process/scheduler",
            json!({"policy": "SCHED_FIFO"}),
            "process.scheduler",
        ),
        (
            "/process/execCPUAffinity",
            json!({"initial": "0"}),
            "process.execCPUAffinity",
        ),
        ("/process/user/umask", json!(0), "process.user.umask"),
        (
            "/process/rlimits",
            json!([{"type": "RLIMIT_RTPRIO", "hard": 1, "soft": 1}]),
            "process.rlimits[0]",
        ),
        ("/process/env", json!(["NOEQUALS"]), "process.env[0]"),
        ("/process/cwd", json!("relative"), "process.cwd"),
        (
            "/linux/namespaces",
            json!([{"type": "pid", "path": "/proc/1/ns/pid"}]),
            "linux.namespaces[pid].path",
        ),
        (
            "/linux/namespaces",
            json!([{"type": "time"}]),
            "linux.namespaces[time]",
        ),
        // No network namespace: the host's (hostNetwork).
        (
            "/linux/namespaces",
            json!([{"type": "pid"}, {"type": "mount"}]),
            "linux.namespaces",
        ),
        (
            "/linux/uidMappings",
            json!([{"containerID": 0, "hostID": 0, "size": 1}]),
            "linux.uidMappings",
        ),
        (
            "/linux/sysctl",
            json!({"net.ipv4.ip_forward": "1"}),
            "linux.sysctl[net.ipv4.ip_forward]",
        ),
        (
            "/linux/devices",
            json!([{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]),
            "linux.devices",
        ),
        (
            "/linux/maskedPaths",
            json!(["/proc/kcore", "proc/x"]),
            "linux.maskedPaths[1]",
        ),
        (
            "/linux/readonlyPaths",
            json!(["/proc/../etc"]),
            "linux.readonlyPaths[0]",
        ),
        (
            "/linux/rootfsPropagation",
            json!("shared"),
            "linux.rootfsPropagation",
        ),
        ("/linux/intelRdt", json!({"closID": "x"}), "linux.intelRdt"),
        (
            "/linux/seccomp/listenerPath",
            json!("/run/agent.sock"),
            "linux.seccomp",
        ),
        (
            "/linux/seccomp/flags",
            json!(["SECCOMP_FILTER_FLAG_LOG"]),
            "linux.seccomp.flags",
        ),
        (
            "/linux/resources/blockIO",
            json!({"weight": 10}),
            "linux.resources.blockIO",
        ),
        (
            "/linux/resources/unified",
            json!({"io.max": "1"}),
            "linux.resources.unified",
        ),
        (
            "/linux/resources/memory/swap",
            json!(1),
            "linux.resources.memory",
        ),
    ];
    for (pointer, value, field) in cases {
        let refused = translated(&with(engine_config(), pointer, value))
            .expect_err(&format!("{pointer} accepted"));
        assert_eq!(refused.field, field, "{pointer}: {refused}");
    }
}

#[test]
fn mounts_the_runtime_cannot_make_are_refused_by_index() {
    let cases = [
        json!({"destination": "/x", "type": "overlay", "source": "overlay"}),
        json!({"destination": "/dev/x", "type": "devtmpfs", "source": "devtmpfs"}),
        json!({"destination": "/sys", "type": "sysfs", "options": ["rw", "exec"]}),
        json!({"destination": "/x", "type": "bind", "source": "/srv", "options": ["rbind", "noexec"]}),
        json!({"destination": "/x", "type": "bind", "source": "/etc/passwd", "options": ["rbind", "noexec"]}),
        json!({"destination": "/x", "type": "tmpfs", "options": ["size=50%"]}),
        json!({"destination": "/x", "type": "tmpfs", "options": ["mode=999"]}),
        json!({"destination": "relative", "type": "tmpfs"}),
        json!({"destination": "/a/../b", "type": "tmpfs"}),
        json!({"destination": "/x", "type": "bind", "source": "relative", "options": ["bind"]}),
        json!({"destination": "/", "type": "bind", "source": "/", "options": ["rbind"]}),
        json!({"destination": "/x", "type": "bind", "options": ["bind"]}),
        json!({"destination": "/x", "type": "bind", "source": "/srv", "options": ["bind"], "uidMappings": []}),
    ];
    for mount in cases {
        let mut config = engine_config();
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(mount.clone());
        let refused = translated(&config).expect_err(&format!("{mount} accepted"));
        assert_eq!(refused.field, "mounts[10]", "{mount}: {refused}");
    }
}

#[test]
fn fields_the_runtime_has_never_heard_of_are_refused() {
    for pointer in [
        "/linux/newThing",
        "/process/user/newThing",
        "/root/newThing",
        "/newThing",
    ] {
        let config = with(engine_config(), pointer, json!(1));
        let refused = translated(&config).expect_err(&format!("{pointer} accepted"));
        assert!(
            refused.reason.contains("unknown field `newThing`"),
            "{pointer}: {refused}"
        );
    }
}

#[test]
fn an_engines_namespaces_are_joined_and_what_needs_its_own_is_empty() {
    let namespaces = json!([
        {"type": "pid"}, {"type": "mount"},
        {"type": "network", "path": "/proc/42/ns/net"},
        {"type": "ipc", "path": "/proc/42/ns/ipc"},
        {"type": "uts", "path": "/proc/42/ns/uts"}
    ]);
    let t =
        translated(&with(engine_config(), "/linux/namespaces", namespaces)).expect("translates");
    assert_eq!(
        serde_json::to_value(&t.plan.joined).expect("joined"),
        json!([
            {"kind": "net", "path": "/proc/42/ns/net"},
            {"kind": "ipc", "path": "/proc/42/ns/ipc"},
            {"kind": "uts", "path": "/proc/42/ns/uts"}
        ])
    );
    let ns = t.plan.namespaces;
    assert!(ns.user && ns.mount && ns.pid && !ns.net && !ns.ipc && !ns.uts);
    use substrat_sandbox::plan::MountStep;
    assert!(t.plan.mounts.contains(&MountStep::Empty {
        target: "/sys".into()
    }));
    assert!(t.plan.mounts.contains(&MountStep::Empty {
        target: "/dev/mqueue".into()
    }));
    assert!(t.notes.contains(
        &"/sys is an empty read-only directory (the network namespace is the engine's)".to_string()
    ));
    // The cgroup directory would be made in the empty /sys: not mounted.
    assert!(!t.plan.mounts.contains(&MountStep::Empty {
        target: "/sys/fs/cgroup".into()
    }));
    assert!(
        t.notes
            .contains(&"/sys/fs/cgroup: not mounted, /sys is empty".to_string())
    );
}

#[test]
fn the_oom_adjustment_is_kept_but_never_below_zero() {
    let raised =
        translated(&with(engine_config(), "/process/oomScoreAdj", json!(500))).expect("translates");
    assert_eq!(raised.plan.oom_score_adj, Some(500));
    let favoured = translated(&with(engine_config(), "/process/oomScoreAdj", json!(-997)))
        .expect("translates");
    assert_eq!(
        favoured.plan.oom_score_adj,
        Some(0),
        "written, so the engine's is not inherited"
    );
    assert!(
        favoured
            .notes
            .contains(&"process.oomScoreAdj: -997 raised to 0".to_string())
    );
}

/// What containerd's CRI writes for every pod: a weight, a swap limit equal
/// to the memory limit, hugepage limits of 0, the image's groups, a quota
/// without a period. Accepted; what is not applied is said.
#[test]
fn a_pods_resources_are_accepted_and_what_is_not_applied_is_said() {
    let mut config = engine_config();
    config["process"]["user"]["additionalGids"] = json!([1000, 4, 24]);
    config["linux"]["resources"] = json!({
        "memory": {"limit": 268435456, "swap": 268435456},
        "cpu": {"shares": 2, "quota": 10000},
        "hugepageLimits": [{"pageSize": "2MB", "limit": 0}]
    });
    let t = translated(&config).expect("translates");
    assert_eq!(t.plan.cgroup.memory_max, Some(268_435_456));
    assert_eq!(
        t.plan.cgroup.cpu_max,
        Some(0.1),
        "the default period is 100 ms"
    );
    for said in [
        "process.user.additionalGids: not given (the container maps one gid)",
        "linux.resources.cpu.shares 2: not applied (the default weight is kept)",
        "linux.resources.hugepageLimits of 0: not applied (no hugetlb limit is set)",
        "linux.resources.memory.swap: no swap beyond the limit on cgroup v2 (memory.swap.max = 0); not set on v1",
    ] {
        assert!(
            t.notes.contains(&said.to_string()),
            "{said}: {:#?}",
            t.notes
        );
    }
    let mut config = engine_config();
    config["linux"]["resources"] =
        json!({"hugepageLimits": [{"pageSize": "2MB", "limit": 2097152}]});
    let refused = translated(&config).expect_err("a hugepage limit is not applied");
    assert_eq!(refused.field, "linux.resources.hugepageLimits");
}

// A policy on top (`layer`): the engine's configuration with `worker`.

fn worker() -> substrat_policy::LoadedPolicy {
    substrat_policy::load_builtin("worker", &Default::default())
        .expect("built in")
        .expect("loads")
}

#[test]
fn worker_on_top_of_an_engines_configuration_changes_exactly_this() {
    use crate::layer::{PolicyPaths, apply_policy};
    use substrat_policy::model::LandlockMode;
    use substrat_sandbox::plan::{
        LandlockAccess, LandlockRule, MountStep, RlimitKind, RlimitSetting,
    };

    let config = with(
        engine_config(),
        "/linux/namespaces",
        json!([{"type": "pid"}, {"type": "mount"}, {"type": "network", "path": "/run/netns/pod"}]),
    );
    let spec = parse(&serde_json::to_vec(&config).expect("json")).expect("parses");
    let before = translate(&spec, Path::new("/b"), IDS).expect("translates");
    let paths = PolicyPaths::of(&spec).expect("paths");
    assert_eq!(
        paths,
        PolicyPaths {
            workspace: "/home/app".into(),
            home: "/".into(),
            granted: Vec::new(),
        }
    );
    let mut after = before.clone();
    apply_policy(&mut after, &worker(), &paths).expect("applies");

    let mut expected = before.clone();
    // network = "none": the pod's network is not joined.
    expected.plan.joined.clear();
    expected.plan.namespaces.net = true;
    // ipc and uts of its own were already the container's.
    // Protected paths in the one writable volume, right after it.
    let data = expected
        .plan
        .mounts
        .iter()
        .position(|m| matches!(m, MountStep::Bind { target, .. } if target == Path::new("/data")))
        .expect("the volume");
    let protected = [
        (".cursor", true),
        (".git/hooks", true),
        (".git/config", false),
    ];
    for (offset, (relative, dir)) in protected.into_iter().enumerate() {
        let step = MountStep::Protect {
            source: "/srv/data".into(),
            target: "/data".into(),
            relative: relative.into(),
            dir,
        };
        expected.plan.mounts.insert(data + 1 + offset, step);
    }
    // The lower limits: nofile stays 1024, worker adds core, fsize; the
    // cgroup keeps 64 pids and 512 MiB, its CPU (0.5) below worker's 2.
    expected.plan.rlimits = vec![
        RlimitSetting {
            kind: RlimitKind::Nofile,
            value: 1024,
        },
        RlimitSetting {
            kind: RlimitKind::Core,
            value: 0,
        },
        RlimitSetting {
            kind: RlimitKind::Fsize,
            value: 8 << 30,
        },
    ];
    expected.plan.policy_name = "config.json+worker".into();
    expected.notes.extend([
        "policy worker: a network namespace of the container's own, not the engine's".to_string(),
        "policy worker: 3 protected path(s) kept read-only in the container's writable binds".into(),
        "policy worker: its Landlock rules and seccomp filter stacked on the container's; its [env], [mcp] and [tools] do not apply to a container".into(),
    ]);
    let layer = after.plan.layers.last().expect("a layer").clone();
    expected.plan.layers.push(layer.clone());
    assert_eq!(after, expected);

    // The layer: worker's filter, and its file rules on the container's
    // paths (the workspace is the working directory).
    assert_eq!(layer.policy_name, "worker");
    assert_eq!(
        layer.seccomp.as_ref().map(|s| s.name.as_str()),
        Some("default")
    );
    assert_eq!(layer.landlock.mode, LandlockMode::Required);
    let rule = |path: &str, access| LandlockRule {
        path: path.into(),
        access,
    };
    let ro = LandlockAccess::ReadExec;
    assert_eq!(
        layer.landlock.rules,
        vec![
            rule("/usr", ro),
            rule("/bin", ro),
            rule("/sbin", ro),
            rule("/lib", ro),
            rule("/lib64", ro),
            rule("/tmp", LandlockAccess::ReadWriteExec),
            rule("/etc/alternatives", ro),
            rule("/etc/ld.so.cache", ro),
            rule("/etc/localtime", ro),
            rule("/home/app", LandlockAccess::ReadWriteExec),
            rule("/etc/ssl/certs", ro),
            rule("/", LandlockAccess::ListDirs),
            rule("/dev", LandlockAccess::Device),
            rule("/proc", LandlockAccess::Proc),
        ]
    );
}

#[test]
fn a_workspace_annotation_must_be_a_clean_project_path() {
    use crate::layer::PolicyPaths;
    let cases = [
        ("/srv/ws", true),
        ("/usr/src/app", true),
        ("srv/ws", false),
        ("/srv/../etc", false),
        // Writable to the policy: never the whole image or its system.
        ("/", false),
        ("/etc/app", false),
        ("/usr", false),
    ];
    for (value, ok) in cases {
        let config = with(
            engine_config(),
            "/annotations",
            json!({"io.substrat.workspace": value}),
        );
        let spec = parse(&serde_json::to_vec(&config).expect("json")).expect("parses");
        let paths = PolicyPaths::of(&spec);
        assert_eq!(paths.is_ok(), ok, "{value}: {paths:?}");
        if let Err(e) = paths {
            assert_eq!(e.field, "annotations.io.substrat.workspace");
        }
    }
}

#[test]
fn a_terminal_is_the_commands_controlling_terminal() {
    let config = with(engine_config(), "/process/terminal", json!(true));
    let config = with(
        config,
        "/process/consoleSize",
        json!({"height": 40, "width": 120}),
    );
    let t = translated(&config).expect("translates");
    assert!(t.plan.terminal);
    assert!(
        !translated(&engine_config())
            .expect("translates")
            .plan
            .terminal
    );
    let huge = with(
        config,
        "/process/consoleSize",
        json!({"height": 70000, "width": 80}),
    );
    let refused = translated(&huge).expect_err("a terminal of 70,000 lines");
    assert_eq!(refused.field, "process.consoleSize");
}

#[test]
fn an_execs_terminal_and_console_socket_must_agree() {
    let t = translated(&engine_config()).expect("translates");
    let mut process = parse(&serde_json::to_vec(&engine_config()).expect("json"))
        .expect("parses")
        .process
        .expect("a process");
    let request = crate::exec::exec_request(&process, &t.plan, false, &mut Vec::new());
    assert!(!request.expect("no terminal").terminal);
    let refused = crate::exec::exec_request(&process, &t.plan, true, &mut Vec::new())
        .expect_err("a console socket without a terminal");
    assert_eq!(refused.field, "process.terminal");
    process.terminal = true;
    let refused = crate::exec::exec_request(&process, &t.plan, false, &mut Vec::new())
        .expect_err("a terminal without a console socket");
    assert_eq!(refused.field, "process.terminal");
    let request = crate::exec::exec_request(&process, &t.plan, true, &mut Vec::new());
    assert!(request.expect("a terminal").terminal);
}
