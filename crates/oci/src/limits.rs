//! The configuration's limits as the plan's: seccomp (the configuration's
//! profile with the default one stacked on it, or the default one alone), rlimits, cgroup limits, the OOM
//! adjustment.

use std::path::{Path, PathBuf};

use serde_json::Value;
use substrat_policy::model::{LandlockMode, LimitEnforcement};
use substrat_policy::seccomp::SeccompProfile;
use substrat_sandbox::plan::{
    CgroupLimits, LandlockPlan, PolicyLayer, RlimitKind, RlimitSetting, SeccompPlan, SocketFamily,
};

use crate::checks::not_empty;
use crate::spec::{Process, Resources};
use crate::translate::{Unsupported, refuse};

/// The default profile's name when the configuration has no seccomp.
pub(crate) const DEFAULT_PROFILE: &str = "default";

/// The OOM adjustment asked (kubelet sets one per QoS class), never below
/// 0: an untrusted sandbox is not favoured over the host's processes.
pub(crate) fn oom_score_adj(
    process: &Process,
    notes: &mut Vec<String>,
) -> Result<Option<u16>, Unsupported> {
    // Always written: the container would otherwise inherit the engine's
    // own (containerd's shim runs at -998).
    match process.oom_score_adj {
        None => Ok(Some(0)),
        Some(adj @ 0..=1000) => Ok(u16::try_from(adj).ok()),
        Some(adj @ -1000..=-1) => {
            notes.push(format!("process.oomScoreAdj: {adj} raised to 0"));
            Ok(Some(0))
        }
        Some(adj) => Err(refuse(
            "process.oomScoreAdj",
            format!("{adj} is outside -1000..1000"),
        )),
    }
}

/// The container's filter: the configuration's profile, or the default
/// one. With a profile of the configuration's, the default profile comes
/// as a layer loaded after it: an engine's profile (which may allow what
/// the default denies) is never the only filter, and the kernel lets a
/// syscall through only when both allow it.
pub(crate) fn seccomp_plans(
    seccomp: Option<&Value>,
    bundle: &Path,
    notes: &mut Vec<String>,
) -> Result<(SeccompPlan, Option<PolicyLayer>), Unsupported> {
    let Some(value) = seccomp else {
        return Ok((default_plan()?, None));
    };
    let mut value = value.clone();
    let spec_allow = take_flags(&mut value)?;
    let profile: SeccompProfile =
        serde_json::from_value(value).map_err(|e| refuse("linux.seccomp", e.to_string()))?;
    let own = SeccompPlan {
        name: "config.json".into(),
        path: bundle.join("config.json"),
        profile,
        socket_families: all_families(),
        spec_allow,
    };
    notes.push(format!(
        "linux.seccomp: substrat's {DEFAULT_PROFILE} profile stacked on it (a syscall passes only when both allow it)"
    ));
    let layer = PolicyLayer {
        policy_name: DEFAULT_PROFILE.into(),
        landlock: LandlockPlan {
            mode: LandlockMode::Off,
            rules: Vec::new(),
            scope: false,
            unix_connect: false,
        },
        seccomp: Some(default_plan()?),
    };
    Ok((own, Some(layer)))
}

/// substrat's default profile, as built into this binary.
fn default_plan() -> Result<SeccompPlan, Unsupported> {
    let text = substrat_policy::builtin::seccomp_profile(DEFAULT_PROFILE).ok_or_else(|| {
        refuse(
            "linux.seccomp",
            "the default profile is missing from this build",
        )
    })?;
    let label = substrat_policy::builtin::seccomp_label(DEFAULT_PROFILE);
    let profile = SeccompProfile::parse(Path::new(&label), text)
        .map_err(|e| refuse("linux.seccomp", e.to_string()))?;
    Ok(SeccompPlan {
        name: DEFAULT_PROFILE.to_string(),
        path: PathBuf::from(label),
        profile,
        socket_families: all_families(),
        spec_allow: true,
    })
}

