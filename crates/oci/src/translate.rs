//! A bundle's configuration as a launch plan: the same `LaunchPlan` a
//! policy produces, applied by the same native backend. Pure.
//!
//! Where the configuration and this runtime's walls disagree the stricter
//! one wins, and `Translated::stricter` says so: the container always gets
//! its own user, mount, pid, ipc, uts and network namespaces, no
//! capability, no_new_privs, a seccomp filter (the configuration's, or the
//! default profile), Landlock rules mirroring its mounts, and one id inside
//! mapped to one unprivileged id outside. What the configuration asks and
//! the runtime cannot do is refused with the field's name, never dropped.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;
use substrat_policy::model::{LandlockMode, LimitEnforcement};
use substrat_policy::seccomp::SeccompProfile;
use substrat_sandbox::plan::{
    Access, CgroupLimits, IdMap, JoinedKind, JoinedNamespace, LaunchPlan, MountStep, Namespaces,
    RlimitKind, RlimitSetting, SeccompPlan, SocketFamily, landlock_plan,
};

use crate::spec::{Linux, Mount, Process, Resources, Spec};

/// What the runtime-spec asks that this runtime does not do.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Unsupported {
    /// The configuration's field, as a JSON path (`linux.sysctl`).
    pub field: String,
    pub reason: String,
}

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> Unsupported {
    Unsupported {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Who the container runs as on the host: the one id its user maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
}

/// The plan, and where it is stricter than the configuration asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub plan: LaunchPlan,
    pub stricter: Vec<String>,
    /// `linux.cgroupsPath`, as the configuration gave it.
    pub cgroups_path: Option<String>,
}

/// The default profile's name when the configuration has no seccomp.
const DEFAULT_PROFILE: &str = "default";

/// The plan for running the bundle at `bundle` with `spec`.
pub fn translate(spec: &Spec, bundle: &Path, ids: HostIds) -> Result<Translated, Unsupported> {
    refuse_unsupported_top(spec)?;
    let process = spec
        .process
        .as_ref()
        .ok_or_else(|| refuse("process", "a container needs a process to run"))?;
    let linux = spec
        .linux
        .as_ref()
        .ok_or_else(|| refuse("linux", "a Linux container needs its `linux` section"))?;
    let root = spec
        .root
        .as_ref()
        .ok_or_else(|| refuse("root", "a container needs a root filesystem"))?;
    let mut stricter = Vec::new();
    check_process(process, &mut stricter)?;
    check_linux(linux, process, &mut stricter)?;
    let rootfs = bundle.join(&root.path);
    let joined = joined_namespaces(linux)?;
    let mut mounts = mount_steps(&rootfs, &spec.mounts, &mut stricter)?;
    without_owned_filesystems(&mut mounts, &joined, &mut stricter);
    drop_below_empty(&mut mounts, &mut stricter);
    mounts.extend(path_steps(linux)?);
    if root.readonly {
        mounts.push(MountStep::RootReadOnly);
    }
    let resources = linux.resources.as_ref();
    if resources.is_some_and(|r| r.devices.iter().any(|d| d.allow)) {
        stricter
            .push("linux.resources.devices: /dev holds only the runtime's harmless nodes".into());
    }
    let plan = LaunchPlan {
        policy_name: "config.json".into(),
        namespaces: Namespaces {
            user: true,
            mount: true,
            pid: true,
            ipc: !joins(&joined, JoinedKind::Ipc),
            uts: !joins(&joined, JoinedKind::Uts),
            net: !joins(&joined, JoinedKind::Net),
            nested_userns: false,
            cgroup: true,
        },
        uid_map: IdMap {
            inside: process.user.uid,
            outside: ids.uid,
        },
        gid_map: IdMap {
            inside: process.user.gid,
            outside: ids.gid,
        },
        hostname: spec.hostname.clone().unwrap_or_else(|| "substrat".into()),
        landlock: landlock_plan(
            LandlockMode::Required,
            &landlock_view(&mounts, root.readonly),
        ),
        seccomp: Some(seccomp_plan(linux.seccomp.as_ref(), bundle)?),
        rlimits: rlimits(process, &mut stricter)?,
        cgroup: cgroup_limits(resources)?,
        env: environment(&process.env)?,
        cwd: absolute("process.cwd", &process.cwd)?,
        argv: process.args.clone(),
        mounts,
        proxy: None,
        gateway: None,
        terminal: false,
        overlay: None,
        joined,
    };
    Ok(Translated {
        plan,
        stricter,
        cgroups_path: linux.cgroups_path.clone(),
    })
}

