//! The kernel's limits of a plan: the seccomp filter's inputs, rlimits.

use substrat_policy::{LoadedPolicy, SeccompChoice};

use super::{RlimitKind, RlimitSetting, SeccompPlan, SocketFamily};

/// `no_inet`: only AF_UNIX sockets (network `none`). With `proxy` the
/// command needs TCP sockets to reach the bridge on loopback; the network
/// namespace has nothing else, and Landlock allows only the bridge's port.
pub(super) fn seccomp_plan(policy: &LoadedPolicy, no_inet: bool) -> Option<SeccompPlan> {
    match &policy.seccomp {
        SeccompChoice::Unconfined => None,
        SeccompChoice::Profile {
            name,
            path,
            profile,
        } => {
            let mut families = vec![SocketFamily::Unix];
            if !no_inet {
                families.extend([SocketFamily::Inet, SocketFamily::Inet6]);
            }
            Some(SeccompPlan {
                name: name.clone(),
                path: path.clone(),
                profile: profile.clone(),
                socket_families: families,
            })
        }
    }
}

pub(super) fn rlimits(policy: &LoadedPolicy) -> Vec<RlimitSetting> {
    let r = &policy.policy.rlimits;
    let entries = [
        (RlimitKind::Nofile, r.nofile),
        (RlimitKind::Nproc, r.nproc),
        (RlimitKind::Core, r.core.map(|s| s.0)),
        (RlimitKind::Fsize, r.fsize.map(|s| s.0)),
        (RlimitKind::AddressSpace, r.address_space.map(|s| s.0)),
        (RlimitKind::CpuSeconds, r.cpu_seconds),
    ];
    entries
        .into_iter()
        .filter_map(|(kind, value)| value.map(|value| RlimitSetting { kind, value }))
        .collect()
}
