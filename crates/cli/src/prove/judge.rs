//! Held, escaped, not attempted, not applicable or error: what each raw
//! outcome of the battery means under the policy. Pure: the policy's
//! facts, the probe's line and what the host saw after the run in, the
//! verdict out. An errno is "held" only when it is one of the attack's
//! refusals (its `refused` list): EFAULT, EINVAL, ENOTTY, EBADF and the
//! like say the call was admitted and failed for another reason, so the
//! attack was not really attempted.

use serde::Serialize;
use substrat_policy::model::NetworkMode;

/// What the judge needs to know of the policy and of the run.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub network: NetworkMode,
    pub nested_userns: bool,
    pub pids_max: Option<u64>,
    pub fsize: Option<u64>,
    /// Memory the battery tried to allocate past the limit, if it did.
    pub memory_tried: bool,
    /// The names the plan's environment has: nothing else may be inside.
    pub env_names: Vec<String>,
    /// Names of protected host paths the run changed (host-side check).
    pub protected_changed: Vec<String>,
    /// The host file outside the binds was written (host-side check).
    pub outside_written: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "why", rename_all = "kebab-case")]
pub enum Verdict {
    Held,
    Escaped(String),
    /// The attack did not happen as meant: its target could not be set
    /// up, or the answer proves no refusal. A failure, never held.
    NotAttempted(String),
    NotApplicable(String),
    Error(String),
}

pub use substrat_battery::{ATTACKS, AttackInfo};

/// The verdict for `attack` whose raw outcome is `outcome`.
pub fn judge(attack: &str, outcome: &str, facts: &Facts) -> Verdict {
    if outcome == "timeout" || outcome.starts_with("error:") || outcome.starts_with("exit:") {
        return Verdict::Error(format!("the attack did not answer: {outcome}"));
    }
    if let Some(why) = outcome.strip_prefix("not-attempted:") {
        return Verdict::NotAttempted(why.to_string());
    }
    let escaped = |why: &str| Verdict::Escaped(format!("{why} ({outcome})"));
    match attack {
        "protected-write"
        | "protected-create"
        | "protected-rename-over"
        | "protected-symlink-swap"
        | "mcp-config-write" => protected(attack, outcome, facts),
        "write-outside" if facts.outside_written => escaped("the host file appeared"),
        "userns" | "clone-newuser" if facts.nested_userns => {
            Verdict::NotApplicable("the policy allows nested user namespaces".into())
        }
        "tcp-host-loopback" | "tcp-host-address" | "abstract-socket"
            if facts.network == NetworkMode::Host && outcome == "ok" =>
        {
            escaped("the policy shares the host's network")
        }
        "capabilities" => capabilities(outcome),
        "process-visibility" | "proc-secret" => match outcome {
            o if o.starts_with("value:found") => escaped("it was there"),
            o if o.starts_with("value:absent") => Verdict::Held,
            _ => Verdict::Error(format!("unexpected answer {outcome}")),
        },
        "setid-file" => setid(outcome),
        "environment" => environment(outcome, facts),
        "limit-fsize" => limit_fsize(outcome, facts),
        "limit-memory" => limit_memory(outcome, facts),
        "limit-pids" => limit_pids(outcome, facts),
        other => by_errno(other, outcome),
    }
}

/// An attack judged by its errno: held only on one of its refusals.
fn by_errno(attack: &str, outcome: &str) -> Verdict {
    let refused = ATTACKS
        .iter()
        .find(|a| a.id == attack)
        .map_or(&[][..], |a| a.refused);
    match outcome.strip_prefix("errno:") {
        Some(errno) if refused.contains(&errno) => Verdict::Held,
        Some(errno) => Verdict::NotAttempted(format!(
            "{errno} proves no refusal (held only on {}): the call was admitted and failed otherwise",
            refused.join(", ")
        )),
        None if outcome == "ok" => Verdict::Escaped(format!("{attack} went through ({outcome})")),
        None => Verdict::Error(format!("unexpected answer {outcome}")),
    }
}

/// Judged on the host: whatever happened inside (the workspace's own
/// `.git` is the command's to write), only a change of the host's
/// protected paths is an escape.
fn protected(attack: &str, outcome: &str, facts: &Facts) -> Verdict {
    let target = match attack {
        "protected-write" | "protected-rename-over" => ".git/config",
        "protected-create" => ".git/hooks/pre-commit",
        "protected-symlink-swap" => ".git/hooks",
        _ => ".cursor/mcp.json",
    };
    if facts.protected_changed.iter().any(|c| c == target) {
        Verdict::Escaped(format!("the host's {target} changed ({outcome})"))
    } else {
        Verdict::Held
    }
}