fn refuse_unsupported_top(spec: &Spec) -> Result<(), Unsupported> {
    if !spec.oci_version.starts_with("1.") {
        return Err(refuse(
            "ociVersion",
            format!("`{}` is not a runtime-spec 1.x version", spec.oci_version),
        ));
    }
    for (field, present) in [
        ("windows", spec.windows.is_some()),
        ("solaris", spec.solaris.is_some()),
        ("vm", spec.vm.is_some()),
        ("zos", spec.zos.is_some()),
    ] {
        if present {
            return Err(refuse(field, "only Linux containers run here"));
        }
    }
    if spec.hooks.as_ref().is_some_and(not_empty) {
        return Err(refuse(
            "hooks",
            "hooks are not run by this runtime (they would run on the host, outside every wall)",
        ));
    }
    if spec.domainname.as_deref().is_some_and(|d| !d.is_empty()) {
        return Err(refuse(
            "domainname",
            "setting a NIS domain name is not supported",
        ));
    }
    Ok(())
}

/// A JSON value that asks for something: not null, not an empty object or list.
fn not_empty(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Object(map) => !map.is_empty(),
        Value::Array(list) => !list.is_empty(),
        _ => true,
    }
}

fn check_process(process: &Process, stricter: &mut Vec<String>) -> Result<(), Unsupported> {
    if process.terminal || process.console_size.is_some() {
        return Err(refuse(
            "process.terminal",
            "a terminal for the container (--console-socket) is not supported yet",
        ));
    }
    if process.args.is_empty() {
        return Err(refuse("process.args", "a container needs a command"));
    }
    let unsupported = [
        ("process.commandLine", process.command_line.is_some()),
        (
            "process.ioPriority",
            process.io_priority.as_ref().is_some_and(not_empty),
        ),
        (
            "process.scheduler",
            process.scheduler.as_ref().is_some_and(not_empty),
        ),
        (
            "process.execCPUAffinity",
            process.exec_cpu_affinity.as_ref().is_some_and(not_empty),
        ),
        ("process.user.username", process.user.username.is_some()),
        (
            "process.apparmorProfile",
            process
                .apparmor_profile
                .as_deref()
                .is_some_and(|p| !p.is_empty()),
        ),
        (
            "process.selinuxLabel",
            process
                .selinux_label
                .as_deref()
                .is_some_and(|l| !l.is_empty()),
        ),
        (
            "process.oomScoreAdj",
            process.oom_score_adj.is_some_and(|a| a != 0),
        ),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, asked)| *asked) {
        return Err(refuse(*field, "not supported by this runtime"));
    }
    if process.user.umask.is_some_and(|m| m != 0o022) {
        return Err(refuse(
            "process.user.umask",
            "only the umask 0022 is supported",
        ));
    }
    if process
        .user
        .additional_gids
        .iter()
        .any(|g| *g != process.user.gid)
    {
        return Err(refuse(
            "process.user.additionalGids",
            "the container runs as one uid and one gid; other groups cannot be mapped",
        ));
    }
    if let Some(caps) = &process.capabilities {
        let asked = [
            &caps.bounding,
            &caps.effective,
            &caps.permitted,
            &caps.inheritable,
            &caps.ambient,
        ];
        if asked.iter().any(|set| !set.is_empty()) {
            stricter.push("process.capabilities: the container gets none".into());
        }
    }
    if !process.no_new_privileges {
        stricter.push("process.noNewPrivileges: set anyway".into());
    }
    Ok(())
}

