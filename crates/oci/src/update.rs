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
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One limit: a number, or none (`-1`, `0`: what runc takes for unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Limit(u64),
    Unlimited,
}

impl Setting {
    fn of(value: i64) -> Self {
        match u64::try_from(value) {
            Ok(n) if n > 0 => Self::Limit(n),
            _ => Self::Unlimited,
        }
    }
}

/// What an update asks; a field not given stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub pids: Option<Setting>,
    /// Bytes.
    pub memory: Option<Setting>,
    /// CFS quota in microseconds.
    pub cpu_quota: Option<Setting>,
    /// CFS period in microseconds (100 ms when not given, as runc).
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
    if let Some(pids) = &resources.pids {
        asked.pids = Some(Setting::of(pids.limit));
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
        asked.memory = memory.limit.map(Setting::of);
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
        asked.cpu_quota = cpu.quota.map(Setting::of);
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
        if let (Some(a), Some(cpus)) = (asked.cpu_quota, limits.cpu_max) {
            let period = asked.cpu_period.unwrap_or(100_000) as f64;
            let wider = match a {
                Setting::Limit(q) => q as f64 / period > cpus + 1e-9,
                Setting::Unlimited => true,
            };
            if wider {
                return Err(UpdateError::AbovePolicy {
                    field: "cpu.quota",
                    asked: match a {
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

/// Writes the limits asked; returns `file=value` for each written.
pub fn apply(
    cgroups_path: &str,
    id: &str,
    launcher: i32,
    asked: &Asked,
) -> Result<Vec<String>, UpdateError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let all = hierarchies(&mountinfo);
    let relative = Path::new(cgroups_path.trim_start_matches('/'));
    let sandbox = format!("substrat-{id}-{launcher}");
    let mut written = Vec::new();
    let mut write = |controller: &'static str,
                     files: &dyn Fn(bool) -> Vec<(&'static str, String)>| {
        let (h, v2) = hierarchy(&all, controller)?;
        let base = h.mount_point.join(relative);
        let own = base.join(&sandbox);
        let group = if own.is_dir() { own } else { base };
        for (file, value) in files(v2) {
            let path = group.join(file);
            std::fs::write(&path, &value).map_err(|source| UpdateError::Write {
                path: path.clone(),
                source,
            })?;
            written.push(format!("{}={value}", path.display()));
        }
        Ok::<(), UpdateError>(())
    };
    if let Some(pids) = asked.pids {
        write("pids", &|_| {
            vec![(
                "pids.max",
                match pids {
                    Setting::Limit(n) => n.to_string(),
                    Setting::Unlimited => "max".into(),
                },
            )]
        })?;
    }
    if let Some(memory) = asked.memory {
        write("memory", &|v2| {
            let value = match (memory, v2) {
                (Setting::Limit(n), _) => n.to_string(),
                (Setting::Unlimited, true) => "max".into(),
                (Setting::Unlimited, false) => "-1".into(),
            };
            vec![(
                if v2 {
                    "memory.max"
                } else {
                    "memory.limit_in_bytes"
                },
                value,
            )]
        })?;
    }
    if asked.cpu_quota.is_some() || asked.cpu_period.is_some() {
        write("cpu", &|v2| cpu_files(asked, v2))?;
    }
    Ok(written)
}

/// The CPU bandwidth files, v1 (period first, as runc) or v2.
fn cpu_files(asked: &Asked, v2: bool) -> Vec<(&'static str, String)> {
    let period = asked.cpu_period.unwrap_or(100_000);
    if v2 {
        let quota = match asked.cpu_quota {
            Some(Setting::Limit(q)) => q.to_string(),
            _ => "max".into(),
        };
        return vec![("cpu.max", format!("{quota} {period}"))];
    }
    let mut files = vec![("cpu.cfs_period_us", period.to_string())];
    if let Some(quota) = asked.cpu_quota {
        files.push((
            "cpu.cfs_quota_us",
            match quota {
                Setting::Limit(q) => q.to_string(),
                Setting::Unlimited => "-1".into(),
            },
        ));
    }
    files
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
                 "cpu":{"quota":50000,"period":100000,"shares":512}}"#,
        )
        .unwrap_or_default();
        assert_eq!(asked.pids, Some(Setting::Unlimited));
        assert_eq!(asked.memory, Some(Setting::Limit(67_108_864)));
        assert_eq!(asked.cpu_quota, Some(Setting::Limit(50_000)));
        assert_eq!(asked.notes.len(), 2, "{:?}", asked.notes);
        for refused in [
            r#"{"cpu":{"cpus":"0-1"}}"#,
            r#"{"memory":{"reservation":1024}}"#,
            r#"{"blockIO":{"weight":10}}"#,
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
}
