//! `update`: new cgroup limits for a running container (`--resources`, the
//! runtime-spec's `linux.resources` as JSON, or runc's single flags), as
//! runc applies them. Applied where the container's limits are: its
//! sandbox's group for that controller (`substrat-ID-PID`, below the
//! engine's cgroupsPath) when `create` made one, else the cgroupsPath
//! group itself, which the launcher joined (v1 on a hybrid host, v2 where
//! the controller is there). A value above what a policy on top of the
//! container allows (the operator's, the container's annotation) is
//! refused naming the policy: a container may narrow, never widen, them.

use std::path::{Path, PathBuf};

use serde_json::Value;
use substrat_sandbox::plan::CgroupLimits;

use crate::engine_cgroup::{Hierarchy, hierarchies};
use crate::spec::Resources;

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error("--resources: {0}")]
    Parse(String),
    #[error("{field}: {why}")]
    Unsupported { field: String, why: String },
    #[error(
        "{field}: {asked} is above policy `{policy}`'s {limit} ({allowed}): an update may not widen the operator's limits"
    )]
    AbovePolicy {
        field: &'static str,
        asked: String,
        policy: String,
        limit: &'static str,
        allowed: String,
    },
    #[error(
        "container `{0}` has no cgroup of its own (no linux.cgroupsPath): there is nothing to update"
    )]
    NoGroup(String),
    #[error("{controller}: no cgroup hierarchy has this controller here")]
    NoController { controller: &'static str },
    /// The OS error is the source (printed once, after this).
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: `{text}` is not a CPU bandwidth this runtime reads")]
    BadCurrent { path: PathBuf, text: String },
}

/// One limit: a number, or none (`-1`, or any negative number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Limit(u64),
    Unlimited,
}

impl Setting {
    /// A value as runc reads it: 0 leaves the limit as it is (None), a
    /// negative one takes it away.
    pub fn of(value: i64) -> Option<Self> {
        match u64::try_from(value) {
            Ok(0) => None,
            Ok(n) => Some(Self::Limit(n)),
            Err(_) => Some(Self::Unlimited),
        }
    }
}

/// The kernel's bounds on a CFS period, and its least quota (microseconds).
pub const CPU_PERIOD_MIN: u64 = 1_000;
pub const CPU_PERIOD_MAX: u64 = 1_000_000;
pub const CPU_QUOTA_MIN: u64 = 1_000;

/// What an update asks; a field not given stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub pids: Option<Setting>,
    /// Bytes.
    pub memory: Option<Setting>,
    /// CFS quota in microseconds.
    pub cpu_quota: Option<Setting>,
    /// CFS period in microseconds (the current one when not given).
    pub cpu_period: Option<u64>,
    /// What is accepted and not applied, said on stderr.
    pub notes: Vec<String>,
}

