//! The kernel's limits of a plan: the seccomp filter's inputs, rlimits.

use substrat_policy::{LoadedPolicy, SeccompChoice};

use super::{RlimitKind, RlimitSetting, SeccompPlan, SocketFamily};

/// AF_UNIX, AF_INET and AF_INET6 sockets only. With network `none` or
/// `proxy` the network namespace holds nothing but its own loopback (a
/// test server, the bridges to the proxy and the gateway); netlink,
/// packet, vsock and the rest stay denied everywhere.
pub(super) fn seccomp_plan(policy: &LoadedPolicy) -> Option<SeccompPlan> {
    match &policy.seccomp {
        SeccompChoice::Unconfined => None,
        SeccompChoice::Profile {
            name,
            path,
            profile,
        } => Some(SeccompPlan {
            name: name.clone(),
            path: path.clone(),
            profile: profile.clone(),
            socket_families: vec![SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6],
            spec_allow: policy.policy.seccomp.speculative_store_bypass
                == substrat_policy::model::SpeculativeStoreBypass::Allow,
        }),
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