pub(crate) fn all_families() -> Vec<SocketFamily> {
    vec![SocketFamily::Unix, SocketFamily::Inet, SocketFamily::Inet6]
}

/// Removes `flags` from a seccomp section: SPEC_ALLOW is honoured, no other.
pub(crate) fn take_flags(value: &mut Value) -> Result<bool, Unsupported> {
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

pub(crate) fn rlimits(
    process: &Process,
    notes: &mut Vec<String>,
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
            notes.push(format!(
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

pub(crate) fn cgroup_limits(
    resources: Option<&Resources>,
    notes: &mut Vec<String>,
) -> Result<CgroupLimits, Unsupported> {
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
    // containerd's CRI lists every page size with a limit of 0.
    if r.hugepage_limits
        .iter()
        .any(|h| h.get("limit").and_then(Value::as_u64) != Some(0))
    {
        return Err(refuse(
            "linux.resources.hugepageLimits",
            "only limits of 0 are accepted (not applied: said)",
        ));
    }
    if !r.hugepage_limits.is_empty() {
        notes.push(
            "linux.resources.hugepageLimits of 0: not applied (no hugetlb limit is set)".into(),
        );
    }
    if let Some(pids) = &r.pids {
        limits.pids_max = u64::try_from(pids.limit).ok().filter(|n| *n > 0);
    }
    if let Some(memory) = &r.memory {
        limits.memory_max = memory_limit(memory, notes)?;
    }
    if let Some(cpu) = &r.cpu {
        limits.cpu_max = cpu_limit(cpu, notes)?;
    }
    Ok(limits)
}

/// `memory.limit`; a swap limit equal to it (no swap beyond the limit:
/// what containerd's CRI asks) is accepted and said; nothing else.
fn memory_limit(
    memory: &crate::spec::Memory,
    notes: &mut Vec<String>,
) -> Result<Option<u64>, Unsupported> {
    let others = [memory.reservation, memory.kernel, memory.kernel_tcp];
    let asked_else = others.iter().any(Option::is_some)
        || memory.swappiness.is_some()
        || memory.disable_oom_killer.is_some()
        || memory.use_hierarchy.is_some()
        || memory.check_before_update.is_some();
    if asked_else || memory.swap.is_some_and(|swap| Some(swap) != memory.limit) {
        return Err(refuse(
            "linux.resources.memory",
            "only `limit` (and a `swap` equal to it) is supported",
        ));
    }
    if memory.swap.is_some() {
        notes.push(
            "linux.resources.memory.swap: no swap beyond the limit on cgroup v2 (memory.swap.max = 0); not set on v1".into(),
        );
    }
    Ok(memory
        .limit
        .and_then(|l| u64::try_from(l).ok())
        .filter(|n| *n > 0))
}

/// `cpu.quota` over `cpu.period` (100 ms when not given, as runc); a
/// weight (`shares`) is not applied, and said.
fn cpu_limit(cpu: &crate::spec::Cpu, notes: &mut Vec<String>) -> Result<Option<f64>, Unsupported> {
    let others = cpu.burst.is_some()
        || cpu.realtime_runtime.is_some()
        || cpu.realtime_period.is_some()
        || cpu.cpus.is_some()
        || cpu.mems.is_some()
        || cpu.idle.is_some();
    if others {
        return Err(refuse(
            "linux.resources.cpu",
            "only `quota`, `period` and `shares` are supported",
        ));
    }
    if let Some(shares) = cpu.shares.filter(|s| *s != 1024) {
        notes.push(format!(
            "linux.resources.cpu.shares {shares}: not applied (the default weight is kept)"
        ));
    }
    let period = cpu.period.unwrap_or(100_000);
    Ok(match cpu.quota {
        Some(quota) if quota > 0 && period > 0 => Some(quota as f64 / period as f64),
        _ => None,
    })
}
