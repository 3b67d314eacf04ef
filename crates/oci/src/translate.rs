//! A bundle's configuration as a launch plan: the same `LaunchPlan` a
//! policy produces, applied by the same native backend. Pure.
//!
//! Where the configuration and this runtime's walls disagree the stricter
//! one wins, and `Translated::notes` says so, as it says what is accepted
//! but not applied: the container always gets its own user, mount, pid and
//! cgroup namespaces (ipc, uts and network too unless it joins an
//! engine's), no capability, no_new_privs, seccomp (the default profile,
//! stacked on the configuration's when it has one), Landlock rules mirroring its
//! mounts, and one id inside mapped to one unprivileged id outside. What
//! the configuration asks and the runtime cannot do is refused with the
//! field's name.

use std::path::{Component, Path, PathBuf};

use substrat_policy::model::LandlockMode;
use substrat_sandbox::plan::{
    Access, IdMap, JoinedKind, JoinedNamespace, LaunchPlan, MountStep, Namespaces, SocketUse,
    landlock_plan,
};

use crate::checks::{check_linux, check_process, refuse_unsupported_top};
use crate::limits::{cgroup_limits, oom_score_adj, rlimits, seccomp_plans};
use crate::spec::{Linux, Mount, Spec};

/// What the runtime-spec asks that this runtime does not do.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Unsupported {
    /// The configuration's field, as a JSON path (`linux.sysctl`).
    pub field: String,
    pub reason: String,
}

pub(crate) fn refuse(field: impl Into<String>, reason: impl Into<String>) -> Unsupported {
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

/// The plan, and where it differs from what the configuration asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub plan: LaunchPlan,
    pub notes: Vec<String>,
    /// `linux.cgroupsPath`, as the configuration gave it.
    pub cgroups_path: Option<String>,
}

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
    let mut notes = Vec::new();
    check_process(process, &mut notes)?;
    check_linux(linux, process, &mut notes)?;
    let rootfs = bundle.join(&root.path);
    // Without one, the runtime-spec means the host's network, which a
    // container never gets: refused by name rather than quietly isolated
    // (a pod's containers would no longer share their network).
    if !linux.namespaces.iter().any(|ns| ns.kind == "network") {
        return Err(refuse(
            "linux.namespaces",
            "no network namespace: the host's network (a pod's hostNetwork, podman --network host) \
             is never given to a container",
        ));
    }
    let joined = joined_namespaces(linux)?;
    let mut mounts = mount_steps(&rootfs, &spec.mounts, &mut notes)?;
    without_owned_filesystems(&mut mounts, &joined, &mut notes);
    drop_below_empty(&mut mounts, &mut notes);
    mounts.extend(path_steps(linux)?);
    if root.readonly {
        mounts.push(MountStep::RootReadOnly);
    }
    let resources = linux.resources.as_ref();
    if resources.is_some_and(|r| r.devices.iter().any(|d| d.allow)) {
        notes.push("linux.resources.devices: /dev holds only the runtime's harmless nodes".into());
    }
    let (seccomp, default_layer) = seccomp_plans(linux.seccomp.as_ref(), bundle, &mut notes)?;
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
        seccomp: Some(seccomp),
        rlimits: rlimits(process, &mut notes)?,
        cgroup: cgroup_limits(resources, &mut notes)?,
        env: environment(&process.env)?,
        cwd: absolute("process.cwd", &process.cwd)?,
        argv: process.args.clone(),
        mounts,
        proxy: None,
        gateway: None,
        mcp: None,
        // The launcher's stdio is then the terminal `create` made: the
        // command takes it as its controlling terminal.
        terminal: process.terminal,
        overlay: None,
        joined,
        oom_score_adj: oom_score_adj(process, &mut notes)?,
        layers: default_layer.into_iter().collect(),
        max_ptys: substrat_sandbox::plan::DEFAULT_MAX_PTYS,
    };
    Ok(Translated {
        plan,
        notes,
        cgroups_path: linux.cgroups_path.clone(),
    })
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
    notes: &mut Vec<String>,
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
            notes.push(format!(
                "{} is an empty read-only directory (the {name} namespace is the engine's)",
                target.display()
            ));
            *step = MountStep::Empty { target };
        }
    }
}

/// Mounts below an empty read-only directory have nowhere to go: dropped,
/// and said.
fn drop_below_empty(mounts: &mut Vec<MountStep>, notes: &mut Vec<String>) {
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
        notes.push(format!(
            "{}: not mounted, {} is empty",
            target.display(),
            parent.display()
        ));
        false
    });
}

pub(crate) fn absolute(field: &str, path: &str) -> Result<PathBuf, Unsupported> {
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

pub(crate) fn environment(env: &[String]) -> Result<Vec<(String, String)>, Unsupported> {
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
    notes: &mut Vec<String>,
) -> Result<Vec<MountStep>, Unsupported> {
    let mut steps = vec![MountStep::Bind {
        source: rootfs.to_path_buf(),
        target: "/".into(),
        access: Access::Rw,
        optional: false,
        socket: SocketUse::Unjudged,
    }];
    for (index, mount) in mounts.iter().enumerate() {
        if let Some(step) = crate::mounts::mount_step(index, mount, notes)? {
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
