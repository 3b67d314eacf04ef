//! `check --prove`: each policy's sandbox built on this host exactly as
//! `run` builds it (the same launcher, in a fresh process), the battery
//! (`substrat-probe battery`) run inside, and every attack judged held,
//! escaped, not attempted, not applicable or an error. Escapes become
//! findings of the `PRV` rules, next to the static ones (an escape the
//! static audit did not expect is critical); errors and attacks not
//! attempted are PRV000 failures with their reason.

mod fixtures;
mod judge;
mod lasts;
mod probe;
mod warm;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use substrat_policy::LoadedPolicy;
use substrat_policy::check::proof::{Proof, ProofStatus, ProvenAttack};
use substrat_policy::check::prove_rules::PROVE_RULES;
use substrat_policy::check::{Finding, Severity};
use substrat_policy::location::Location;

use fixtures::Fixtures;
use judge::{Facts, Verdict};

/// The battery allocates past a memory limit only up to this much.
const MEMORY_TRY_MAX: u64 = 1 << 30;

/// How to launch: the policy as `run --policy` takes it, and the backend.
#[derive(Debug)]
pub struct Target<'a> {
    pub policy: &'a LoadedPolicy,
    pub spec: String,
    pub backend: &'static str,
    pub policy_dirs: &'a [PathBuf],
    pub seccomp_dirs: &'a [PathBuf],
    /// The battery as the second turn of a warm sandbox (`warm`).
    pub warm: bool,
}

/// Runs the battery in the policy's sandbox; the record and its findings.
pub fn prove(target: &Target<'_>, static_findings: &[Finding]) -> Result<(Proof, Vec<Finding>)> {
    let start = Instant::now();
    let fixtures = Fixtures::new()?;
    let probe = probe::chosen()?.path;
    let p = &target.policy.policy;
    let memory_tried = p.cgroup.memory_max.is_some_and(|m| m.0 <= MEMORY_TRY_MAX);
    let memory_mib = memory_tried
        .then(|| p.cgroup.memory_max.map(|m| m.0 / (1 << 20) + 64))
        .flatten();
    let fsize = p.rlimits.fsize.map(|s| s.0);
    let view = plan_view(&fixtures, target)?;
    let (output, pairs) = launch(target, &fixtures, &view, &probe, (memory_mib, fsize))?;
    let facts = Facts {
        network: p.network,
        nested_userns: p.namespaces.nested_userns,
        pids_max: p.cgroup.pids_max,
        fsize,
        memory_tried,
        env_names: view.env_names,
        protected_changed: fixtures.protected_changed(),
        outside_written: fixtures.outside_written(),
    };
    let (status, attacks) = read_battery(&output, &facts);
    // The backend `auto` chose, as the launcher's report says.
    let backend = std::fs::read(fixtures.report())
        .ok()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r).ok())
        .and_then(|r| r["backend"].as_str().map(String::from))
        .unwrap_or_else(|| target.backend.to_string());
    let binds: Vec<&std::path::Path> = view.binds.iter().map(|(_, t)| t.as_path()).collect();
    let lasts = match (&status, pairs) {
        (ProofStatus::Ran, Some((cold, warm))) => lasts::judge(&backend, &cold, &warm, &binds),
        _ => Vec::new(),
    };
    let backend = match target.warm {
        true => format!("{backend}, warm turn 2,"),
        false => backend,
    };
    let proof = Proof {
        backend,
        status,
        attacks,
        seconds: start.elapsed().as_secs_f64(),
        probe: probe.display().to_string(),
        lasts,
    };
    let findings = findings_of(&proof, target.policy, static_findings);
    Ok((proof, findings))
}