/// Reads `linux.resources` as JSON: pids, memory and CPU bandwidth; a CPU
/// weight and a swap limit are taken and not applied (said); every other
/// setting is refused by name.
pub fn parse(bytes: &[u8]) -> Result<Asked, UpdateError> {
    let resources: Resources =
        serde_json::from_slice(bytes).map_err(|e| UpdateError::Parse(e.to_string()))?;
    let mut asked = Asked::default();
    let refuse = |field: &str| UpdateError::Unsupported {
        field: format!("linux.resources.{field}"),
        why: "not supported by update (pids.limit, memory.limit, cpu.quota and cpu.period are)"
            .into(),
    };
    let non_empty = |v: &Option<Value>| v.as_ref().is_some_and(crate::checks::not_empty);
    if non_empty(&resources.block_io) {
        return Err(refuse("blockIO"));
    }
    if non_empty(&resources.network) || non_empty(&resources.rdma) {
        return Err(refuse("network"));
    }
    if resources.unified.as_ref().is_some_and(|u| !u.is_empty()) {
        return Err(refuse("unified"));
    }
    if resources
        .hugepage_limits
        .iter()
        .any(|h| h.get("limit").and_then(Value::as_u64) != Some(0))
    {
        return Err(refuse("hugepageLimits (other than limits of 0)"));
    }
    // What the engines send whole with every update: kept as at create.
    if !resources.devices.is_empty() {
        asked.notes.push(
            "linux.resources.devices: not applied (the container's /dev is fixed at create)".into(),
        );
    }
    if !resources.hugepage_limits.is_empty() {
        asked.notes.push(
            "linux.resources.hugepageLimits of 0: not applied (no hugetlb limit is set)".into(),
        );
    }
    if let Some(pids) = &resources.pids {
        asked.pids = Setting::of(pids.limit);
    }
    if let Some(memory) = &resources.memory {
        let others = memory.reservation.is_some_and(|r| r > 0)
            || memory.kernel.is_some_and(|k| k > 0)
            || memory.kernel_tcp.is_some_and(|k| k > 0)
            || memory.swappiness.is_some()
            || memory.disable_oom_killer == Some(true);
        if others {
            return Err(refuse("memory (other than limit and swap)"));
        }
        asked.memory = memory.limit.and_then(Setting::of);
        if memory.use_hierarchy.is_some() {
            asked.notes.push(
                "linux.resources.memory.useHierarchy: not applied (the kernel's is kept)".into(),
            );
        }
        if memory.swap.is_some_and(|s| s != 0) {
            asked
                .notes
                .push("linux.resources.memory.swap: not applied (no swap limit is set)".into());
        }
    }
    if let Some(cpu) = &resources.cpu {
        let others = cpu.burst.is_some_and(|b| b > 0)
            || cpu.realtime_runtime.is_some_and(|r| r != 0)
            || cpu.realtime_period.is_some_and(|r| r != 0)
            || cpu.cpus.as_ref().is_some_and(|s| !s.is_empty())
            || cpu.mems.as_ref().is_some_and(|s| !s.is_empty())
            || cpu.idle.is_some_and(|i| i != 0);
        if others {
            return Err(refuse("cpu (other than quota, period and shares)"));
        }
        asked.cpu_quota = cpu.quota.and_then(Setting::of);
        asked.cpu_period = cpu.period.filter(|p| *p > 0);
        if cpu.shares.is_some_and(|s| s != 0 && s != 1024) {
            asked.notes.push(
                "linux.resources.cpu.shares: not applied (the default weight is kept)".into(),
            );
        }
    }
    Ok(asked)
}

/// Refuses what goes above a policy's limit (or takes a limit away where
/// a policy has one), naming the policy.
pub fn check_policies(
    asked: &Asked,
    policies: &[(String, CgroupLimits)],
) -> Result<(), UpdateError> {
    let shown = |s: Setting| match s {
        Setting::Limit(n) => n.to_string(),
        Setting::Unlimited => "no limit".to_string(),
    };
    for (policy, limits) in policies {
        let above = |asked: Setting, max: u64| match asked {
            Setting::Limit(n) => n > max,
            Setting::Unlimited => true,
        };
        if let (Some(a), Some(max)) = (asked.pids, limits.pids_max)
            && above(a, max)
        {
            return Err(UpdateError::AbovePolicy {
                field: "pids.limit",
                asked: shown(a),
                policy: policy.clone(),
                limit: "pids_max",
                allowed: max.to_string(),
            });
        }
        if let (Some(a), Some(max)) = (asked.memory, limits.memory_max)
            && above(a, max)
        {
            return Err(UpdateError::AbovePolicy {
                field: "memory.limit",
                asked: shown(a),
                policy: policy.clone(),
                limit: "memory_max",
                allowed: max.to_string(),
            });
        }
        if let Some(cpus) = limits.cpu_max
            && (asked.cpu_quota.is_some() || asked.cpu_period.is_some())
        {
            // The resulting pair (`apply` fills in the current values):
            // a quota not known is taken as none, a widening.
            let quota = asked.cpu_quota.unwrap_or(Setting::Unlimited);
            let period = asked.cpu_period.unwrap_or(100_000);
            let wider = match quota {
                Setting::Limit(q) => q as f64 / period as f64 > cpus + 1e-9,
                Setting::Unlimited => true,
            };
            if wider {
                return Err(UpdateError::AbovePolicy {
                    field: "cpu.quota/cpu.period",
                    asked: match quota {
                        Setting::Limit(q) => format!("{q}/{period} CPUs"),
                        Setting::Unlimited => "no limit".into(),
                    },
                    policy: policy.clone(),
                    limit: "cpu_max",
                    allowed: format!("{cpus} CPUs"),
                });
            }
        }
    }
    Ok(())
}