fn check_linux(
    linux: &Linux,
    process: &Process,
    stricter: &mut Vec<String>,
) -> Result<(), Unsupported> {
    for ns in &linux.namespaces {
        let joinable = matches!(ns.kind.as_str(), "network" | "ipc" | "uts");
        if ns.path.is_some() && !joinable {
            return Err(refuse(
                format!("linux.namespaces[{}].path", ns.kind),
                "joining an existing namespace of this type is not supported (network, ipc and uts are)",
            ));
        }
        match ns.kind.as_str() {
            "pid" | "network" | "mount" | "ipc" | "uts" | "user" | "cgroup" => {}
            other => {
                return Err(refuse(
                    format!("linux.namespaces[{other}]"),
                    "this namespace type is not supported",
                ));
            }
        }
    }
    let asked: Vec<&str> = linux.namespaces.iter().map(|n| n.kind.as_str()).collect();
    let unasked: Vec<&str> = ["pid", "network", "mount", "ipc", "uts", "user", "cgroup"]
        .into_iter()
        .filter(|kind| !asked.contains(kind))
        .collect();
    if !unasked.is_empty() {
        stricter.push(format!(
            "linux.namespaces: {} made new too (never the host's)",
            unasked.join(", ")
        ));
    }
    check_id_mappings(linux, process, stricter)?;
    check_sysctl(linux, stricter)?;
    if let Some(path) = &linux.cgroups_path {
        stricter.push(format!(
            "linux.cgroupsPath {path}: not used; the container's groups are made below the launcher's own (substrat-ID-PID)"
        ));
    }
    let unsupported = [
        (
            "linux.timeOffsets",
            linux.time_offsets.as_ref().is_some_and(not_empty),
        ),
        ("linux.devices", !linux.devices.is_empty()),
        (
            "linux.mountLabel",
            linux.mount_label.as_deref().is_some_and(|l| !l.is_empty()),
        ),
        (
            "linux.intelRdt",
            linux.intel_rdt.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.personality",
            linux.personality.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.memoryPolicy",
            linux.memory_policy.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.netDevices",
            linux.net_devices.as_ref().is_some_and(not_empty),
        ),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, asked)| *asked) {
        return Err(refuse(*field, "not supported yet by this runtime"));
    }
    match linux.rootfs_propagation.as_deref() {
        None | Some("private" | "rprivate" | "slave" | "rslave") => Ok(()),
        Some(other) => Err(refuse(
            "linux.rootfsPropagation",
            format!("`{other}`: the container's mounts are private; nothing propagates"),
        )),
    }
}

/// The engine's namespaces to join (a pod's network, ipc and uts).
fn joined_namespaces(linux: &Linux) -> Result<Vec<JoinedNamespace>, Unsupported> {
    let mut joined = Vec::new();
    for ns in &linux.namespaces {
        let Some(path) = &ns.path else { continue };
        let kind = match ns.kind.as_str() {
            "network" => JoinedKind::Net,
            "ipc" => JoinedKind::Ipc,
            _ => JoinedKind::Uts,
        };
        let path = absolute(&format!("linux.namespaces[{}].path", ns.kind), path)?;
        joined.push(JoinedNamespace { kind, path });
    }
    Ok(joined)
}

fn joins(joined: &[JoinedNamespace], kind: JoinedKind) -> bool {
    joined.iter().any(|j| j.kind == kind)
}

