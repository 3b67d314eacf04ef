//! What `run` says about its policy before running, from the same audit
//! as `check`: with `--explain` the exposure score and every finding; else
//! one line when a finding is high or critical, so a dangerous policy
//! never runs without a word.

use substrat_policy::LoadedPolicy;
use substrat_policy::check::{PolicyReport, Severity, rule_info};

/// Prints to stderr; `program` prefixes the lines.
pub fn tell(policy: &LoadedPolicy, explain: bool, program: &str) {
    let report = PolicyReport::new(policy, Vec::new());
    if explain {
        eprintln!(
            "{program}: policy {} ({}): exposure {:.1}/10, {} finding(s)",
            policy.name,
            policy.path.display(),
            report.score,
            report.findings.len()
        );
        for f in &report.findings {
            let name = rule_info(f.rule_id).map_or("", |r| r.name);
            eprintln!(
                "  {:<8} {} {name}: {} ({})\n           fix: {}",
                f.severity.as_str(),
                f.rule_id,
                substrat_policy::text::escape_text(&f.message),
                f.location,
                f.remediation
            );
        }
        return;
    }
    let serious: Vec<&str> = report
        .findings
        .iter()
        .filter(|f| f.severity >= Severity::High)
        .map(|f| f.rule_id)
        .collect();
    if !serious.is_empty() {
        eprintln!(
            "{program}: warning: policy {} has {} high or critical finding(s) ({}; exposure {:.1}/10): \
             --explain, or `substrat-sandbox check {}`, says what and how to fix",
            policy.name,
            serious.len(),
            serious.join(", "),
            report.score,
            policy.path.display()
        );
    }
}
