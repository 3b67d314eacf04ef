//! Compiling an OCI seccomp profile with libseccomp, for the native
//! architecture only (other architectures, such as i386 `int 0x80` on
//! x86_64, are killed). Loaded last, just before the command runs.

use std::collections::BTreeMap;

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use serde::{Deserialize, Serialize};
use substrat_policy::seccomp::{Action, ArgFilter, CompareOp, Verdict};

use crate::plan::SeccompPlan;

const EPERM: i32 = 1;
const ENOSYS: i32 = 38;
const S_ISUID: u64 = 0o4000;
const S_ISGID: u64 = 0o2000;

/// Every call that takes a file mode the kernel stores, with the index of
/// that argument. A set-user-id or set-group-id bit in it is refused, so no
/// file the command leaves on a host path can carry one (the host is not
/// behind our nosuid mounts; launched by root, a setuid copy of a shell
/// would be host root's). mkdir and mkdirat are not here: the kernel drops
/// both bits from their mode (a directory inherits set-group-id only from a
/// parent that has it, which the command cannot give one).
const MODE_ARGUMENTS: &[(&str, u32)] = &[
    ("chmod", 1),
    ("fchmod", 1),
    ("fchmodat", 2),
    ("fchmodat2", 2),
    ("open", 2),
    ("openat", 3),
    ("creat", 1),
    ("mknod", 1),
    ("mknodat", 2),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompReport {
    pub profile: String,
    pub path: String,
    pub default_action: String,
    /// Syscall names per action (`allow`, `errno(38)`...).
    pub actions: BTreeMap<String, usize>,
    /// Names this kernel/architecture does not know, skipped.
    pub unknown_syscalls: Vec<String>,
    pub socket_families: Vec<String>,
    pub bad_arch_action: String,
    /// Argument-specific denials with the default's own action (TIOCSTI...),
    /// which libseccomp cannot express in the allowlist; they form a second
    /// filter with default allow. The kernel applies the strictest verdict.
    pub deny_rules: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: export: {0}")]
    Export(String),
    #[error("seccomp: {0}")]
    Libseccomp(#[from] libseccomp::error::SeccompError),
    #[error("seccomp: errno value {0} is out of range")]
    Errno(u32),
    #[error(
        "seccomp: libseccomp does not know `{0}`, so its set-id modes cannot be refused under a profile that allows by default"
    )]
    Unfilterable(String),
}

fn action(
    action: Action,
    errno: Option<u32>,
    default_errno: i32,
) -> Result<ScmpAction, SeccompError> {
    let errno = match errno {
        Some(e) => i32::try_from(e).map_err(|_| SeccompError::Errno(e))?,
        None => default_errno,
    };
    Ok(match action {
        Action::Kill | Action::KillThread => ScmpAction::KillThread,
        Action::KillProcess => ScmpAction::KillProcess,
        Action::Trap => ScmpAction::Trap,
        Action::Errno => ScmpAction::Errno(errno),
        Action::Trace => ScmpAction::Trace(0),
        Action::Log => ScmpAction::Log,
        Action::Allow => ScmpAction::Allow,
    })
}

fn describe(action: ScmpAction) -> String {
    match action {
        ScmpAction::Errno(e) => format!("errno({e})"),
        ScmpAction::Allow => "allow".into(),
        ScmpAction::KillProcess => "kill-process".into(),
        ScmpAction::KillThread => "kill-thread".into(),
        ScmpAction::Trap => "trap".into(),
        ScmpAction::Log => "log".into(),
        ScmpAction::Trace(_) => "trace".into(),
        ScmpAction::Notify => "notify".into(),
        _ => "other".into(),
    }
}

fn compare(arg: &ArgFilter) -> ScmpArgCompare {
    let (op, datum) = match arg.op {
        CompareOp::NotEqual => (ScmpCompareOp::NotEqual, arg.value),
        CompareOp::Less => (ScmpCompareOp::Less, arg.value),
        CompareOp::LessOrEqual => (ScmpCompareOp::LessOrEqual, arg.value),
        CompareOp::Equal => (ScmpCompareOp::Equal, arg.value),
        CompareOp::GreaterOrEqual => (ScmpCompareOp::GreaterEqual, arg.value),
        CompareOp::Greater => (ScmpCompareOp::Greater, arg.value),
        // OCI: `value` is the mask, `valueTwo` the value compared with.
        CompareOp::MaskedEqual => (ScmpCompareOp::MaskedEqual(arg.value), arg.value_two),
    };
    ScmpArgCompare::new(arg.index, op, datum)
}

