//! Rules about a role together with the broker's upstream servers. What a
//! role would see is computed by the caller (the broker's menu); the
//! finding is made here so it reports like every other rule.

use crate::check::{Finding, RuleInfo, Severity};
use crate::load::LoadedPolicy;

pub static UPSTREAM_RULES: &[RuleInfo] = &[RuleInfo {
    id: "UPS001",
    name: "menu-over-cap",
    severity: Severity::Low,
    title: "More tools are in scope than the role's tool cap",
    description: "Tools past the cap are dropped from the menu (cursor-agent would drop them silently); an agent of this role never sees them.",
    remediation: "Narrow `tools.allow`/`tools.deny` to the tools the role needs, or disable servers it does not use.",
}];

/// UPS001: `in_scope` tools for a cap of `cap`; `dropped` in menu order.
pub fn menu_over_cap(
    policy: &LoadedPolicy,
    in_scope: usize,
    cap: usize,
    dropped: &[String],
) -> Finding {
    let rule = &UPSTREAM_RULES[0];
    let key_path = "mcp.tool_cap";
    let shown: Vec<&str> = dropped.iter().take(10).map(String::as_str).collect();
    let more = dropped.len().saturating_sub(shown.len());
    Finding {
        rule_id: rule.id,
        severity: rule.severity,
        message: format!(
            "{in_scope} tools are in scope with the upstream servers' tools; the cap of {cap} drops {}: {}{}",
            dropped.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
        remediation: rule.remediation,
        key_path: key_path.to_string(),
        location: policy.locate(key_path),
    }
}
