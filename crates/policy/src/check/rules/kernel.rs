//! Rules on the kernel-side confinement: seccomp, Landlock, namespaces,
//! cgroup limits, rlimits.

use super::Emit;
use crate::load::{LoadedPolicy, SeccompChoice};
use crate::model::LandlockMode;
use crate::seccomp::Verdict;

pub(super) fn seccomp_unconfined(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if matches!(p.seccomp, SeccompChoice::Unconfined) {
        e.at(
            "seccomp.profile",
            "seccomp is `unconfined`: every system call is allowed",
        );
    }
}

pub(super) fn seccomp_default_allow(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp
        && profile.default_action.permits()
    {
        e.at(
            "seccomp.profile",
            format!(
                "profile {} allows every syscall it does not name",
                path.display()
            ),
        );
    }
}

pub(super) fn seccomp_dangerous(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp {
        let allowed = profile.dangerous_allowed();
        if !allowed.is_empty() {
            e.at(
                "seccomp.profile",
                format!("profile {} allows {}", path.display(), allowed.join(", ")),
            );
        }
    }
}

pub(super) fn seccomp_namespace_clone(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp {
        let mut open = Vec::new();
        for name in ["clone3", "unshare", "setns"] {
            if profile.verdict(name) != Verdict::Denied {
                open.push(name);
            }
        }
        if profile.verdict("clone") == Verdict::Allowed {
            open.push("clone (any flags)");
        }
        if !open.is_empty() {
            e.at(
                "seccomp.profile",
                format!("profile {} allows {}", path.display(), open.join(", ")),
            );
        }
    }
}

pub(super) fn landlock_off(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.landlock == LandlockMode::Off {
        e.at("landlock", "`landlock = \"off\"`");
    }
}

pub(super) fn landlock_best_effort(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.landlock == LandlockMode::BestEffort {
        e.at(
            "landlock",
            "`landlock = \"best-effort\"`: a kernel without Landlock does not stop the launch",
        );
    }
}

pub(super) fn nested_userns(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.namespaces.nested_userns {
        e.at(
            "namespaces.nested_userns",
            "the sandboxed command may create user namespaces",
        );
    }
}

pub(super) fn namespace_disabled(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let ns = &p.policy.namespaces;
    for (name, on) in [("pid", ns.pid), ("ipc", ns.ipc), ("uts", ns.uts)] {
        if !on {
            e.at(
                &format!("namespaces.{name}"),
                format!("the {name} namespace is shared with the host"),
            );
        }
    }
}

pub(super) fn no_pids_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.pids_max.is_none() {
        e.at("cgroup", "`cgroup.pids_max` is not set");
    }
}

pub(super) fn no_memory_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.memory_max.is_none() {
        e.at("cgroup", "`cgroup.memory_max` is not set");
    }
}

pub(super) fn no_cpu_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.cpu_max.is_none() {
        e.at("cgroup", "`cgroup.cpu_max` is not set");
    }
}

pub(super) fn missing_rlimits(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let r = &p.policy.rlimits;
    let mut missing = Vec::new();
    if r.core.is_none_or(|c| c.0 > 0) {
        missing.push("core = 0");
    }
    if r.nofile.is_none() {
        missing.push("nofile");
    }
    if !missing.is_empty() {
        e.at(
            "rlimits",
            format!("not set: rlimits.{}", missing.join(", rlimits.")),
        );
    }
}
