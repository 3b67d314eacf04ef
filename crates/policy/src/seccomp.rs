//! Seccomp profiles in the OCI/Docker JSON format (`defaultAction`,
//! `syscalls[]`). Parsing and analysis only; compiling to BPF happens in the
//! sandbox crate. Fields we do not implement (`includes`, `excludes`,
//! `archMap`, `flags`, `listenerPath`) are rejected rather than ignored: a
//! profile that silently loses its conditions is a weaker profile.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, PolicyError};
use crate::source::LineIndex;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeccompProfile {
    pub default_action: Action,
    #[serde(default)]
    pub default_errno_ret: Option<u32>,
    /// Accepted for compatibility; the filter is always built for the native
    /// architecture only, other architectures are killed.
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub syscalls: Vec<SyscallRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SyscallRule {
    pub names: Vec<String>,
    pub action: Action,
    #[serde(default)]
    pub errno_ret: Option<u32>,
    #[serde(default)]
    pub args: Vec<ArgFilter>,
    #[serde(default)]
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ArgFilter {
    pub index: u32,
    pub value: u64,
    #[serde(default)]
    pub value_two: u64,
    pub op: CompareOp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Action {
    #[serde(rename = "SCMP_ACT_KILL")]
    Kill,
    #[serde(rename = "SCMP_ACT_KILL_PROCESS")]
    KillProcess,
    #[serde(rename = "SCMP_ACT_KILL_THREAD")]
    KillThread,
    #[serde(rename = "SCMP_ACT_TRAP")]
    Trap,
    #[serde(rename = "SCMP_ACT_ERRNO")]
    Errno,
    #[serde(rename = "SCMP_ACT_TRACE")]
    Trace,
    #[serde(rename = "SCMP_ACT_LOG")]
    Log,
    #[serde(rename = "SCMP_ACT_ALLOW")]
    Allow,
}

impl Action {
    /// Whether the action lets the syscall run.
    pub fn permits(self) -> bool {
        matches!(self, Action::Allow | Action::Log | Action::Trace)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum CompareOp {
    #[serde(rename = "SCMP_CMP_NE")]
    NotEqual,
    #[serde(rename = "SCMP_CMP_LT")]
    Less,
    #[serde(rename = "SCMP_CMP_LE")]
    LessOrEqual,
    #[serde(rename = "SCMP_CMP_EQ")]
    Equal,
    #[serde(rename = "SCMP_CMP_GE")]
    GreaterOrEqual,
    #[serde(rename = "SCMP_CMP_GT")]
    Greater,
    #[serde(rename = "SCMP_CMP_MASKED_EQ")]
    MaskedEqual,
}

/// Syscalls an agent never needs and that widen the kernel attack surface or
/// let it reach outside its sandbox. `check` reports a profile allowing any.
pub const DANGEROUS_SYSCALLS: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "perf_event_open",
    "mount",
    "umount2",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
];

/// How a profile treats one syscall, ignoring argument values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed whatever the arguments.
    Allowed,
    /// Allowed only for some argument values.
    Conditional,
    Denied,
}

impl SeccompProfile {
    pub fn parse(file: &Path, text: &str) -> Result<Self, PolicyError> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            let location =
                LineIndex::new(text).location(file, offset_of(text, inner.line(), inner.column()));
            PolicyError::new(
                ErrorKind::InvalidSeccompProfile,
                location,
                path,
                without_position(&inner),
            )
        })
    }

    /// The verdict for `name`: the first rule naming it decides, as in
    /// libseccomp a rule with argument filters only matches those values.
    pub fn verdict(&self, name: &str) -> Verdict {
        let rules: Vec<&SyscallRule> = self
            .syscalls
            .iter()
            .filter(|r| r.names.iter().any(|n| n == name))
            .collect();
        let unconditional = rules.iter().find(|r| r.args.is_empty());
        let allowed_by_default = self.default_action.permits();
        match unconditional {
            Some(rule) if rule.action.permits() => Verdict::Allowed,
            Some(_) if rules.iter().any(|r| r.action.permits()) => Verdict::Conditional,
            Some(_) => Verdict::Denied,
            None if rules.is_empty() && allowed_by_default => Verdict::Allowed,
            None if rules.is_empty() => Verdict::Denied,
            None => Verdict::Conditional,
        }
    }

    /// Dangerous syscalls this profile lets through, fully or for some arguments.
    pub fn dangerous_allowed(&self) -> Vec<&'static str> {
        DANGEROUS_SYSCALLS
            .iter()
            .copied()
            .filter(|name| self.verdict(name) != Verdict::Denied)
            .collect()
    }

    /// Dangerous syscalls this profile denies whatever the arguments.
    pub fn dangerous_denied(&self) -> Vec<&'static str> {
        DANGEROUS_SYSCALLS
            .iter()
            .copied()
            .filter(|name| self.verdict(name) == Verdict::Denied)
            .collect()
    }
}

/// serde_json appends " at line L column C"; the location says it already.
fn without_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// serde_json reports 1-based line and column; turn them back into an offset.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let line_start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    line_start + column.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(json: &str) -> SeccompProfile {
        SeccompProfile::parse(Path::new("p.json"), json).unwrap()
    }

    #[test]
    fn verdicts_follow_rules_and_default() {
        let p = profile(
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
                {"names":["read","write"],"action":"SCMP_ACT_ALLOW"},
                {"names":["clone"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":2114060288,"op":"SCMP_CMP_MASKED_EQ"}]},
                {"names":["ptrace"],"action":"SCMP_ACT_ERRNO"}]}"#,
        );
        assert_eq!(p.verdict("read"), Verdict::Allowed);
        assert_eq!(p.verdict("clone"), Verdict::Conditional);
        assert_eq!(p.verdict("ptrace"), Verdict::Denied);
        assert_eq!(p.verdict("bpf"), Verdict::Denied);
        assert!(p.dangerous_allowed().is_empty());
        let open = profile(
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["bpf"],"action":"SCMP_ACT_ERRNO"}]}"#,
        );
        assert_eq!(open.verdict("bpf"), Verdict::Denied);
        assert!(open.dangerous_allowed().contains(&"ptrace"));
    }

    #[test]
    fn unsupported_fields_are_errors_with_position() {
        let err = SeccompProfile::parse(
            Path::new("p.json"),
            "{\n  \"defaultAction\": \"SCMP_ACT_ERRNO\",\n  \"includes\": {}\n}",
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidSeccompProfile);
        assert_eq!(err.location.line, 3);
        assert!(
            err.message.contains("unknown field `includes`"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unknown_action_is_an_error() {
        let err =
            SeccompProfile::parse(Path::new("p.json"), r#"{"defaultAction":"SCMP_ACT_MAYBE"}"#)
                .unwrap_err();
        assert!(err.message.contains("unknown variant"), "{}", err.message);
        assert_eq!(err.key_path, "defaultAction");
    }
}