/// Writes the limits asked, once the resulting CPU bandwidth (what is
/// asked, the rest as it is now) is checked against the kernel's bounds
/// and every policy; returns `file=value` for each written.
pub fn apply(
    cgroups_path: &str,
    id: &str,
    launcher: i32,
    asked: &Asked,
    policies: &[(String, CgroupLimits)],
) -> Result<Vec<String>, UpdateError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let all = hierarchies(&mountinfo);
    let relative = Path::new(cgroups_path.trim_start_matches('/'));
    let sandbox = format!("substrat-{id}-{launcher}");
    let group = |controller: &'static str| {
        let (h, v2) = hierarchy(&all, controller)?;
        let base = h.mount_point.join(relative);
        let own = base.join(&sandbox);
        Ok::<_, UpdateError>((if own.is_dir() { own } else { base }, v2))
    };
    let mut asked = asked.clone();
    let mut cpu = None;
    if asked.cpu_quota.is_some() || asked.cpu_period.is_some() {
        let (dir, v2) = group("cpu")?;
        let current = read_cpu(&dir, v2)?;
        let new = resolve_cpu(&asked, current)?;
        (asked.cpu_quota, asked.cpu_period) = (Some(new.0), Some(new.1));
        cpu = Some((dir, cpu_files(current, new, v2)));
    }
    check_policies(&asked, policies)?;
    let mut writes = Vec::new();
    if let Some(pids) = asked.pids {
        let value = match pids {
            Setting::Limit(n) => n.to_string(),
            Setting::Unlimited => "max".into(),
        };
        writes.push((group("pids")?.0, vec![("pids.max", value)]));
    }
    if let Some(memory) = asked.memory {
        let (dir, v2) = group("memory")?;
        let value = match (memory, v2) {
            (Setting::Limit(n), _) => n.to_string(),
            (Setting::Unlimited, true) => "max".into(),
            (Setting::Unlimited, false) => "-1".into(),
        };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        writes.push((dir, vec![(file, value)]));
    }
    writes.extend(cpu);
    let mut written = Vec::new();
    for (dir, files) in writes {
        for (file, value) in files {
            let path = dir.join(file);
            std::fs::write(&path, &value).map_err(|source| UpdateError::Write {
                path: path.clone(),
                source,
            })?;
            written.push(format!("{}={value}", path.display()));
        }
    }
    Ok(written)
}

/// The CPU bandwidth of a group now: (quota, period).
fn read_cpu(dir: &Path, v2: bool) -> Result<(Setting, u64), UpdateError> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path)
            .map(|text| (path.clone(), text.trim().to_string()))
            .map_err(|source| UpdateError::Read { path, source })
    };
    let (path, quota, period) = if v2 {
        let (path, text) = read("cpu.max")?;
        let (quota, period) = text.split_once(' ').unwrap_or((text.as_str(), ""));
        (path.clone(), quota.to_string(), period.to_string())
    } else {
        let (_, quota) = read("cpu.cfs_quota_us")?;
        let (path, period) = read("cpu.cfs_period_us")?;
        (path, quota, period)
    };
    let bad = || UpdateError::BadCurrent {
        path: path.clone(),
        text: format!("{quota} {period}"),
    };
    let quota = match quota.as_str() {
        "max" | "-1" => Setting::Unlimited,
        q => Setting::Limit(q.parse().map_err(|_| bad())?),
    };
    Ok((quota, period.parse().map_err(|_| bad())?))
}