/// The launcher (`substrat-sandbox run`) with the probe bound in, without
/// its command.
fn launcher(target: &Target<'_>, fixtures: &Fixtures, probe: &std::path::Path) -> Result<Command> {
    let exe = std::env::current_exe().context("cannot locate this program")?;
    let mut command = Command::new(exe);
    command
        .args(["run", "--policy", &target.spec, "--backend", target.backend])
        .arg("--workspace")
        .arg(&fixtures.ws)
        .arg("--git-state")
        .arg(fixtures.git_state())
        .args(["--tty", "never", "--agent-id", "prove"])
        .arg("--report")
        .arg(fixtures.report())
        .args(["--agent-bind", "ro"])
        .arg(probe)
        .arg(PROBE_INSIDE);
    for dir in target.policy_dirs {
        command.arg("--policy-dir").arg(dir);
    }
    for dir in target.seccomp_dirs {
        command.arg("--seccomp-dir").arg(dir);
    }
    // A secret only the launcher's environment holds: no policy passes
    // this name, so nothing inside may show it.
    command.env("SUBSTRAT_PROVE_SECRET", &fixtures.secret);
    Ok(command)
}

/// The battery's launch (cold, or as a warm sandbox's second turn), and
/// with `--warm` what lasts between two turns beside two cold launches.
fn launch(
    target: &Target<'_>,
    fixtures: &Fixtures,
    view: &PlanView,
    probe: &std::path::Path,
    (memory_mib, fsize): (Option<u64>, Option<u64>),
) -> Result<(std::process::Output, Option<(lasts::Pair, lasts::Pair)>)> {
    // The host file and directory outside the binds, where the sandbox
    // would see them if a bind reached them.
    let places = (
        view.inside(&fixtures.outside),
        view.inside(&fixtures.outside_dir),
    );
    let mut battery = vec![PROBE_INSIDE.to_string(), "battery".to_string()];
    battery.extend(fixtures.battery_args(places, memory_mib, fsize));
    if !target.warm {
        let mut command = launcher(target, fixtures, probe)?;
        command.arg("--").args(battery).stdin(Stdio::null());
        return Ok((command.output().context("cannot start the launcher")?, None));
    }
    let token = lasts::token();
    let cold = |step: &str| -> Result<Vec<u8>> {
        let mut command = launcher(target, fixtures, probe)?;
        command
            .arg("--")
            .args([PROBE_INSIDE, "lasts", step, &token])
            .stdin(Stdio::null());
        Ok(command
            .output()
            .context("cannot start the launcher")?
            .stdout)
    };
    let cold = lasts::Pair::of(&cold("leave")?, &cold("look")?);
    let turn = |key: &str| [battery.clone(), vec![format!("{key}={token}")]].concat();
    let command = launcher(target, fixtures, probe)?;
    let (output, first) = warm::two_turns(command, fixtures.root(), &turn("leave"), &turn("look"))?;
    let warm = lasts::Pair::of(&first, &output.stdout);
    Ok((output, Some((cold, warm))))
}

/// Where the probe is bound inside.
const PROBE_INSIDE: &str = "/run/substrat-probe";

/// What `explain --json` says of the plan `run` will launch (nothing
/// started): the environment's names, and the binds as (host, inside).
#[derive(Debug, Default)]
struct PlanView {
    env_names: Vec<String>,
    binds: Vec<(PathBuf, PathBuf)>,
}

impl PlanView {
    /// Where the host path `host` (resolved: the fixtures' paths are
    /// canonical) appears inside: through the deepest bind whose resolved
    /// source holds it, else at its own path (where nothing should be).
    fn inside(&self, host: &std::path::Path) -> PathBuf {
        self.binds
            .iter()
            .filter(|(source, _)| host.starts_with(source))
            .max_by_key(|(source, _)| source.components().count())
            .and_then(|(source, target)| Some(target.join(host.strip_prefix(source).ok()?)))
            .unwrap_or_else(|| host.to_path_buf())
    }
}

fn plan_view(fixtures: &Fixtures, target: &Target<'_>) -> Result<PlanView> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .args(["explain", "--json", "--policy", &target.spec])
        .arg("--workspace")
        .arg(&fixtures.ws);
    for dir in target.policy_dirs {
        command.arg("--policy-dir").arg(dir);
    }
    for dir in target.seccomp_dirs {
        command.arg("--seccomp-dir").arg(dir);
    }
    let out = command.stdin(Stdio::null()).output()?;
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let list = |key: &str| plan[key].as_array().cloned().unwrap_or_default();
    Ok(PlanView {
        env_names: list("env")
            .iter()
            .filter_map(|n| n.as_str().map(String::from))
            .collect(),
        binds: resolved_binds(&list("mounts")),
    })
}