/// Builds the filters, in the order they must be loaded. `socket` is decided
/// by the plan's families, not by the profile's own socket rules (unless the
/// profile denies socket entirely).
pub fn compile(
    plan: &SeccompPlan,
) -> Result<(Vec<ScmpFilterContext>, SeccompReport), SeccompError> {
    let profile = &plan.profile;
    let default_errno = match profile.default_errno_ret {
        Some(e) => i32::try_from(e).map_err(|_| SeccompError::Errno(e))?,
        None => EPERM,
    };
    let default_action = action(profile.default_action, None, default_errno)?;
    let mut filter = ScmpFilterContext::new(default_action)?;
    filter.set_act_badarch(ScmpAction::KillProcess)?;
    let mut deny = ScmpFilterContext::new(ScmpAction::Allow)?;
    deny.set_act_badarch(ScmpAction::KillProcess)?;
    let mut report = SeccompReport {
        profile: plan.name.clone(),
        path: plan.path.display().to_string(),
        default_action: describe(default_action),
        actions: BTreeMap::new(),
        unknown_syscalls: Vec::new(),
        socket_families: Vec::new(),
        bad_arch_action: "kill-process".into(),
        deny_rules: 0,
    };
    for rule in &profile.syscalls {
        let act = action(rule.action, rule.errno_ret, default_errno)?;
        let comparisons: Vec<ScmpArgCompare> = rule.args.iter().map(compare).collect();
        if act == default_action {
            if !comparisons.is_empty() {
                add_deny(&mut deny, &rule.names, act, &comparisons, &mut report)?;
            }
            continue; // unconditional: the default already does this
        }
        for name in rule.names.iter().filter(|n| n.as_str() != "socket") {
            let Ok(syscall) = ScmpSyscall::from_name(name) else {
                report.unknown_syscalls.push(name.clone());
                continue;
            };
            if comparisons.is_empty() {
                filter.add_rule(act, syscall)?;
            } else {
                filter.add_rule_conditional(act, syscall, &comparisons)?;
            }
            *report.actions.entry(describe(act)).or_default() += 1;
        }
    }
    // socket(): the profile only says whether it is allowed at all; the
    // families come from the policy and are enforced by denying every
    // other family in the deny filter, which works whatever the profile's
    // default action is.
    if profile.verdict("socket") != Verdict::Denied {
        let socket = ScmpSyscall::from_name("socket")?;
        if !profile.default_action.permits() {
            filter.add_rule(ScmpAction::Allow, socket)?;
        }
        let allowed: Vec<u64> = plan.socket_families.iter().map(|f| f.number()).collect();
        for compare in denied_families(&allowed) {
            deny.add_rule_conditional(ScmpAction::Errno(EPERM), socket, &[compare])?;
            report.deny_rules += 1;
        }
        report.socket_families = plan
            .socket_families
            .iter()
            .map(|f| format!("{f:?}").to_lowercase())
            .collect();
    }
    deny_set_id_modes(&mut deny, profile.default_action.permits(), &mut report)?;
    // The deny filter goes in first: once the allowlist is loaded, loading
    // another filter needs `seccomp` to be allowed by it.
    let filters = if report.deny_rules > 0 {
        vec![deny, filter]
    } else {
        vec![filter]
    };
    Ok((filters, report))
}

fn add_deny(
    deny: &mut ScmpFilterContext,
    names: &[String],
    act: ScmpAction,
    comparisons: &[ScmpArgCompare],
    report: &mut SeccompReport,
) -> Result<(), SeccompError> {
    for name in names {
        let Ok(syscall) = ScmpSyscall::from_name(name) else {
            report.unknown_syscalls.push(name.clone());
            continue;
        };
        deny.add_rule_conditional(act, syscall, comparisons)?;
        report.deny_rules += 1;
    }
    Ok(())
}

