//! Landlock, applied inside the sandbox after every mount (a Landlocked
//! task may not mount) and before capabilities are dropped.

use std::os::fd::OwnedFd;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};
use substrat_policy::model::LandlockMode;

use crate::plan::{LandlockAccess, LandlockPlan};

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
    }
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
    };
    if plan.mode == LandlockMode::Off {
        return Ok(report);
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))?;
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
                    rights &= AccessFs::from_file(TARGET_ABI);
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
