//! Output of `check`: an aligned text table, a stable JSON document and
//! SARIF 2.1.0 for code-scanning tools. docs/check.md documents the JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use super::{Finding, HostFacts, PolicyReport, Severity, all_rules, rule_info};
use crate::error::PolicyError;

/// Version of the JSON document; bumped on any incompatible change.
pub const JSON_FORMAT_VERSION: u32 = 1;

/// Everything one `check` invocation found.
#[derive(Debug)]
pub struct CheckRun<'a> {
    pub tool_version: &'a str,
    pub policies: Vec<PolicyReport<'a>>,
    pub host: Option<HostSection>,
    /// Policies that could not be loaded.
    pub errors: Vec<PolicyError>,
}

#[derive(Debug)]
pub struct HostSection {
    pub facts: HostFacts,
    pub findings: Vec<Finding>,
}

impl CheckRun<'_> {
    pub fn all_findings(&self) -> impl Iterator<Item = &Finding> {
        self.policies
            .iter()
            .flat_map(|p| p.findings.iter())
            .chain(self.host.iter().flat_map(|h| h.findings.iter()))
    }

    pub fn max_severity(&self) -> Option<Severity> {
        self.all_findings().map(|f| f.severity).max()
    }

    fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts: BTreeMap<&'static str, usize> =
            Severity::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        for f in self.all_findings() {
            *counts.entry(f.severity.as_str()).or_default() += 1;
        }
        counts
    }
}

// ---------------------------------------------------------------- text

/// Terminal styling, used only when writing to a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Color {
    Always,
    Never,
}

fn paint(color: Color, severity: Severity, text: &str) -> String {
    if color == Color::Never {
        return text.to_string();
    }
    let code = match severity {
        Severity::Critical => "1;31",
        Severity::High => "31",
        Severity::Medium => "33",
        Severity::Low => "36",
        Severity::Info => "2",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

pub fn to_text(run: &CheckRun<'_>, color: Color) -> String {
    let mut out = String::new();
    if let Some(host) = &run.host {
        host_text(&mut out, host, color);
    }
    for report in &run.policies {
        let p = report.policy;
        let _ = write!(out, "{}  role `{}`", p.path.display(), p.name);
        if p.chain.len() > 1 {
            let parents: Vec<String> = p.chain[1..]
                .iter()
                .map(|c| c.display().to_string())
                .collect();
            let _ = write!(out, ", extends {}", parents.join(" <- "));
        }
        let _ = writeln!(out, "  exposure {:.1}/10", report.score);
        let _ = writeln!(out, "  tool limits: {}", limits_text(&tool_limits(p)));
        findings_table(&mut out, &report.findings, color);
        for proof in &report.proofs {
            proof_text(&mut out, proof);
        }
        out.push('\n');
    }
    let counts = run.counts();
    let summary: Vec<String> = Severity::ALL
        .iter()
        .rev()
        .map(|s| format!("{} {}", counts.get(s.as_str()).copied().unwrap_or(0), s))
        .collect();
    // Files, not errors: one file can have several.
    let unloadable: std::collections::BTreeSet<&std::path::Path> = run
        .errors
        .iter()
        .map(|e| e.location.file.as_path())
        .collect();
    let _ = writeln!(
        out,
        "{} polic{} checked, {} not loadable ({} error{}); findings: {}",
        run.policies.len(),
        if run.policies.len() == 1 { "y" } else { "ies" },
        unloadable.len(),
        run.errors.len(),
        if run.errors.len() == 1 { "" } else { "s" },
        summary.join(", ")
    );
    out
}

/// One backend's proof: the counts, then every attack that did not hold.
fn proof_text(out: &mut String, proof: &super::proof::Proof) {
    use super::proof::ProofStatus;
    match &proof.status {
        ProofStatus::Ran => {
            let _ = writeln!(
                out,
                "  proof on this host, {} backend ({:.1} s): {} held, {} escaped, {} not applicable, {} errors",
                proof.backend,
                proof.seconds,
                proof.count("held"),
                proof.count("escaped"),
                proof.count("not-applicable"),
                proof.count("error")
            );
        }
        ProofStatus::RefusedToLaunch(why) => {
            let _ = writeln!(
                out,
                "  proof on this host, {} backend: refused to launch (nothing ran): {why}",
                proof.backend
            );
        }
        ProofStatus::Failed(why) => {
            let _ = writeln!(
                out,
                "  proof on this host, {} backend: failed: {why}",
                proof.backend
            );
        }
    }
    for a in proof.attacks.iter().filter(|a| a.verdict != "held") {
        // Said from inside the sandbox: shown escaped (issue 40).
        let why = crate::text::escape_text(a.why.as_deref().unwrap_or(""));
        let _ = writeln!(out, "    {:<14} {:<22} {why}", a.verdict, a.attack);
    }
    lasts_text(out, &proof.lasts);
}

/// What lasts to the next turn, cold beside warm, one kind a line.
fn lasts_text(out: &mut String, lasts: &[super::proof::Lasted]) {
    if lasts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<39} {:<34} warm turns",
        "what lasts to the next (docs/check.md)", "cold launches"
    );
    for l in lasts {
        // Said from inside the sandbox (a raw errno): shown escaped.
        let cold = crate::text::escape_text(&l.cold.verdict);
        let warm = crate::text::escape_text(&l.warm.verdict);
        let _ = writeln!(out, "    {:<37} {cold:<34} {warm}", l.kind);
    }
}