/// Refuses (EPERM) set-id bits in every mode argument, whatever the
/// profile says: the rules go into the deny filter, which the kernel
/// applies on top of the allowlist. openat2 passes its mode inside a struct
/// seccomp cannot read: it gets ENOSYS, and callers fall back to openat;
/// so does io_uring_setup (an io_uring open request holds its mode too).
/// `default_permits`: a name libseccomp does not know can then not be
/// filtered and would be allowed, so the build fails instead.
fn deny_set_id_modes(
    deny: &mut ScmpFilterContext,
    default_permits: bool,
    report: &mut SeccompReport,
) -> Result<(), SeccompError> {
    let syscall = |name: &str| match ScmpSyscall::from_name(name) {
        Ok(syscall) => Ok(Some(syscall)),
        Err(_) if default_permits => Err(SeccompError::Unfilterable(name.to_string())),
        // Unknown to libseccomp, so the allowlist cannot allow it either.
        Err(_) => Ok(None),
    };
    for (name, index) in MODE_ARGUMENTS {
        let Some(call) = syscall(name)? else { continue };
        for bit in [S_ISUID, S_ISGID] {
            let compare = ScmpArgCompare::new(*index, ScmpCompareOp::MaskedEqual(bit), bit);
            deny.add_rule_conditional(ScmpAction::Errno(EPERM), call, &[compare])?;
            report.deny_rules += 1;
        }
    }
    // openat2 and io_uring's open requests carry the mode in memory;
    // io_uring matters under a profile that allows by default (the shipped
    // one denies it).
    for name in ["openat2", "io_uring_setup"] {
        if let Some(call) = syscall(name)? {
            deny.add_rule(ScmpAction::Errno(ENOSYS), call)?;
            report.deny_rules += 1;
        }
    }
    Ok(())
}

/// Comparisons on socket()'s domain (all 64 bits, so garbage in the upper
/// half is denied too) that together match every family not in `allowed`:
/// an equality for each value in a small gap, `>=` for the open end.
fn denied_families(allowed: &[u64]) -> Vec<ScmpArgCompare> {
    let mut allowed = allowed.to_vec();
    allowed.sort_unstable();
    allowed.dedup();
    let mut out = Vec::new();
    let mut next = 0u64;
    for &family in &allowed {
        for value in next..family {
            out.push(ScmpArgCompare::new(0, ScmpCompareOp::Equal, value));
        }
        next = family + 1;
    }
    out.push(ScmpArgCompare::new(0, ScmpCompareOp::GreaterEqual, next));
    out
}

/// The programs of every filter of `plan` (its own, then its layers'), in
/// loading order, and the report of its own.
pub fn export_plan(
    plan: &crate::plan::LaunchPlan,
) -> Result<(Vec<Vec<u8>>, Option<SeccompReport>), SeccompError> {
    let mut programs = Vec::new();
    let mut own = None;
    for (index, filter) in plan.seccomp_filters().enumerate() {
        let (mut compiled, report) = export(filter)?;
        programs.append(&mut compiled);
        if index == 0 && plan.seccomp.is_some() {
            own = Some(report);
        }
    }
    Ok((programs, own))
}

/// Compiles the plan and exports each filter as a classic BPF program, in
/// load order: the launcher compiles while the sandbox is being built, and
/// init loads the programs as its last step.
pub fn export(plan: &SeccompPlan) -> Result<(Vec<Vec<u8>>, SeccompReport), SeccompError> {
    use std::io::{Read, Seek};
    let (filters, report) = compile(plan)?;
    let mut programs = Vec::new();
    for filter in filters {
        let fd = nix::sys::memfd::memfd_create(
            "substrat-seccomp",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| SeccompError::Export(e.to_string()))?;
        filter.export_bpf(&fd)?;
        let mut file = std::fs::File::from(fd);
        let mut program = Vec::new();
        file.rewind()
            .and_then(|_| file.read_to_end(&mut program))
            .map_err(|e| SeccompError::Export(e.to_string()))?;
        programs.push(program);
    }
    Ok((programs, report))
}