fn capabilities(outcome: &str) -> Verdict {
    let Some(fields) = outcome.strip_prefix("value:") else {
        return Verdict::Error(format!("unexpected answer {outcome}"));
    };
    let held = fields.split(',').all(|field| match field.split_once('=') {
        Some((name, value)) if name.starts_with("Cap") => value.chars().all(|c| c == '0'),
        Some(("NoNewPrivs", value)) => value == "1",
        _ => true,
    });
    match held {
        true => Verdict::Held,
        false => Verdict::Escaped(format!("capabilities or privileges remain ({fields})")),
    }
}

fn setid(outcome: &str) -> Verdict {
    let Some(fields) = outcome.strip_prefix("value:") else {
        return Verdict::Error(format!("unexpected answer {outcome}"));
    };
    let made: Vec<&str> = fields.split(',').filter(|f| f.ends_with("=ok")).collect();
    match made.is_empty() {
        true => Verdict::Held,
        false => Verdict::Escaped(format!("made a set-id file with {}", made.join(", "))),
    }
}

fn environment(outcome: &str, facts: &Facts) -> Verdict {
    let Some(names) = outcome.strip_prefix("value:") else {
        return Verdict::Error(format!("unexpected answer {outcome}"));
    };
    // bwrap's --chdir sets PWD to the working directory: nothing the
    // command cannot learn from getcwd.
    let extra: Vec<&str> = names
        .split(',')
        .filter(|n| !n.is_empty() && *n != "PWD" && !facts.env_names.iter().any(|e| e == n))
        .collect();
    match extra.is_empty() {
        true => Verdict::Held,
        false => Verdict::Escaped(format!(
            "variables the plan does not pass: {}",
            extra.join(", ")
        )),
    }
}

fn limit_fsize(outcome: &str, facts: &Facts) -> Verdict {
    if facts.fsize.is_none() {
        return Verdict::NotApplicable("the policy sets no file size limit".into());
    }
    match outcome {
        "signal:SIGXFSZ" | "errno:EFBIG" => Verdict::Held,
        "value:nowhere-writable" => {
            Verdict::NotApplicable("nothing inside is writable (workspace, /tmp, home)".into())
        }
        "ok" => Verdict::Escaped("wrote past the file size limit".into()),
        other => Verdict::Error(format!("unexpected answer {other}")),
    }
}

fn limit_memory(outcome: &str, facts: &Facts) -> Verdict {
    if !facts.memory_tried {
        return Verdict::NotApplicable(
            "no memory limit, or one above what the battery allocates (1 GiB; the run report says whether it was applied)"
                .into(),
        );
    }
    match outcome {
        "signal:SIGKILL" | "errno:ENOMEM" => Verdict::Held,
        o if o.starts_with("value:allocated") => {
            Verdict::Escaped(format!("allocated past the memory limit ({o})"))
        }
        other => Verdict::Error(format!("unexpected answer {other}")),
    }
}

