//! `substrat-sandbox check`: an audit of policies (and of the host) in the
//! spirit of `systemd-analyze security`. Each rule has a stable ID, a
//! severity, a message, a remediation and the place it points at.

mod host;
pub mod proof;
pub mod prove_rules;
pub mod report;
pub(crate) mod rules;

use std::fmt;

use serde::Serialize;

use crate::load::LoadedPolicy;
use crate::location::Location;

pub use host::{
    BwrapInfo, CgroupInfo, CgroupVersion, HostFacts, IdmapProbe, LANDLOCK_FULL_ABI, Probe,
    RootLaunches, check_host, check_policy_on_host,
};
pub use rules::{
    LANDLOCK_UNIX_CONNECT_ABI, POLICY_RULES, ROLE_RULES, UPSTREAM_RULES, check_policy,
    check_policy_on, check_policy_resolved, menu_over_cap, script_role_broken,
    script_tools_out_of_scope,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 5] = [
        Self::Info,
        Self::Low,
        Self::Medium,
        Self::High,
        Self::Critical,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The weight of one finding in the exposure score (docs/check.md).
    pub fn weight(self) -> f64 {
        match self {
            Self::Info => 0.0,
            Self::Low => 0.03,
            Self::Medium => 0.1,
            Self::High => 0.3,
            Self::Critical => 0.5,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule as documented: what it finds, why it matters, how to fix it.
#[derive(Debug, Clone, Copy)]
pub struct RuleInfo {
    pub id: &'static str,
    /// Kebab-case name, e.g. `network-host`.
    pub name: &'static str,
    pub severity: Severity,
    /// One line: what is wrong.
    pub title: &'static str,
    /// Why it matters.
    pub description: &'static str,
    pub remediation: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub rule_id: &'static str,
    pub severity: Severity,
    pub message: String,
    pub remediation: &'static str,
    /// The key the finding is about; where the key is absent, its table.
    pub key_path: String,
    pub location: Location,
}

/// Every rule `check` knows: policy rules, host rules, upstream rules,
/// script role rules, then the rules of `check --prove`.
pub fn all_rules() -> impl Iterator<Item = &'static RuleInfo> {
    rules::POLICY_RULES
        .iter()
        .map(|r| &r.info)
        .chain(host::HOST_RULES.iter())
        .chain(rules::UPSTREAM_RULES.iter())
        .chain(rules::ROLE_RULES.iter())
        .chain(prove_rules::PROVE_RULES.iter().map(|r| &r.info))
}

pub fn rule_info(id: &str) -> Option<&'static RuleInfo> {
    all_rules().find(|r| r.id == id)
}

/// Exposure from 0.0 (nothing found) to 10.0: every finding removes a share
/// of what is left, `score = 10 * (1 - prod(1 - weight))`, rounded to one
/// decimal. One high finding gives 3.0, one critical 5.0; findings add up
/// but never pass 10.
pub fn exposure_score(findings: &[Finding]) -> f64 {
    let kept: f64 = findings.iter().map(|f| 1.0 - f.severity.weight()).product();
    ((1.0 - kept) * 100.0).round() / 10.0
}

/// The audit of one policy.
#[derive(Debug, Clone)]
pub struct PolicyReport<'a> {
    pub policy: &'a LoadedPolicy,
    pub findings: Vec<Finding>,
    pub score: f64,
    /// `check --prove`: what each backend's sandbox showed (its escapes
    /// and errors are among `findings` too).
    pub proofs: Vec<proof::Proof>,
}

impl<'a> PolicyReport<'a> {
    pub fn new(policy: &'a LoadedPolicy, extra: Vec<Finding>) -> Self {
        Self::resolved(policy, &[], extra)
    }

    /// The audit with each bind's source also judged as the launch
    /// resolves it on this host (`resolved[i]` for bind `i`).
    pub fn resolved(
        policy: &'a LoadedPolicy,
        resolved: &[Option<std::path::PathBuf>],
        extra: Vec<Finding>,
    ) -> Self {
        Self::on_host(policy, resolved, None, extra)
    }

    /// `resolved`, knowing this kernel's Landlock ABI too.
    pub fn on_host(
        policy: &'a LoadedPolicy,
        resolved: &[Option<std::path::PathBuf>],
        landlock_abi: Option<u32>,
        mut extra: Vec<Finding>,
    ) -> Self {
        let mut findings = check_policy_on(policy, resolved, landlock_abi);
        findings.append(&mut extra);
        sort_findings(&mut findings);
        let score = exposure_score(&findings);
        Self {
            policy,
            findings,
            score,
            proofs: Vec::new(),
        }
    }
}

/// Most severe first, then by place, then by rule: a stable order for
/// diffs of reports.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.location.file.cmp(&b.location.file))
            .then_with(|| a.location.line.cmp(&b.location.line))
            .then_with(|| a.rule_id.cmp(b.rule_id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(severity: Severity) -> Finding {
        Finding {
            rule_id: "SBX001",
            severity,
            message: String::new(),
            remediation: "",
            key_path: String::new(),
            location: Location::start_of(std::path::Path::new("p")),
        }
    }

    #[test]
    fn score_is_bounded_and_monotone() {
        assert_eq!(exposure_score(&[]), 0.0);
        assert_eq!(exposure_score(&[finding(Severity::High)]), 3.0);
        assert_eq!(exposure_score(&[finding(Severity::Critical)]), 5.0);
        assert_eq!(
            exposure_score(&[finding(Severity::High), finding(Severity::High)]),
            5.1
        );
        assert_eq!(exposure_score(&[finding(Severity::Info)]), 0.0);
        let many: Vec<_> = (0..100).map(|_| finding(Severity::Critical)).collect();
        assert_eq!(exposure_score(&many), 10.0);
    }

    #[test]
    fn docs_list_every_rule_with_its_severity() {
        let docs = include_str!("../../../../docs/check.md");
        for rule in all_rules() {
            let row = format!(
                "| {} | {} | {} | {} |",
                rule.id, rule.name, rule.severity, rule.title
            );
            assert!(
                docs.contains(&row),
                "docs/check.md lacks or misstates: {row}"
            );
        }
    }

    #[test]
    fn rule_ids_are_unique_and_complete() {
        let mut ids: Vec<_> = all_rules().map(|r| r.id).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate rule id");
        assert!(POLICY_RULES.len() >= 20);
        for rule in all_rules() {
            assert!(
                !rule.title.is_empty()
                    && !rule.description.is_empty()
                    && !rule.remediation.is_empty(),
                "{}",
                rule.id
            );
        }
    }
}