/// A sysfs needs a network namespace of the sandbox's own, an mqueue an ipc
/// namespace: in an engine's, each becomes an empty read-only directory.
fn without_owned_filesystems(
    mounts: &mut [MountStep],
    joined: &[JoinedNamespace],
    stricter: &mut Vec<String>,
) {
    for step in mounts.iter_mut() {
        let (target, needs) = match step {
            MountStep::Sysfs { target } => (target.clone(), JoinedKind::Net),
            MountStep::Mqueue { target } => (target.clone(), JoinedKind::Ipc),
            _ => continue,
        };
        if joins(joined, needs) {
            let name = if needs == JoinedKind::Net {
                "network"
            } else {
                "ipc"
            };
            stricter.push(format!(
                "{} is an empty read-only directory (the {name} namespace is the engine's)",
                target.display()
            ));
            *step = MountStep::Empty { target };
        }
    }
}

/// Mounts below an empty read-only directory have nowhere to go: dropped,
/// and said.
fn drop_below_empty(mounts: &mut Vec<MountStep>, stricter: &mut Vec<String>) {
    let empty: Vec<PathBuf> = mounts
        .iter()
        .filter_map(|step| match step {
            MountStep::Empty { target } => Some(target.clone()),
            _ => None,
        })
        .collect();
    mounts.retain(|step| {
        let target = match step {
            MountStep::Bind { target, .. }
            | MountStep::Tmpfs { target, .. }
            | MountStep::Dev { target }
            | MountStep::Proc { target }
            | MountStep::Sysfs { target }
            | MountStep::Mqueue { target }
            | MountStep::Empty { target } => target,
            _ => return true,
        };
        let Some(parent) = empty.iter().find(|e| target != *e && target.starts_with(e)) else {
            return true;
        };
        stricter.push(format!(
            "{}: not mounted, {} is empty",
            target.display(),
            parent.display()
        ));
        false
    });
}

/// Sysctls that only widen what the container may do are left unset (the
/// stricter); any other is refused.
fn check_sysctl(linux: &Linux, stricter: &mut Vec<String>) -> Result<(), Unsupported> {
    for name in linux.sysctl.keys() {
        match name.as_str() {
            // Unprivileged ICMP sockets (podman sets it by default).
            "net.ipv4.ping_group_range" => stricter.push(format!(
                "linux.sysctl: {name} left unset (no unprivileged ping)"
            )),
            _ => {
                return Err(refuse(
                    format!("linux.sysctl[{name}]"),
                    "setting sysctls is not supported",
                ));
            }
        }
    }
    Ok(())
}

/// Mappings, when given, must map the process's own ids: the container
/// gets exactly those two, mapped to the runtime's unprivileged ones.
fn check_id_mappings(
    linux: &Linux,
    process: &Process,
    stricter: &mut Vec<String>,
) -> Result<(), Unsupported> {
    for (field, maps, id) in [
        ("linux.uidMappings", &linux.uid_mappings, process.user.uid),
        ("linux.gidMappings", &linux.gid_mappings, process.user.gid),
    ] {
        if maps.is_empty() {
            continue;
        }
        let covers = maps.iter().any(|m| {
            id >= m.container_id && u64::from(id) < u64::from(m.container_id) + u64::from(m.size)
        });
        if !covers {
            return Err(refuse(
                field,
                format!("id {id} of the process is not mapped"),
            ));
        }
        if maps.iter().map(|m| u64::from(m.size)).sum::<u64>() > 1 {
            stricter.push(format!(
                "{field}: only id {id} is mapped (to an unprivileged host id)"
            ));
        }
    }
    Ok(())
}

fn absolute(field: &str, path: &str) -> Result<PathBuf, Unsupported> {
    absolute_path(path).map_err(|reason| refuse(field, reason))
}

/// `path` when it is absolute and has no `.` or `..` in it.
pub(crate) fn absolute_path(path: &str) -> Result<PathBuf, String> {
    let path = Path::new(path);
    let clean = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean || path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(format!(
            "`{}` must be absolute, without `.` or `..`",
            path.display()
        ));
    }
    Ok(path.to_path_buf())
}