/// The pair an update leaves: what is asked, the rest as it is; refused
/// outside the kernel's bounds (nothing is written then).
fn resolve_cpu(asked: &Asked, current: (Setting, u64)) -> Result<(Setting, u64), UpdateError> {
    let quota = asked.cpu_quota.unwrap_or(current.0);
    let period = asked.cpu_period.unwrap_or(current.1);
    let out_of_bounds = |field: &str, why: String| UpdateError::Unsupported {
        field: field.into(),
        why,
    };
    if !(CPU_PERIOD_MIN..=CPU_PERIOD_MAX).contains(&period) {
        return Err(out_of_bounds(
            "cpu.period",
            format!("{period} µs is outside the kernel's {CPU_PERIOD_MIN}..{CPU_PERIOD_MAX}"),
        ));
    }
    if let Setting::Limit(q) = quota
        && q < CPU_QUOTA_MIN
    {
        return Err(out_of_bounds(
            "cpu.quota",
            format!("{q} µs is below the kernel's least, {CPU_QUOTA_MIN}"),
        ));
    }
    Ok((quota, period))
}

/// The CPU bandwidth files to write, in order. v2: one write of both. v1:
/// two writes, in the order whose state between them is the narrower
/// (never wider than both the old pair and the new, so never wider than a
/// policy both are within).
fn cpu_files(
    current: (Setting, u64),
    new: (Setting, u64),
    v2: bool,
) -> Vec<(&'static str, String)> {
    let (quota, period) = new;
    if v2 {
        let quota = match quota {
            Setting::Limit(q) => q.to_string(),
            Setting::Unlimited => "max".into(),
        };
        return vec![("cpu.max", format!("{quota} {period}"))];
    }
    let quota_file = (
        "cpu.cfs_quota_us",
        match quota {
            Setting::Limit(q) => q.to_string(),
            Setting::Unlimited => "-1".into(),
        },
    );
    let period_file = ("cpu.cfs_period_us", period.to_string());
    // Between the writes: (old quota, new period) or (new quota, old period).
    let period_first = (current.0, period);
    let quota_first = (quota, current.1);
    if narrower(period_first, quota_first) {
        vec![period_file, quota_file]
    } else {
        vec![quota_file, period_file]
    }
}

/// Whether bandwidth `a` (quota, period) is at most `b`.
fn narrower(a: (Setting, u64), b: (Setting, u64)) -> bool {
    match (a.0, b.0) {
        (_, Setting::Unlimited) => true,
        (Setting::Unlimited, Setting::Limit(_)) => false,
        (Setting::Limit(qa), Setting::Limit(qb)) => {
            u128::from(qa) * u128::from(b.1) <= u128::from(qb) * u128::from(a.1)
        }
    }
}