/// The plan's binds as (host, inside), each source where the launch's own
/// function resolves it on this host (symlinks, `..` in their targets,
/// mount points): a bind of `/srv/link` -> `/tmp` shows the prover's
/// files under /tmp. A source that does not resolve is kept as written.
fn resolved_binds(mounts: &[serde_json::Value]) -> Vec<(PathBuf, PathBuf)> {
    use substrat_sandbox::plan::{Access, MountStep};
    let steps: Vec<MountStep> = mounts
        .iter()
        .filter(|m| m["kind"] == "bind")
        .filter_map(|m| {
            Some(MountStep::Bind {
                source: m["source"].as_str()?.into(),
                target: m["target"].as_str()?.into(),
                access: if m["mode"] == "rw" {
                    Access::Rw
                } else {
                    Access::Ro
                },
                optional: m["optional"] == true,
                socket: substrat_sandbox::plan::SocketUse::Unjudged,
            })
        })
        .collect();
    steps
        .iter()
        .filter_map(|step| match step {
            MountStep::Bind {
                source,
                target,
                access,
                ..
            } => {
                let host = substrat_sandbox::mounts::resolve_bind_source(&steps, source, *access)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| source.clone());
                Some((host, target.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The battery's lines judged; every attack missing from them is an error.
fn read_battery(output: &std::process::Output, facts: &Facts) -> (ProofStatus, Vec<ProvenAttack>) {
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut done = false;
    for line in output.stdout.lines().map_while(Result::ok) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if value["done"] == true {
            done = true;
        } else if let (Some(a), Some(o)) = (value["attack"].as_str(), value["outcome"].as_str()) {
            seen.push((a.to_string(), o.to_string()));
        }
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last_words = stderr.lines().last().unwrap_or("").to_string();
    let status = match (done, output.status.code()) {
        (true, _) => ProofStatus::Ran,
        // Exit 2 before any attack: the launcher refused to build it.
        (false, Some(2)) if seen.is_empty() => ProofStatus::RefusedToLaunch(last_words),
        (false, Some(code @ (126 | 127))) if seen.is_empty() => ProofStatus::Failed(format!(
            "the probe could not start inside (exit {code}: {last_words}){}; nothing was proven",
            if code == 127 {
                ": the policy's view lacks its C library; install the static probe beside \
                 substrat-sandbox (scripts/static-probe) and prove again"
            } else {
                ""
            }
        )),
        (false, code) => ProofStatus::Failed(format!(
            "the battery did not finish (exit {}): {last_words}",
            code.map_or("by a signal".to_string(), |c| c.to_string())
        )),
    };
    let refused = matches!(status, ProofStatus::RefusedToLaunch(_));
    let attacks = judge::ATTACKS
        .iter()
        .map(|info| {
            let outcome = seen
                .iter()
                .find(|(a, _)| a == info.id)
                .map(|(_, o)| o.clone());
            let verdict = match (&outcome, refused) {
                (Some(o), _) => judge::judge(info.id, o, facts),
                (None, true) => {
                    Verdict::NotApplicable("the sandbox was refused: nothing ran".into())
                }
                (None, false) => not_run(info.id),
            };
            proven(info, verdict, outcome.unwrap_or_default())
        })
        .collect();
    (status, attacks)
}

/// An attack the battery did not report: not applicable where it runs
/// only where it applies (a host address, a limit to try), else an error.
fn not_run(attack: &str) -> Verdict {
    let why = match attack {
        "tcp-host-address" => "this host has no address but loopback",
        "limit-fsize" => "the policy sets no file size limit",
        "limit-memory" => {
            "no memory limit, or one above the 1 GiB the battery allocates (the run report says whether it was applied)"
        }
        _ => return Verdict::Error("did not run".into()),
    };
    Verdict::NotApplicable(why.into())
}

fn proven(info: &judge::AttackInfo, verdict: Verdict, outcome: String) -> ProvenAttack {
    let (name, why) = match verdict {
        Verdict::Held => ("held", None),
        Verdict::Escaped(why) => ("escaped", Some(why)),
        Verdict::NotAttempted(why) => ("not-attempted", Some(why)),
        Verdict::NotApplicable(why) => ("not-applicable", Some(why)),
        Verdict::Error(why) => ("error", Some(why)),
    };
    ProvenAttack {
        attack: info.id.to_string(),
        tries: info.tries.to_string(),
        rule: info.rule.to_string(),
        verdict: name.to_string(),
        why,
        outcome,
    }
}

/// Escapes and errors as findings; an escape no static finding explains
/// is critical.
fn findings_of(proof: &Proof, policy: &LoadedPolicy, statics: &[Finding]) -> Vec<Finding> {
    let location = Location::start_of(&policy.path);
    let finding = |rule_id: &'static str, severity, message: String, key: String| Finding {
        rule_id,
        severity,
        message,
        remediation: rule(rule_id).map_or("", |r| r.info.remediation),
        key_path: key,
        location: location.clone(),
    };
    let backend = &proof.backend;
    let mut out = Vec::new();
    match &proof.status {
        ProofStatus::RefusedToLaunch(why) => out.push(finding(
            "PRV001",
            Severity::Medium,
            format!("{backend} backend: refused to launch: {why}"),
            "prove".into(),
        )),
        ProofStatus::Failed(why) => out.push(finding(
            "PRV000",
            Severity::Critical,
            format!("{backend} backend: {why}"),
            "prove".into(),
        )),
        ProofStatus::Ran => {}
    }
    out.extend(lasts_findings(proof, &location));
    for a in &proof.attacks {
        let Some(rule) = rule(&a.rule) else { continue };
        let why = a.why.clone().unwrap_or_default();
        let key = format!("prove.{}", a.attack);
        match a.verdict.as_str() {
            "escaped" => {
                let explained: Vec<&str> = statics
                    .iter()
                    .filter(|f| rule.explained_by.contains(&f.rule_id))
                    .map(|f| f.rule_id)
                    .collect();
                let (severity, note) = match explained.is_empty() {
                    true => (
                        Severity::Critical,
                        "the static audit expected this to hold".to_string(),
                    ),
                    false => (
                        rule.info.severity,
                        format!("as {} says", explained.join(", ")),
                    ),
                };
                let message = format!("{backend} backend: {} escaped: {why}; {note}", a.attack);
                out.push(finding(rule.info.id, severity, message, key));
            }
            // When nothing ran, the status's one finding says so.
            "error" if proof.status == ProofStatus::Ran => out.push(finding(
                "PRV000",
                Severity::Critical,
                format!("{backend} backend: {}: {why}", a.attack),
                key,
            )),
            // A failure like an error: nothing is known of this attack.
            "not-attempted" => out.push(finding(
                "PRV000",
                Severity::Critical,
                format!(
                    "{backend} backend: {} could not attempt its attack: {why}",
                    a.attack
                ),
                key,
            )),
            _ => {}
        }
    }
    out
}

/// What lasted otherwise than docs/check.md says: a PRV028 finding each.
fn lasts_findings(proof: &Proof, location: &Location) -> Vec<Finding> {
    let mut out = Vec::new();
    for l in &proof.lasts {
        for (pair, said) in [("cold launches", &l.cold), ("warm turns", &l.warm)] {
            if !said.failed {
                continue;
            }
            out.push(Finding {
                rule_id: "PRV028",
                severity: Severity::High,
                message: format!(
                    "{} backend: {} ({}) between {pair}: {}; docs/check.md: {} warm, gone cold",
                    proof.backend, l.kind, l.left_as, said.verdict, l.documented
                ),
                remediation: rule("PRV028").map_or("", |r| r.info.remediation),
                key_path: format!("prove.lasts.{}", l.kind),
                location: location.clone(),
            });
        }
    }
    out
}

fn rule(id: &str) -> Option<&'static substrat_policy::check::prove_rules::ProveRule> {
    PROVE_RULES.iter().find(|r| r.info.id == id)
}