fn findings_table(out: &mut String, findings: &[Finding], color: Color) {
    if findings.is_empty() {
        out.push_str("  no findings\n");
        return;
    }
    let places: Vec<String> = findings
        .iter()
        .map(|f| format!("{}:{}", f.location.file.display(), f.location.line))
        .collect();
    let place_width = places
        .iter()
        .map(|p| p.chars().count())
        .max()
        .unwrap_or(0)
        .max("WHERE".len());
    let _ = writeln!(
        out,
        "  {:<8}  {:<6}  {:<place_width$}  FINDING",
        "SEVERITY", "RULE", "WHERE"
    );
    for (f, place) in findings.iter().zip(&places) {
        let severity = paint(color, f.severity, &format!("{:<8}", f.severity.as_str()));
        let _ = writeln!(
            out,
            "  {severity}  {:<6}  {place:<place_width$}  {}",
            f.rule_id,
            // Messages quote upstream servers' tool names: theirs.
            crate::text::escape_text(&f.message)
        );
        let _ = writeln!(
            out,
            "  {:<8}  {:<6}  {:<place_width$}  fix: {}",
            "", "", "", f.remediation
        );
    }
}

fn host_text(out: &mut String, host: &HostSection, color: Color) {
    let f = &host.facts;
    let root = if f.running_as_root {
        ", running as root"
    } else {
        ""
    };
    let _ = writeln!(out, "host  kernel {}{root}", f.kernel_release);
    for (name, value) in host_rows(f) {
        let _ = writeln!(out, "  {name:<32} {value}");
    }
    if !host.findings.is_empty() {
        findings_table(out, &host.findings, color);
    }
    out.push('\n');
}

fn probe_text(p: &super::Probe) -> String {
    match p {
        super::Probe::Yes => "yes".to_string(),
        super::Probe::No { reason } => format!("no ({reason})"),
    }
}

/// Which backends can show a workspace through a layer
/// (`--workspace-mode overlay`): the native one mounts overlayfs in the
/// sandbox's user namespace; bubblewrap (0.8) has no overlay mount.
fn overlay_text(f: &super::HostFacts) -> String {
    let native = match &f.userns_for_invoker {
        super::Probe::Yes => {
            "native backend: yes (overlayfs in the sandbox's user namespace)".to_string()
        }
        super::Probe::No { .. } => "native backend: no (no user namespaces)".to_string(),
    };
    format!(
        "{native}; bwrap backend: no (bubblewrap 0.8 has no overlay mount; refused with the reason)"
    )
}

