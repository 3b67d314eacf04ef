//! The configuration's limits as the plan's: seccomp (the configuration's
//! profile or the default one), rlimits, cgroup limits, the OOM
//! adjustment.

use std::path::{Path, PathBuf};

use serde_json::Value;
use substrat_policy::model::LimitEnforcement;
use substrat_policy::seccomp::SeccompProfile;
use substrat_sandbox::plan::{CgroupLimits, RlimitKind, RlimitSetting, SeccompPlan, SocketFamily};

use crate::checks::not_empty;
use crate::spec::{Process, Resources};
use crate::translate::{Unsupported, refuse};

/// The default profile's name when the configuration has no seccomp.
pub(crate) const DEFAULT_PROFILE: &str = "default";

/// The OOM adjustment asked (kubelet sets one per QoS class), never below
/// 0: an untrusted sandbox is not favoured over the host's processes.
pub(crate) fn oom_score_adj(
    process: &Process,
    stricter: &mut Vec<String>,
) -> Result<Option<u16>, Unsupported> {
    match process.oom_score_adj {
        None | Some(0) => Ok(None),
        Some(adj @ 1..=1000) => Ok(u16::try_from(adj).ok()),
        Some(adj @ -1000..=-1) => {
            stricter.push(format!("process.oomScoreAdj: {adj} raised to 0"));
            Ok(None)
        }
        Some(adj) => Err(refuse(
            "process.oomScoreAdj",
            format!("{adj} is outside -1000..1000"),
        )),
    }
}

pub(crate) fn seccomp_plan(
    seccomp: Option<&Value>,
    bundle: &Path,
) -> Result<SeccompPlan, Unsupported> {
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

pub(crate) fn cgroup_limits(resources: Option<&Resources>) -> Result<CgroupLimits, Unsupported> {
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
