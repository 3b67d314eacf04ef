//! The run report (`run --report FILE`): what was enforced, layer by layer,
//! and what was not and why. Documented in docs/run.md.

use std::path::Path;

use serde::Serialize;

use crate::cgroup::{CgroupReport, LimitOutcome};
use crate::hostid::HostIds;
use crate::plan::{Access, LaunchPlan, MountStep, Namespaces};
use crate::supervise::{Backend, RunOutcome};

/// 2: `binds[]` added, `landlock.deny_tcp` gone (Landlock handles no TCP).
pub const REPORT_FORMAT_VERSION: u32 = 2;

#[derive(Debug, Serialize)]
pub struct RunReport<'a> {
    pub format_version: u32,
    pub backend: Backend,
    /// Why this backend: requested, or what `auto` found.
    pub backend_reason: &'a str,
    pub policy: &'a str,
    pub namespaces: Namespaces,
    pub uid_map: String,
    pub gid_map: String,
    pub host_ids: HostIdsReport,
    /// Every bind of the plan, in mount order, and whether it was made.
    pub binds: Vec<BindEntry<'a>>,
    #[serde(flatten)]
    pub setup: &'a crate::supervise::SetupReport,
    pub seccomp: Option<&'a crate::seccomp::SeccompReport>,
    pub cgroup: &'a CgroupReport,
    /// Everything enforced less than the policy asked, in words.
    pub warnings: Vec<String>,
    pub exit_code: i32,
    pub terminated_by_signal: Option<i32>,
}

/// One bind as the run made it (or skipped it: an optional source absent).
#[derive(Debug, Serialize)]
pub struct BindEntry<'a> {
    pub source: &'a Path,
    pub target: &'a Path,
    pub access: Access,
    pub optional: bool,
    pub skipped: bool,
}

/// Every bind of `plan`; `skipped`: the optional sources found absent.
pub fn bind_entries<'a>(plan: &'a LaunchPlan, skipped: &[String]) -> Vec<BindEntry<'a>> {
    plan.mounts
        .iter()
        .filter_map(|step| match step {
            MountStep::Bind {
                source,
                target,
                access,
                optional,
                ..
            } => Some(BindEntry {
                source,
                target,
                access: *access,
                optional: *optional,
                skipped: skipped.iter().any(|s| Path::new(s) == source.as_path()),
            }),
            _ => None,
        })
        .collect()
}

/// Whose host ids the command ran as.
#[derive(Debug, Serialize)]
pub struct HostIdsReport {
    pub uid: u32,
    pub gid: u32,
    /// `launcher`: the launching user's own; `subordinate`: claimed from
    /// root's subordinate ranges (launched by root, never root).
    pub from: &'static str,
}

impl<'a> RunReport<'a> {
    pub fn new(
        plan: &'a LaunchPlan,
        outcome: &'a RunOutcome,
        backend_reason: &'a str,
        host_ids: &HostIds,
    ) -> Self {
        Self {
            format_version: REPORT_FORMAT_VERSION,
            backend: outcome.backend,
            backend_reason,
            policy: &plan.policy_name,
            namespaces: plan.namespaces,
            uid_map: format!("{} {} 1", plan.uid_map.inside, plan.uid_map.outside),
            gid_map: format!("{} {} 1", plan.gid_map.inside, plan.gid_map.outside),
            host_ids: HostIdsReport {
                uid: plan.uid_map.outside,
                gid: plan.gid_map.outside,
                from: match host_ids {
                    HostIds::Launcher => "launcher",
                    HostIds::Subordinate(_) => "subordinate",
                },
            },
            binds: bind_entries(plan, &outcome.setup.mounts.skipped_optional),
            setup: &outcome.setup,
            seccomp: outcome.seccomp.as_ref(),
            cgroup: &outcome.cgroup,
            warnings: weaker_than_asked(plan, outcome),
            exit_code: outcome.exit_code,
            terminated_by_signal: outcome.terminated_by,
        }
    }
}

/// What ran less confined than the policy asked; also printed on stderr.
pub fn weaker_than_asked(plan: &LaunchPlan, outcome: &RunOutcome) -> Vec<String> {
    let mut out = Vec::new();
    let s = &outcome.setup;
    if !plan.namespaces.nested_userns && !s.nested_userns_blocked {
        out.push("nested user namespaces are not blocked by the kernel limit (this bwrap lacks --disable-userns); seccomp still denies unshare and CLONE_NEWUSER".into());
    }
    match s.landlock.status.as_str() {
        "full" | "off" => {}
        "partial" => {
            let mut missing = Vec::new();
            if s.landlock.kernel_abi < 3 {
                missing.push("truncation rules (ABI 3)");
            }
            if s.landlock.kernel_abi < 5 {
                missing.push("device ioctl rules (ABI 5)");
            }
            if s.landlock.kernel_abi < 6 {
                missing.push("abstract-socket and signal scoping (ABI 6)");
            }
            out.push(format!(
                "landlock partially enforced (kernel ABI {}); missing: {}",
                s.landlock.kernel_abi,
                missing.join(", ")
            ))
        }
        other => out.push(format!("landlock not enforced ({other})")),
    }
    for (name, limit) in [
        ("pids_max", &outcome.cgroup.pids_max),
        ("memory_max", &outcome.cgroup.memory_max),
        ("cpu_max", &outcome.cgroup.cpu_max),
    ] {
        if let LimitOutcome::NotApplied { reason } = limit {
            out.push(format!("cgroup.{name} not applied: {reason}"));
        }
    }
    for r in s.rlimits.iter().filter(|r| !r.applied) {
        out.push(format!(
            "rlimit {:?} not applied: {}",
            r.name,
            r.note.as_deref().unwrap_or("")
        ));
    }
    if let Some(seccomp) = outcome
        .seccomp
        .as_ref()
        .filter(|s| !s.unknown_syscalls.is_empty())
    {
        out.push(format!(
            "seccomp rules naming syscalls this system does not know were skipped: {}",
            seccomp.unknown_syscalls.join(", ")
        ));
    }
    for path in &s.mounts.skipped_optional {
        out.push(format!(
            "optional bind source {path} does not exist: skipped"
        ));
    }
    out
}