/// One line per host fact: what it is, what this host has.
fn host_rows(f: &super::HostFacts) -> Vec<(&'static str, String)> {
    let landlock = match f.landlock_abi {
        0 => "no".to_string(),
        abi => format!("ABI {abi}"),
    };
    let seccomp = if f.seccomp_filter {
        format!("yes ({})", f.seccomp_actions.join(" "))
    } else {
        "no".to_string()
    };
    let bwrap = match &f.bwrap {
        Some(b) => {
            let flag = if b.disable_userns {
                ", --disable-userns"
            } else {
                ""
            };
            format!("bubblewrap {} at {}{flag}", b.version, b.path)
        }
        None => "not found".to_string(),
    };
    let (backend, why) = f.auto_backend();
    let mut rows = vec![
        (
            "user namespaces (invoking user)",
            probe_text(&f.userns_for_invoker),
        ),
        (
            "user namespaces (unprivileged)",
            probe_text(&f.userns_unprivileged),
        ),
        ("landlock", landlock),
        ("seccomp filters", seccomp),
        ("bwrap", bwrap),
        ("bwrap helper (substrat-init)", probe_text(&f.bwrap_helper)),
        ("run --backend auto uses", format!("{backend} ({why})")),
        ("workspace overlay", overlay_text(f)),
        ("cgroups", format!("{:?}", f.cgroup.version).to_lowercase()),
        ("cgroup pids limit", probe_text(&f.cgroup.pids)),
        ("cgroup memory limit", probe_text(&f.cgroup.memory)),
        ("cgroup cpu limit", probe_text(&f.cgroup.cpu)),
    ];
    if let Some(root) = &f.root_launches {
        let slots = match root.subordinate_slots {
            0 => "nothing: refused (root has no subordinate ids)".to_string(),
            n => format!("subordinate ids of root ({n} sandboxes at once)"),
        };
        rows.push(("launches by root run as", slots));
        for idmap in &root.idmap {
            let value = format!("{}: {}", idmap.path, probe_text(&idmap.probe));
            rows.push(("idmapped binds", value));
        }
    }
    rows
}

// ---------------------------------------------------------------- JSON

fn finding_json(f: &Finding) -> Value {
    let rule = rule_info(f.rule_id);
    json!({
        "rule_id": f.rule_id,
        "rule_name": rule.map(|r| r.name),
        "severity": f.severity,
        "title": rule.map(|r| r.title),
        "message": f.message,
        "remediation": f.remediation,
        "key_path": f.key_path,
        "file": f.location.file,
        "line": f.location.line,
        "column": f.location.column,
    })
}

/// The limits of the seed's safety table (MCP tooling standards), as the
/// broker enforces them for the role: absent ones are `None` (no limit),
/// but the list limit, which has a default.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolLimits {
    /// `max_output_bytes`: a result's bytes (AGENT_MAX_READ_BYTES).
    pub read_bytes: Option<u64>,
    /// `max_list_entries` (AGENT_MAX_LIST_ENTRIES).
    pub list_entries: usize,
    /// `tool_steps_per_turn` (AGENT_MAX_TOOL_STEPS).
    pub tool_steps: Option<u32>,
    /// `tool_cap`, never above 40 (AGENT_MAX_TOOLS).
    pub tools: u32,
}

pub fn tool_limits(policy: &crate::LoadedPolicy) -> ToolLimits {
    let mcp = &policy.policy.mcp;
    ToolLimits {
        read_bytes: mcp.max_output_bytes.map(|b| b.0),
        list_entries: mcp.list_entries(),
        tool_steps: mcp.tool_steps_per_turn,
        tools: mcp.tool_cap.unwrap_or(40).min(40),
    }
}

fn limits_text(l: &ToolLimits) -> String {
    let none = || "none".to_string();
    format!(
        "read {} bytes, lists {} entries, {} tool steps a turn, {} tools",
        l.read_bytes.map_or_else(none, |b| b.to_string()),
        l.list_entries,
        l.tool_steps.map_or_else(none, |s| s.to_string()),
        l.tools
    )
}