fn environment(env: &[String]) -> Result<Vec<(String, String)>, Unsupported> {
    env.iter()
        .enumerate()
        .map(|(i, entry)| match entry.split_once('=') {
            Some((name, value)) if !name.is_empty() && !entry.contains('\0') => {
                Ok((name.to_string(), value.to_string()))
            }
            _ => Err(refuse(format!("process.env[{i}]"), "not NAME=VALUE")),
        })
        .collect()
}

/// The root filesystem first (read-write, made read-only last when asked:
/// the mounts need their mount points), then the configuration's mounts.
fn mount_steps(
    rootfs: &Path,
    mounts: &[Mount],
    stricter: &mut Vec<String>,
) -> Result<Vec<MountStep>, Unsupported> {
    let mut steps = vec![MountStep::Bind {
        source: rootfs.to_path_buf(),
        target: "/".into(),
        access: Access::Rw,
        optional: false,
    }];
    for (index, mount) in mounts.iter().enumerate() {
        if let Some(step) = crate::mounts::mount_step(index, mount, stricter)? {
            steps.push(step);
        }
    }
    Ok(steps)
}

/// Masked and read-only paths, after every mount (most are in /proc and
/// /sys); one that does not exist is skipped when the sandbox is built.
fn path_steps(linux: &Linux) -> Result<Vec<MountStep>, Unsupported> {
    let masked = linux.masked_paths.iter().enumerate().map(|(i, path)| {
        let target = absolute(&format!("linux.maskedPaths[{i}]"), path)?;
        Ok(MountStep::Mask { target })
    });
    let read_only = linux.readonly_paths.iter().enumerate().map(|(i, path)| {
        let target = absolute(&format!("linux.readonlyPaths[{i}]"), path)?;
        Ok(MountStep::ReadOnly { target })
    });
    masked.chain(read_only).collect()
}

/// The mounts as Landlock mirrors them: a root filesystem made read-only
/// at the end is read-only to Landlock too.
fn landlock_view(mounts: &[MountStep], readonly: bool) -> Vec<MountStep> {
    let mut view = mounts.to_vec();
    if let (true, Some(MountStep::Bind { access, .. })) = (readonly, view.first_mut()) {
        *access = Access::Ro;
    }
    view
}

fn seccomp_plan(seccomp: Option<&Value>, bundle: &Path) -> Result<SeccompPlan, Unsupported> {
    let (name, path, profile) = match seccomp {
        Some(value) => {
            let mut value = value.clone();
            let spec_allow = take_flags(&mut value)?;
            let profile: SeccompProfile = serde_json::from_value(value)
                .map_err(|e| refuse("linux.seccomp", e.to_string()))?;
            let plan = SeccompPlan {
                name: "config.json".into(),
                path: bundle.join("config.json"),
                profile,
                socket_families: all_families(),
                spec_allow,
            };
            return Ok(plan);
        }
        None => {
            let text =
                substrat_policy::builtin::seccomp_profile(DEFAULT_PROFILE).ok_or_else(|| {
                    refuse(
                        "linux.seccomp",
                        "the default profile is missing from this build",
                    )
                })?;
            let label = substrat_policy::builtin::seccomp_label(DEFAULT_PROFILE);
            let profile = SeccompProfile::parse(Path::new(&label), text)
                .map_err(|e| refuse("linux.seccomp", e.to_string()))?;
            (DEFAULT_PROFILE.to_string(), PathBuf::from(label), profile)
        }
    };
    Ok(SeccompPlan {
        name,
        path,
        profile,
        socket_families: all_families(),
        spec_allow: true,
    })
}

fn all_families() -> Vec<SocketFamily> {
    vec![SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6]
}

/// Removes `flags` from a seccomp section: SPEC_ALLOW is honoured, no other.
fn take_flags(value: &mut Value) -> Result<bool, Unsupported> {
    let Some(flags) = value.as_object_mut().and_then(|o| o.remove("flags")) else {
        return Ok(false);
    };
    let flags: Vec<String> =
        serde_json::from_value(flags).map_err(|e| refuse("linux.seccomp.flags", e.to_string()))?;
    let mut spec_allow = false;
    for flag in flags {
        match flag.as_str() {
            "SECCOMP_FILTER_FLAG_SPEC_ALLOW" => spec_allow = true,
            other => {
                return Err(refuse(
                    "linux.seccomp.flags",
                    format!("`{other}` is not supported"),
                ));
            }
        }
    }
    Ok(spec_allow)
}

