//! Landlock, applied inside the sandbox after every mount (a Landlocked
//! task may not mount) and before capabilities are dropped.

use std::os::fd::OwnedFd;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};
use substrat_policy::model::LandlockMode;

use crate::plan::{LANDLOCK_UNIX_CONNECT_ABI, LandlockAccess, LandlockPlan};

/// The ABI whose rights we ask for: filesystem incl. ioctl on devices (5),
/// scoping of abstract Unix sockets and signals (6); TCP is not handled
/// (the network namespace decides). Older kernels
/// enforce the subset they know (reported as partial).
const TARGET_ABI: ABI = ABI::V6;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockReport {
    pub mode: LandlockMode,
    /// `full`, `partial`, `none` (kernel without Landlock) or `off` (policy).
    pub status: String,
    pub kernel_abi: u32,
    pub rules: usize,
    /// Rule paths that do not exist in the sandbox (skipped optional binds).
    pub skipped: Vec<String>,
    pub scoped: bool,
    /// connect(2) to pathname Unix sockets restricted to the plan's
    /// `Connect` rules (ABI 9); false: not restricted by Landlock.
    #[serde(default)]
    pub unix_connect: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error(
        "landlock is required by the policy but this kernel does not enforce it (ABI {0}); refusing to run. Use landlock = \"best-effort\" to run without it"
    )]
    Required(u32),
}

fn access(kind: LandlockAccess) -> BitFlags<AccessFs> {
    let abi = TARGET_ABI;
    match kind {
        LandlockAccess::ReadExec => AccessFs::from_read(abi),
        LandlockAccess::ReadWriteExec => AccessFs::from_all(abi),
        LandlockAccess::Device => {
            AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::IoctlDev
        }
        LandlockAccess::Proc => AccessFs::from_read(abi) | AccessFs::WriteFile,
        LandlockAccess::ListDirs => AccessFs::ReadDir.into(),
        LandlockAccess::Connect => AccessFs::ResolveUnix.into(),
    }
}

/// The rights the ruleset handles: those of `TARGET_ABI`, and connect to
/// a pathname Unix socket when the plan asks (it does only on a kernel
/// with ABI 9: asked elsewhere, best effort would make the ruleset
/// partial).
fn handled(plan: &LandlockPlan) -> BitFlags<AccessFs> {
    let mut rights = AccessFs::from_all(TARGET_ABI);
    if plan.unix_connect {
        rights |= AccessFs::ResolveUnix;
    }
    rights
}

/// How a rule's path is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulePaths {
    /// Links followed: the plan's own rules, on its mount targets.
    FollowLinks,
    /// A path through a link is skipped (reported as absent): a layered
    /// policy's rules name paths of a tree its author did not make (an
    /// image's `/tmp -> /` must not make `/tmp`'s rights the root's). A
    /// link's target is reached through the link only if a rule allows it.
    NoLinks,
}

/// This kernel's Landlock ABI (0: none).
pub fn kernel_abi() -> u32 {
    crate::sys::landlock_abi_version().unwrap_or(0)
}

pub fn apply(plan: &LandlockPlan, kernel_abi: u32) -> Result<LandlockReport, LandlockError> {
    apply_with(plan, kernel_abi, RulePaths::FollowLinks)
}

pub fn apply_with(
    plan: &LandlockPlan,
    kernel_abi: u32,
    paths: RulePaths,
) -> Result<LandlockReport, LandlockError> {
    let mut report = LandlockReport {
        mode: plan.mode,
        status: "off".into(),
        kernel_abi,
        rules: 0,
        skipped: Vec::new(),
        scoped: false,
        unix_connect: false,
    };
    if plan.mode == LandlockMode::Off {
        return Ok(report);
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled(plan))?;
    if plan.scope {
        ruleset = ruleset.scope(Scope::from_all(TARGET_ABI))?;
    }
    let mut created = ruleset.create()?;
    for rule in &plan.rules {
        match open_rule_path(&rule.path, paths) {
            Some((fd, is_dir)) => {
                // A rule on a file may only carry rights that apply to files.
                let mut rights = access(rule.access);
                if !is_dir {
                    rights &= AccessFs::from_file(TARGET_ABI) | AccessFs::ResolveUnix;
                }
                created = created.add_rule(PathBeneath::new(fd, rights))?;
                report.rules += 1;
            }
            None => report.skipped.push(rule.path.display().to_string()),
        }
    }
    let status = created.restrict_self()?;
    report.status = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        RulesetStatus::NotEnforced => "none",
    }
    .into();
    let enforced = status.ruleset != RulesetStatus::NotEnforced;
    report.scoped = plan.scope && enforced && kernel_abi >= 6;
    report.unix_connect = plan.unix_connect && enforced && kernel_abi >= LANDLOCK_UNIX_CONNECT_ABI;
    if !enforced && plan.mode == LandlockMode::Required {
        return Err(LandlockError::Required(kernel_abi));
    }
    Ok(report)
}

/// The rule's path opened (O_PATH) and whether it is a directory; none
/// when absent, or (`NoLinks`) reached through a link.
fn open_rule_path(path: &std::path::Path, paths: RulePaths) -> Option<(OwnedFd, bool)> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    let fd = match paths {
        RulePaths::FollowLinks => rustix::fs::open(path, flags, Mode::empty()).ok()?,
        // A link anywhere, the last component included, fails (ELOOP).
        RulePaths::NoLinks => rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            flags,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        )
        .ok()?,
    };
    let is_dir = rustix::fs::fstat(&fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
    });
    Some((fd, is_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ruleset handles connect only for a plan that asks (built on an
    /// ABI 9 kernel); a Connect rule grants that right and nothing else.
    #[test]
    fn connect_is_handled_only_when_the_plan_asks() {
        let mut plan = LandlockPlan {
            mode: LandlockMode::Required,
            rules: Vec::new(),
            scope: true,
            unix_connect: false,
        };
        assert_eq!(handled(&plan), AccessFs::from_all(ABI::V6));
        assert!(!handled(&plan).contains(AccessFs::ResolveUnix));
        plan.unix_connect = true;
        assert_eq!(
            handled(&plan),
            AccessFs::from_all(ABI::V6) | AccessFs::ResolveUnix
        );
        assert_eq!(access(LandlockAccess::Connect), AccessFs::ResolveUnix);
        for kind in [LandlockAccess::ReadExec, LandlockAccess::ReadWriteExec] {
            assert!(!access(kind).contains(AccessFs::ResolveUnix), "{kind:?}");
        }
    }
}