pub fn to_json(run: &CheckRun<'_>) -> Value {
    let policies: Vec<Value> = run
        .policies
        .iter()
        .map(|r| {
            json!({
                "name": r.policy.name,
                "path": r.policy.path,
                "chain": r.policy.chain,
                "score": r.score,
                "tool_limits": tool_limits(r.policy),
                "max_severity": r.findings.iter().map(|f| f.severity).max(),
                "findings": r.findings.iter().map(finding_json).collect::<Vec<_>>(),
                "proofs": r.proofs,
            })
        })
        .collect();
    let host = run.host.as_ref().map(|h| {
        let (backend, why) = h.facts.auto_backend();
        json!({
            "auto_backend": {"backend": backend, "reason": why},
            "facts": h.facts,
            "findings": h.findings.iter().map(finding_json).collect::<Vec<_>>(),
        })
    });
    json!({
        "format_version": JSON_FORMAT_VERSION,
        "tool": {"name": "substrat-sandbox", "version": run.tool_version},
        "policies": policies,
        "host": host,
        "errors": run.errors,
        "summary": {
            "policies": run.policies.len(),
            "unloadable": run.errors.len(),
            "findings": run.counts(),
            "max_severity": run.max_severity(),
        },
    })
}

// ---------------------------------------------------------------- SARIF

fn sarif_level(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical | Severity::High => "error",
        Severity::Medium => "warning",
        Severity::Low | Severity::Info => "note",
    }
}

/// GitHub code scanning reads this property to rank security results.
fn security_severity(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical => "9.5",
        Severity::High => "8.0",
        Severity::Medium => "5.5",
        Severity::Low => "3.0",
        Severity::Info => "0.0",
    }
}

/// A URI reference for a file: relative paths stay relative (to the
/// directory `check` ran in), absolute ones become file URIs.
pub fn file_uri(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::new();
    if path.is_absolute() {
        out.push_str("file://");
    }
    for byte in text.bytes() {
        let keep = byte.is_ascii_alphanumeric() || b"/-._~:".contains(&byte);
        if keep {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

pub fn to_sarif(run: &CheckRun<'_>) -> Value {
    let rules: Vec<&super::RuleInfo> = all_rules().collect();
    let rules_json: Vec<Value> = rules
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "name": r.name,
                "shortDescription": {"text": r.title},
                "fullDescription": {"text": r.description},
                "help": {"text": format!("{} Remediation: {}", r.description, r.remediation)},
                "defaultConfiguration": {"level": sarif_level(r.severity)},
                "properties": {
                    "tags": ["security"],
                    "severity": r.severity,
                    "security-severity": security_severity(r.severity),
                },
            })
        })
        .collect();
    let results: Vec<Value> = run
        .all_findings()
        .map(|f| {
            let mut result = json!({
                "ruleId": f.rule_id,
                "level": sarif_level(f.severity),
                "message": {"text": format!("{} Fix: {}", f.message, f.remediation)},
                "properties": {"severity": f.severity, "keyPath": f.key_path},
            });
            if let Some(index) = rules.iter().position(|r| r.id == f.rule_id) {
                result["ruleIndex"] = json!(index);
            }
            if f.location.file != Path::new("host") {
                result["locations"] = json!([{
                    "physicalLocation": {
                        "artifactLocation": {"uri": file_uri(&f.location.file)},
                        "region": {"startLine": f.location.line, "startColumn": f.location.column},
                    }
                }]);
            }
            result
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "substrat-sandbox",
                "version": run.tool_version,
                "semanticVersion": run.tool_version,
                "rules": rules_json,
            }},
            "results": results,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_encoded() {
        assert_eq!(
            file_uri(Path::new("policies/worker.toml")),
            "policies/worker.toml"
        );
        assert_eq!(
            file_uri(Path::new("/tmp/my policy.toml")),
            "file:///tmp/my%20policy.toml"
        );
        assert_eq!(
            file_uri(Path::new("builtin:policies/worker.toml")),
            "builtin:policies/worker.toml"
        );
    }
}
