//! `substrat-sandbox check`: load policies, audit them (and the host), print.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use substrat_broker::store::{PinStatus, Store};
use substrat_broker::upstream::menu::{self, PinState, ServerTools, UpstreamTool};
use substrat_policy::check::report::{CheckRun, Color, HostSection, to_json, to_sarif, to_text};
use substrat_policy::check::{
    Finding, PolicyReport, Severity, check_host, check_policy_on_host, menu_over_cap,
};
use substrat_policy::load::named_policy_file;
use substrat_policy::text;
use substrat_policy::{LoadOptions, LoadedPolicy, PolicyError, builtin, load_builtin, load_file};
use substrat_sandbox::{ProbeOptions, probe_host};

use crate::{CheckArgs, FailOn, Format};

pub const LONG_HELP: &str = "\
Audit sandbox policies like `systemd-analyze security` audits units.

Each finding has a stable rule ID (SBX001..., HST001... for host checks), a \
severity (info, low, medium, high, critical), the file:line it points at, and \
a remediation. Each policy gets an exposure score from 0.0 to 10.0.

Exit status: 0 when no finding reaches --fail-on (or no --fail-on is given), \
1 when one does, 2 for usage errors or policies that cannot be loaded (each \
error is printed with file:line:col and the key path).

Examples:
  substrat-sandbox check policies/
  substrat-sandbox check --format sarif --fail-on high policies/ > check.sarif
  substrat-sandbox check --host worker";

const EXIT_FINDINGS: u8 = 1;
const EXIT_INPUT: u8 = 2;

pub fn run(args: &CheckArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!(
                "substrat-sandbox check: {}",
                substrat_cli::term::error_text(&err)
            );
            ExitCode::from(EXIT_INPUT)
        }
    }
}

fn run_inner(args: &CheckArgs) -> Result<ExitCode> {
    if args.paths.is_empty() && !args.host {
        bail!("nothing to check: give policy files or directories, or --host (see --help)");
    }
    let options = LoadOptions {
        policy_dirs: args.policy_dirs.clone(),
        seccomp_dirs: args.seccomp_dirs.clone(),
    };
    let mut policies: Vec<LoadedPolicy> = Vec::new();
    let mut errors: Vec<PolicyError> = Vec::new();
    for source in expand_paths(&args.paths, &args.policy_dirs)? {
        let loaded = match &source {
            PolicySource::File(path) => load_file(path, &options),
            PolicySource::Builtin(name) => load_builtin(name, &options)
                .with_context(|| format!("no built-in policy `{name}`"))?,
        };
        match loaded {
            Ok(policy) => policies.push(policy),
            Err(errs) => errors.extend(errs.0),
        }
    }
    let facts = if args.host {
        let exe = std::env::current_exe()
            .context("cannot find this program's path for the host probe")?;
        Some(probe_host(&ProbeOptions { probe_exe: exe }))
    } else {
        None
    };
    let known = known_upstream_tools(args)?;
    // Proofs take a second or so each: a person at a terminal sees which.
    let mut progress = args
        .prove
        .then(|| substrat_cli::progress::Progress::new("proving", policies.len()));
    let reports: Vec<PolicyReport<'_>> = policies
        .iter()
        .map(|p| {
            let mut extra = facts
                .as_ref()
                .map(|f| check_policy_on_host(f, p))
                .unwrap_or_default();
            if let Some(known) = &known {
                extra.extend(menu_findings(p, known));
            }
            extra.extend(script_role_findings(p));
            let resolved = resolved_sources(p);
            let abi = Some(substrat_sandbox::landlock::kernel_abi());
            if !args.prove {
                return Ok(PolicyReport::on_host(p, &resolved, abi, extra));
            }
            if let Some(progress) = &mut progress {
                progress.step(&p.name);
            }
            // The proof after the static audit, which it is reconciled with.
            let statics = PolicyReport::on_host(p, &resolved, abi, extra.clone()).findings;
            let (proof, mut proven) = crate::prove::prove(&prove_target(args, p), &statics)?;
            extra.append(&mut proven);
            let mut report = PolicyReport::on_host(p, &resolved, abi, extra);
            report.proofs.push(proof);
            Ok(report)
        })
        .collect::<Result<_>>()?;
    drop(progress);
    let host = facts.map(|facts| HostSection {
        findings: check_host(&facts),
        facts,
    });
    let run = CheckRun {
        tool_version: env!("CARGO_PKG_VERSION"),
        policies: reports,
        host,
        errors,
    };
    for err in &run.errors {
        eprintln!("{}", text::escape_lines(&err.to_string()));
    }
    print_report(&run, args.format)?;
    Ok(exit_code(&run, args.fail_on))
}