/// The v1 hierarchy of `controller`, else v2 when it has it there.
fn hierarchy<'a>(
    all: &'a [Hierarchy],
    controller: &'static str,
) -> Result<(&'a Hierarchy, bool), UpdateError> {
    let has = |h: &&Hierarchy| h.controllers.iter().any(|c| c == controller);
    all.iter()
        .filter(|h| !h.v2)
        .find(has)
        .map(|h| (h, false))
        .or_else(|| all.iter().filter(|h| h.v2).find(has).map(|h| (h, true)))
        .ok_or(UpdateError::NoController { controller })
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrat_policy::model::LimitEnforcement;

    fn limits(pids: Option<u64>, memory: Option<u64>, cpu: Option<f64>) -> CgroupLimits {
        CgroupLimits {
            pids_max: pids,
            memory_max: memory,
            cpu_max: cpu,
            enforcement: LimitEnforcement::Required,
        }
    }

    #[test]
    fn resources_are_read_as_runc_takes_them() {
        let asked = parse(
            br#"{"pids":{"limit":-1},"memory":{"limit":67108864,"swap":134217728},
                 "cpu":{"quota":50000,"period":100000,"shares":512},
                 "devices":[{"allow":false,"access":"rwm"}],
                 "hugepageLimits":[{"pageSize":"2MB","limit":0}]}"#,
        )
        .unwrap_or_default();
        assert_eq!(asked.pids, Some(Setting::Unlimited));
        assert_eq!(asked.memory, Some(Setting::Limit(67_108_864)));
        assert_eq!(asked.cpu_quota, Some(Setting::Limit(50_000)));
        assert_eq!(asked.notes.len(), 4, "{:?}", asked.notes);
        for refused in [
            r#"{"cpu":{"cpus":"0-1"}}"#,
            r#"{"memory":{"reservation":1024}}"#,
            r#"{"blockIO":{"weight":10}}"#,
            r#"{"hugepageLimits":[{"pageSize":"2MB","limit":1048576}]}"#,
            r#"{"frobnicate":1}"#,
        ] {
            assert!(parse(refused.as_bytes()).is_err(), "{refused} accepted");
        }
    }

    #[test]
    fn an_update_above_a_policy_is_refused_by_its_name() {
        let policies = [(
            "worker".to_string(),
            limits(Some(256), Some(1 << 30), Some(2.0)),
        )];
        let within = Asked {
            pids: Some(Setting::Limit(200)),
            memory: Some(Setting::Limit(1 << 29)),
            cpu_quota: Some(Setting::Limit(150_000)),
            ..Asked::default()
        };
        assert!(check_policies(&within, &policies).is_ok());
        let cases = [
            (
                Asked {
                    pids: Some(Setting::Limit(4096)),
                    ..Asked::default()
                },
                "pids_max",
            ),
            (
                Asked {
                    pids: Some(Setting::Unlimited),
                    ..Asked::default()
                },
                "pids_max",
            ),
            (
                Asked {
                    memory: Some(Setting::Limit(1 << 31)),
                    ..Asked::default()
                },
                "memory_max",
            ),
            (
                Asked {
                    cpu_quota: Some(Setting::Limit(300_000)),
                    ..Asked::default()
                },
                "cpu_max",
            ),
        ];
        for (asked, limit) in cases {
            let err = check_policies(&asked, &policies)
                .err()
                .map(|e| e.to_string());
            let text = err.unwrap_or_default();
            assert!(
                text.contains("policy `worker`") && text.contains(limit),
                "{text}"
            );
        }
    }

    #[test]
    fn v1_cpu_writes_go_in_the_order_never_wider_between_them() {
        let l = Setting::Limit;
        // 1 CPU to 1 CPU at a shorter period: quota first (0.5 between),
        // not period first (2 CPUs between).
        let files = cpu_files((l(100_000), 100_000), (l(50_000), 50_000), false);
        assert_eq!(files[0].0, "cpu.cfs_quota_us");
        // Longer period: period first (0.5 between), not quota (2).
        let files = cpu_files((l(100_000), 100_000), (l(200_000), 200_000), false);
        assert_eq!(files[0].0, "cpu.cfs_period_us");
        // From no limit: the quota first.
        let files = cpu_files((Setting::Unlimited, 100_000), (l(50_000), 50_000), false);
        assert_eq!(files[0].0, "cpu.cfs_quota_us");
        // v2: one write, the quota kept.
        let asked = Asked {
            cpu_period: Some(50_000),
            ..Asked::default()
        };
        let new = resolve_cpu(&asked, (l(20_000), 100_000)).unwrap_or((Setting::Unlimited, 0));
        assert_eq!(new, (l(20_000), 50_000));
        let files = cpu_files((l(20_000), 100_000), new, true);
        assert_eq!(files, vec![("cpu.max", "20000 50000".to_string())]);
        for (quota, period) in [(None, 999), (None, 1_000_001), (Some(l(999)), 100_000)] {
            let asked = Asked {
                cpu_quota: quota,
                cpu_period: Some(period),
                ..Asked::default()
            };
            assert!(resolve_cpu(&asked, (l(50_000), 100_000)).is_err());
        }
        assert_eq!(Setting::of(0), None);
        assert_eq!(Setting::of(-1), Some(Setting::Unlimited));
    }
}
