//! What the configuration asks of the process and of Linux that the
//! runtime checks before it translates: refused with the field's name, or
//! accepted with a note where the runtime is stricter.

use serde_json::Value;

use crate::spec::{Linux, Process, Spec};
use crate::translate::{Unsupported, refuse};

pub(crate) fn refuse_unsupported_top(spec: &Spec) -> Result<(), Unsupported> {
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
pub(crate) fn not_empty(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Object(map) => !map.is_empty(),
        Value::Array(list) => !list.is_empty(),
        _ => true,
    }
}

pub(crate) fn check_process(process: &Process, notes: &mut Vec<String>) -> Result<(), Unsupported> {
    if let Some(size) = process.console_size {
        if !process.terminal {
            return Err(refuse(
                "process.consoleSize",
                "set without process.terminal",
            ));
        }
        if u16::try_from(size.height).is_err() || u16::try_from(size.width).is_err() {
            return Err(refuse(
                "process.consoleSize",
                "larger than a terminal can be",
            ));
        }
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
    // Engines add the image's groups of the user; the sandbox maps one
    // gid, so the others are not given (fewer groups: the stricter).
    if process
        .user
        .additional_gids
        .iter()
        .any(|g| *g != process.user.gid)
    {
        notes.push("process.user.additionalGids: not given (the container maps one gid)".into());
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
            notes.push("process.capabilities: the container gets none".into());
        }
    }
    if !process.no_new_privileges {
        notes.push("process.noNewPrivileges: set anyway".into());
    }
    Ok(())
}

/// A privileged container (`privileged: true`, `--privileged`) is refused
/// by that name: `CAP_SYS_ADMIN` among at least `PRIVILEGED_CAPS`
/// capabilities and no masked or read-only path, as engines write it
/// (every capability the engine holds; with or without host devices:
/// `privileged_without_host_devices`). An ordinary container has masked
/// paths, and engines' default lists are 11 to 14 capabilities. The runtime would give it
/// none of what it asks; quietly reducing it hid that from whoever asked.
/// Fewer than the 41 of kernel 6.x, and more than any engine's default.
const PRIVILEGED_CAPS: usize = 30;

fn check_privileged(linux: &Linux, process: &Process) -> Result<(), Unsupported> {
    let Some(caps) = &process.capabilities else {
        return Ok(());
    };
    let admin = caps.bounding.iter().any(|c| c == "CAP_SYS_ADMIN");
    if admin
        && caps.bounding.len() >= PRIVILEGED_CAPS
        && linux.masked_paths.is_empty()
        && linux.readonly_paths.is_empty()
    {
        return Err(refuse(
            "process.capabilities",
            "a privileged container (every capability, no masked or read-only path) is refused: \
             the runtime gives a container no capability and no host device; drop `privileged`",
        ));
    }
    Ok(())
}

/// Every capability engines give a container by default (containerd's
/// and Docker's 14; podman's 11 and CRI-O's 9 are among them). Listed,
/// they are dropped with a note: the container gets none.
const ENGINE_DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// A capability beyond the engines' defaults was added (`--cap-add`, a
/// pod's `capabilities.add`): refused by name rather than quietly dropped,
/// so whoever asked learns the container will not have it.
fn check_added_capabilities(process: &Process) -> Result<(), Unsupported> {
    let Some(caps) = &process.capabilities else {
        return Ok(());
    };
    let sets = [
        ("bounding", &caps.bounding),
        ("effective", &caps.effective),
        ("permitted", &caps.permitted),
        ("inheritable", &caps.inheritable),
        ("ambient", &caps.ambient),
    ];
    for (set, names) in sets {
        if let Some(added) = names
            .iter()
            .find(|c| !ENGINE_DEFAULT_CAPS.contains(&c.as_str()))
        {
            return Err(refuse(
                format!("process.capabilities.{set}"),
                format!(
                    "{} is added: the runtime gives a container no capability; drop it from \
                     the container's capabilities (`add`)",
                    added.escape_debug()
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_linux(
    linux: &Linux,
    process: &Process,
    notes: &mut Vec<String>,
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
        notes.push(format!(
            "linux.namespaces: {} made new too (never the host's)",
            unasked.join(", ")
        ));
    }
    check_privileged(linux, process)?;
    check_added_capabilities(process)?;
    check_id_mappings(linux, process, notes)?;
    check_sysctl(linux, notes)?;
    if let Some(path) = &linux.cgroups_path {
        check_cgroups_path(path)?;
    }
    if !linux.devices.is_empty() {
        // What containerd's CRI gives a privileged container: every host
        // device.
        return Err(refuse(
            "linux.devices",
            "host devices (a privileged container's, a device plugin's) are not given: a container \
             has only the runtime's harmless nodes",
        ));
    }
    let unsupported = [
        (
            "linux.timeOffsets",
            linux.time_offsets.as_ref().is_some_and(not_empty),
        ),
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

/// Sysctls that only widen what the container may do are left unset (the
/// stricter); any other is refused.
pub(crate) fn check_sysctl(linux: &Linux, notes: &mut Vec<String>) -> Result<(), Unsupported> {
    for name in linux.sysctl.keys() {
        match name.as_str() {
            // Unprivileged ICMP sockets (podman sets it by default).
            "net.ipv4.ping_group_range" => notes.push(format!(
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
pub(crate) fn check_id_mappings(
    linux: &Linux,
    process: &Process,
    notes: &mut Vec<String>,
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
            notes.push(format!(
                "{field}: only id {id} is mapped (to an unprivileged host id)"
            ));
        }
    }
    Ok(())
}

/// `linux.cgroupsPath`: a path below each hierarchy's root (leading `/` or
/// not), the container's groups made inside it; never `..`, and not the
/// systemd driver's `slice:prefix:name`.
fn check_cgroups_path(path: &str) -> Result<(), Unsupported> {
    use std::path::Component;
    let components = std::path::Path::new(path).components();
    let clean = components
        .clone()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && components
            .clone()
            .any(|c| matches!(c, Component::Normal(_)));
    if path.contains(':') {
        return Err(refuse(
            "linux.cgroupsPath",
            "the systemd driver's slice:prefix:name is not supported; set the engine's cgroup manager to cgroupfs",
        ));
    }
    if !clean || path.contains('\0') {
        return Err(refuse(
            "linux.cgroupsPath",
            format!(
                "`{}` must name a group below the hierarchy's root, without `.` or `..`",
                path.escape_debug()
            ),
        ));
    }
    Ok(())
}