fn limit_pids(outcome: &str, facts: &Facts) -> Verdict {
    let Some(max) = facts.pids_max else {
        return Verdict::NotApplicable("the policy sets no process limit".into());
    };
    let forked = outcome
        .rsplit(':')
        .next()
        .and_then(|n| n.parse::<u64>().ok());
    match (outcome.starts_with("value:unbounded"), forked) {
        (true, _) => Verdict::Escaped(format!("forked without bound ({outcome})")),
        (false, Some(n)) if n < max => Verdict::Held,
        (false, Some(n)) => Verdict::Escaped(format!("forked {n} processes, limit {max}")),
        (false, None) => Verdict::Error(format!("unexpected answer {outcome}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_list_every_attack_with_what_it_tries() {
        let docs = include_str!("../../../../docs/check.md");
        for a in ATTACKS {
            let row = format!("| `{}` | {} | {} |", a.id, a.tries, a.rule);
            let line = docs.lines().find(|l| l.starts_with(&row));
            assert!(line.is_some(), "docs/check.md lacks {row}");
            // The "held means" column names every refusal of the table.
            for errno in a.refused {
                assert!(
                    line.is_some_and(|l| l.contains(errno)),
                    "docs/check.md's row of {} does not name {errno}",
                    a.id
                );
            }
        }
    }

    /// Errors that say the call was admitted and failed for another
    /// reason: never a refusal, whatever the attack.
    const NOT_REFUSALS: [&str; 6] = ["EFAULT", "EINVAL", "ENOTTY", "EBADF", "ESRCH", "ENOENT"];

    #[test]
    fn an_errno_is_held_only_when_it_proves_the_refusal() {
        let facts = Facts::default();
        for a in ATTACKS.iter().filter(|a| !a.refused.is_empty()) {
            for errno in a.refused {
                let outcome = format!("errno:{errno}");
                assert_eq!(judge(a.id, &outcome, &facts), Verdict::Held, "{}", a.id);
            }
            for errno in NOT_REFUSALS.iter().filter(|e| !a.refused.contains(e)) {
                let outcome = format!("errno:{errno}");
                assert!(
                    matches!(judge(a.id, &outcome, &facts), Verdict::NotAttempted(_)),
                    "{} {outcome} must not be held",
                    a.id
                );
            }
            assert!(
                matches!(judge(a.id, "ok", &facts), Verdict::Escaped(_)),
                "{}",
                a.id
            );
        }
        // The answers the unfixed battery took for refusals.
        let cases = [
            ("tiocsti", "errno:ENOTTY"),
            ("tiocsetd", "errno:ENOTTY"),
            ("process-vm-writev", "errno:EFAULT"),
            ("ptrace", "errno:ESRCH"),
            ("bpf", "errno:EINVAL"),
            ("perf-event-open", "errno:EINVAL"),
            ("perf-event-open", "errno:ENOENT"),
            ("proc-mem", "errno:ENOENT"),
            ("keyctl", "errno:EFAULT"),
        ];
        for (attack, outcome) in cases {
            let verdict = judge(attack, outcome, &facts);
            assert!(
                matches!(verdict, Verdict::NotAttempted(_)),
                "{attack} {outcome}: {verdict:?}"
            );
        }
        // Only a refusal of the host's process proves the signal refused.
        assert_eq!(judge("signal-host", "errno:ESRCH", &facts), Verdict::Held);
        // Every attack judged by errno has its refusals listed.
        for id in ["ptrace", "tiocsti", "bpf", "mount", "read-outside"] {
            let info = ATTACKS.iter().find(|a| a.id == id);
            assert!(info.is_some_and(|a| !a.refused.is_empty()), "{id}");
        }
    }

    #[test]
    fn outcomes_are_judged_as_documented() {
        let facts = Facts {
            pids_max: Some(512),
            fsize: Some(1 << 33),
            env_names: vec!["HOME".into(), "PATH".into()],
            ..Facts::default()
        };
        let cases = [
            ("read-outside", "errno:ENOENT", Verdict::Held),
            ("bpf", "errno:EPERM", Verdict::Held),
            ("bpf", "ok", Verdict::Escaped("bpf went through (ok)".into())),
            ("bpf", "timeout", Verdict::Error("the attack did not answer: timeout".into())),
            ("bpf", "errno:ENOSYS", Verdict::Held),
            (
                "ptrace",
                "not-attempted:fork a target: EAGAIN",
                Verdict::NotAttempted("fork a target: EAGAIN".into()),
            ),
            ("bpf", "value:odd", Verdict::Error("unexpected answer value:odd".into())),
            ("environment", "value:HOME,PATH,PWD", Verdict::Held),
            (
                "environment",
                "value:HOME,GITHUB_TOKEN",
                Verdict::Escaped("variables the plan does not pass: GITHUB_TOKEN".into()),
            ),
            ("limit-pids", "value:EAGAIN:508", Verdict::Held),
            (
                "limit-pids",
                "value:EAGAIN:600",
                Verdict::Escaped("forked 600 processes, limit 512".into()),
            ),
            ("limit-fsize", "signal:SIGXFSZ", Verdict::Held),
            ("protected-write", "ok", Verdict::Held),
            (
                "capabilities",
                "value:CapEff=0000000000000000,CapBnd=0000000000000001,NoNewPrivs=1",
                Verdict::Escaped(
                    "capabilities or privileges remain (CapEff=0000000000000000,CapBnd=0000000000000001,NoNewPrivs=1)"
                        .into(),
                ),
            ),
        ];
        for (attack, outcome, want) in cases {
            assert_eq!(judge(attack, outcome, &facts), want, "{attack} {outcome}");
        }
        // A protected path changed on the host is an escape whatever the
        // probe saw inside.
        let changed = Facts {
            protected_changed: vec![".git/config".into()],
            ..Facts::default()
        };
        assert_eq!(
            judge("protected-write", "errno:EROFS", &changed),
            Verdict::Escaped("the host's .git/config changed (errno:EROFS)".into())
        );
    }
}
