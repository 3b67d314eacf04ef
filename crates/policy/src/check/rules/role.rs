//! Rules about a script role (`persona.script`). Loading the script is the
//! broker's (the caller runs it); the findings are made here so they report
//! like every other rule.

use crate::check::{Finding, RuleInfo, Severity};
use crate::load::LoadedPolicy;

pub static ROLE_RULES: &[RuleInfo] = &[
    RuleInfo {
        id: "ROL001",
        name: "script-role-broken",
        severity: Severity::High,
        title: "The role's script is missing, does not parse, or fails when loaded",
        description: "The daemon refuses to start with a script role it cannot load; `role test` shows the same error.",
        remediation: "Fix the script named by `persona.script` (its path is relative to the policy file) and run `substrat-sandbox role test NAME`.",
    },
    RuleInfo {
        id: "ROL002",
        name: "script-tools-out-of-scope",
        severity: Severity::Medium,
        title: "The role's script declares tools its policy does not allow",
        description: "The policy's `[tools]` scope is what the broker enforces: tools the script names outside it are never listed or callable, whatever the prompt says.",
        remediation: "Allow the tools in the policy's `[tools]`, or drop them from `agent.tools` in the script.",
    },
];

/// ROL001: the script could not be loaded, and why.
pub fn script_role_broken(policy: &LoadedPolicy, why: &str) -> Finding {
    finding(&ROLE_RULES[0], policy, why.to_string())
}

/// ROL002: the declared tools the policy's scope leaves out.
pub fn script_tools_out_of_scope(policy: &LoadedPolicy, outside: &[String]) -> Finding {
    finding(
        &ROLE_RULES[1],
        policy,
        format!(
            "the script declares {} outside the policy's tools scope: {}",
            if outside.len() == 1 {
                "a tool"
            } else {
                "tools"
            },
            outside.join(", ")
        ),
    )
}

fn finding(rule: &RuleInfo, policy: &LoadedPolicy, message: String) -> Finding {
    let key_path = "persona.script";
    Finding {
        rule_id: rule.id,
        severity: rule.severity,
        message,
        remediation: rule.remediation,
        key_path: key_path.to_string(),
        location: policy.locate(key_path),
    }
}