fn rlimits(
    process: &Process,
    stricter: &mut Vec<String>,
) -> Result<Vec<RlimitSetting>, Unsupported> {
    let mut out = Vec::new();
    for (i, limit) in process.rlimits.iter().enumerate() {
        let kind = match limit.kind.as_str() {
            "RLIMIT_NOFILE" => RlimitKind::Nofile,
            "RLIMIT_NPROC" => RlimitKind::Nproc,
            "RLIMIT_CORE" => RlimitKind::Core,
            "RLIMIT_FSIZE" => RlimitKind::Fsize,
            "RLIMIT_AS" => RlimitKind::AddressSpace,
            "RLIMIT_CPU" => RlimitKind::CpuSeconds,
            "RLIMIT_DATA" => RlimitKind::Data,
            other => {
                return Err(refuse(
                    format!("process.rlimits[{i}]"),
                    format!("`{other}` is not supported"),
                ));
            }
        };
        if limit.soft != limit.hard {
            stricter.push(format!(
                "process.rlimits[{i}]: {} hard limit set to the soft one",
                limit.kind
            ));
        }
        out.push(RlimitSetting {
            kind,
            value: limit.soft.min(limit.hard),
        });
    }
    Ok(out)
}

fn cgroup_limits(resources: Option<&Resources>) -> Result<CgroupLimits, Unsupported> {
    let mut limits = CgroupLimits {
        pids_max: None,
        memory_max: None,
        cpu_max: None,
        enforcement: LimitEnforcement::Required,
    };
    let Some(r) = resources else {
        return Ok(limits);
    };
    let unsupported = [
        (
            "linux.resources.blockIO",
            r.block_io.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.resources.hugepageLimits",
            !r.hugepage_limits.is_empty(),
        ),
        (
            "linux.resources.network",
            r.network.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.resources.rdma",
            r.rdma.as_ref().is_some_and(not_empty),
        ),
        (
            "linux.resources.unified",
            r.unified.as_ref().is_some_and(|u| !u.is_empty()),
        ),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, asked)| *asked) {
        return Err(refuse(*field, "not supported yet by this runtime"));
    }
    if let Some(pids) = &r.pids {
        limits.pids_max = u64::try_from(pids.limit).ok().filter(|n| *n > 0);
    }
    if let Some(memory) = &r.memory {
        let others = [
            memory.reservation,
            memory.swap,
            memory.kernel,
            memory.kernel_tcp,
        ];
        if others.iter().any(Option::is_some)
            || memory.swappiness.is_some()
            || memory.disable_oom_killer.is_some()
        {
            return Err(refuse(
                "linux.resources.memory",
                "only `limit` is supported",
            ));
        }
        limits.memory_max = memory
            .limit
            .and_then(|l| u64::try_from(l).ok())
            .filter(|n| *n > 0);
    }
    if let Some(cpu) = &r.cpu {
        // 1024 is the kernel's default weight: leaving it unset is the same.
        let others = cpu.shares.is_some_and(|s| s != 1024)
            || cpu.burst.is_some()
            || cpu.realtime_runtime.is_some()
            || cpu.realtime_period.is_some()
            || cpu.cpus.is_some()
            || cpu.mems.is_some()
            || cpu.idle.is_some();
        if others {
            return Err(refuse(
                "linux.resources.cpu",
                "only `quota` and `period` are supported",
            ));
        }
        if let (Some(quota), Some(period)) = (cpu.quota, cpu.period)
            && quota > 0
            && period > 0
        {
            limits.cpu_max = Some(quota as f64 / period as f64);
        }
    }
    Ok(limits)
}
