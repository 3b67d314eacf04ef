//! Every candidate policy judged as the final one is, before any run
//! under it: `check --fail-on high` (this program, in a fresh process,
//! the one function that judges every policy). A bind `check` flags (high
//! or critical, or SBX049's sockets below a directory, which Landlock
//! cannot stop here) is taken out of the plan and said as wanted, not
//! granted; anything else `check` fails on stops the learning.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use substrat_policy::learn::render::bind_at_line;
use substrat_policy::learn::{Observations, Plan, PlanInput, Refusal, render};

/// Rounds of taking flagged binds out before giving up.
const PASSES: usize = 8;

/// Rules whose finding at a bind refuses it whatever their severity.
const REFUSING_RULES: [&str; 2] = ["SBX033", "SBX049"];

#[derive(Debug, serde::Deserialize)]
struct Report {
    #[serde(default)]
    policies: Vec<PolicyFindings>,
}

#[derive(Debug, serde::Deserialize)]
struct PolicyFindings {
    #[serde(default)]
    findings: Vec<Finding>,
}

#[derive(Debug, serde::Deserialize)]
struct Finding {
    rule_id: String,
    severity: String,
    message: String,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    line: Option<usize>,
}

impl Finding {
    fn fails(&self) -> bool {
        matches!(self.severity.as_str(), "high" | "critical")
    }
}

/// `check --format json` of `file`: its findings and whether it failed.
fn check(program: &Path, file: &Path) -> Result<(Vec<Finding>, bool)> {
    let out = Command::new(program)
        .args(["check", "--format", "json", "--fail-on", "high"])
        .arg(file)
        .stdout(Stdio::piped())
        .output()
        .context("cannot run check")?;
    let report: Report =
        serde_json::from_slice(&out.stdout).context("cannot read check's report")?;
    let findings = report
        .policies
        .into_iter()
        .flat_map(|p| p.findings)
        .collect();
    Ok((findings, !out.status.success()))
}

/// The plan with every bind `check` flags refused, its text written to
/// `file`, which `check --fail-on high` passes; an error naming the
/// finding when it cannot pass.
pub fn vet(
    program: &Path,
    file: &Path,
    mut plan: Plan,
    observed: &Observations,
    input: &PlanInput,
) -> Result<(Plan, String)> {
    for _ in 0..PASSES {
        let text = render(&plan, observed, input);
        std::fs::write(file, &text)?;
        let (findings, failed) = check(program, file)?;
        let here = file.display().to_string();
        let mut out: Vec<(usize, &Finding)> = findings
            .iter()
            .filter(|f| f.fails() || REFUSING_RULES.contains(&f.rule_id.as_str()))
            .filter(|f| f.file.as_deref() == Some(here.as_str()))
            .filter_map(|f| Some((bind_at_line(&plan, input, &text, f.line?)?, f)))
            .collect();
        if out.is_empty() {
            if let Some(f) = findings.iter().find(|f| f.fails()) {
                bail!(
                    "a candidate policy fails `check --fail-on high` ({}: {}): no run under it",
                    f.rule_id,
                    substrat_policy::text::escape_text(&f.message)
                );
            }
            if failed {
                bail!("a candidate policy fails `check --fail-on high`: no run under it");
            }
            return Ok((plan, text));
        }
        out.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        out.dedup_by_key(|(i, _)| *i);
        for (i, f) in out {
            let bind = plan.binds.remove(i);
            plan.refused.push(Refusal {
                path: bind.source,
                why: format!("check {}: {}", f.rule_id, f.message),
            });
        }
        plan.refused.sort();
    }
    bail!("check still flags binds of the candidate after {PASSES} passes: no run under it")
}