/// The enabled upstream servers' tools as a daemon last listed them (its
/// pins), in the file's order; none without `--upstreams` and
/// `--state-dir`. The file is validated either way.
fn known_upstream_tools(args: &CheckArgs) -> Result<Option<Vec<ServerTools>>> {
    let Some(file) = &args.upstreams else {
        return Ok(None);
    };
    let config = crate::daemon::read_upstreams(file)?;
    let Some(state) = &args.state_dir else {
        eprintln!(
            "substrat-sandbox check: {} is valid; the menus need the servers' tools: add --state-dir of a daemon that ran them",
            file.display()
        );
        return Ok(None);
    };
    let db = state.join("state.db");
    if !db.is_file() {
        bail!(
            "{}: no daemon state here (state.db is missing)",
            state.display()
        );
    }
    let pins = Store::open(&db)
        .and_then(|store| store.pins())
        .with_context(|| format!("cannot read {}", db.display()))?;
    let servers = config
        .servers
        .iter()
        .filter(|s| s.enabled)
        .map(|s| ServerTools {
            server: s.name.clone(),
            tools: pins
                .iter()
                .filter(|p| p.server == s.name)
                .map(|p| {
                    let tool = UpstreamTool {
                        name: p.tool.clone(),
                        description: String::new(),
                        input_schema: serde_json::Value::Null,
                        annotations: serde_json::Value::Null,
                        ..UpstreamTool::default()
                    };
                    let pin = match p.state {
                        PinStatus::Quarantined => {
                            PinState::Quarantined(p.reason.clone().unwrap_or_default())
                        }
                        PinStatus::Approved => PinState::Approved,
                    };
                    (tool, pin)
                })
                .collect(),
        })
        .collect();
    Ok(Some(servers))
}

/// UPS001 when the role's menu would drop tools for the cap.
fn menu_findings(policy: &LoadedPolicy, known: &[ServerTools]) -> Option<Finding> {
    let built = menu::build(&policy.policy, known);
    let dropped: Vec<String> = built
        .dropped
        .iter()
        .filter(|d| d.reason.starts_with("cap"))
        .map(|d| d.name.clone())
        .collect();
    (!dropped.is_empty()).then(|| {
        let cap = built.entries.len();
        menu_over_cap(policy, cap + dropped.len(), cap, &dropped)
    })
}

/// ROL001 when the role's script cannot be loaded (its top level runs,
/// with its limits, as the daemon runs it); ROL002 for the tools it
/// declares outside the policy's scope.
fn script_role_findings(policy: &LoadedPolicy) -> Vec<Finding> {
    use substrat_broker::roles::{load_scripts, script_path};
    if script_path(policy).is_none() {
        return Vec::new();
    }
    let one = std::collections::BTreeMap::from([(policy.name.clone(), policy.clone())]);
    match load_scripts(&one) {
        Ok(roles) => {
            let outside: Vec<String> = roles
                .iter()
                .flat_map(|r| r.tools())
                .filter(|t| !substrat_broker::tools::in_scope(&policy.policy, t))
                .collect();
            if outside.is_empty() {
                Vec::new()
            } else {
                vec![substrat_policy::check::script_tools_out_of_scope(
                    policy, &outside,
                )]
            }
        }
        Err(e) => vec![substrat_policy::check::script_role_broken(
            policy,
            &e.to_string(),
        )],
    }
}

/// Each bind's source as the launch resolves it on this host (bind `i` at
/// `i`): `${HOME}` expanded as `run` expands it, then opened by the
/// launch's own function (symlinks, `..` in their targets, mount points).
/// `None` for a source missing here, refused (a writable one through a
/// symlink, which the launch refuses too), or naming the workspace or the
/// agent, which only a launch knows: those are judged as written.
fn resolved_sources(policy: &LoadedPolicy) -> Vec<Option<PathBuf>> {
    use substrat_policy::paths::{ExpandContext, PathVar};
    use substrat_sandbox::plan::{Access, MountStep};
    let ctx = ExpandContext {
        home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/")),
        workspace: PathBuf::from("/"),
        agent_id: "check".into(),
    };
    let binds = &policy.policy.filesystem.binds;
    let steps: Vec<Option<MountStep>> = binds
        .iter()
        .map(|b| {
            let known = !b.source.uses(PathVar::Workspace) && !b.source.uses(PathVar::AgentId);
            let source = known.then(|| b.source.expand(&ctx).ok()).flatten()?;
            Some(MountStep::Bind {
                target: source.clone(),
                source,
                access: if b.writable() { Access::Rw } else { Access::Ro },
                optional: b.optional,
                socket: substrat_sandbox::plan::SocketUse::Unjudged,
            })
        })
        .collect();
    let mounts: Vec<MountStep> = steps.iter().flatten().cloned().collect();
    steps
        .iter()
        .map(|step| match step {
            Some(MountStep::Bind { source, access, .. }) => {
                substrat_sandbox::mounts::resolve_bind_source(&mounts, source, *access)
                    .ok()
                    .flatten()
            }
            _ => None,
        })
        .collect()
}

/// How `check --prove` launches `policy`: by name when built in, else by
/// its file, with the directories `check` was given.
fn prove_target<'a>(args: &'a CheckArgs, policy: &'a LoadedPolicy) -> crate::prove::Target<'a> {
    let spec = if builtin::is_builtin_label(&policy.path) {
        policy.name.clone()
    } else {
        policy.path.display().to_string()
    };
    crate::prove::Target {
        policy,
        spec,
        backend: args.backend.choice().name(),
        policy_dirs: &args.policy_dirs,
        seccomp_dirs: &args.seccomp_dirs,
        warm: args.warm,
    }
}

fn print_report(run: &CheckRun<'_>, format: Format) -> Result<()> {
    let stdout = std::io::stdout();
    let text = match format {
        Format::Text => {
            let color = if substrat_cli::term::colour(stdout.is_terminal()) {
                Color::Always
            } else {
                Color::Never
            };
            to_text(run, color)
        }
        Format::Json => text::json_safe(serde_json::to_string_pretty(&to_json(run))?) + "\n",
        Format::Sarif => text::json_safe(serde_json::to_string_pretty(&to_sarif(run))?) + "\n",
    };
    let mut out = stdout.lock();
    out.write_all(text.as_bytes())
        .context("cannot write the report")?;
    out.flush().context("cannot write the report")
}

fn exit_code(run: &CheckRun<'_>, fail_on: Option<FailOn>) -> ExitCode {
    if !run.errors.is_empty() {
        return ExitCode::from(EXIT_INPUT);
    }
    let threshold = fail_on.map(|f| match f {
        FailOn::Info => Severity::Info,
        FailOn::Low => Severity::Low,
        FailOn::Medium => Severity::Medium,
        FailOn::High => Severity::High,
        FailOn::Critical => Severity::Critical,
    });
    match (threshold, run.max_severity()) {
        (Some(threshold), Some(worst)) if worst >= threshold => ExitCode::from(EXIT_FINDINGS),
        _ => ExitCode::SUCCESS,
    }
}

enum PolicySource {
    File(PathBuf),
    Builtin(String),
}

/// Files as given; directories as their *.toml files in name order; names
/// of built-in policies when no such path exists.
fn expand_paths(paths: &[PathBuf], policy_dirs: &[PathBuf]) -> Result<Vec<PolicySource>> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot read directory {}", path.display()))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "toml") && p.is_file())
                .collect();
            if files.is_empty() {
                bail!("{} contains no *.toml policy", path.display());
            }
            files.sort();
            out.extend(files.into_iter().map(PolicySource::File));
        } else if path.exists() {
            out.push(PolicySource::File(path.clone()));
        } else if let Some(file) = path
            .to_str()
            .and_then(|name| named_policy_file(name, policy_dirs))
        {
            out.push(PolicySource::File(file));
        } else if let Some(name) = builtin_name(path) {
            out.push(PolicySource::Builtin(name));
        } else {
            bail!(
                "{}: no such file or directory, and not a built-in policy name",
                path.display()
            );
        }
    }
    Ok(out)
}

fn builtin_name(path: &Path) -> Option<String> {
    let name = path.to_str()?;
    builtin::policy(name).map(|_| name.to_string())
}
