//! `substrat-sandbox learn [--policy BASE] [--workspace DIR] [--out FILE]
//! -- CMD...` (docs/learn.md): runs CMD in sandboxes built from the base
//! and from each candidate, observed from outside (`observe`), until a run
//! wants nothing new; plans the least binds (substrat_policy::learn); then
//! audits the policy (`check --fail-on high`) and replays CMD under it,
//! and writes it only when both pass. Every run is a real launcher in a
//! fresh process, never this one.

mod decode;
pub mod exec;
mod host;
mod observe;
mod out;
mod vet;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};

use anyhow::{Context, Result, bail};
use substrat_policy::LoadOptions;
use substrat_policy::learn::{Observations, Plan, PlanInput, plan};
use substrat_policy::paths::ExpandContext;

use substrat_policy::text::escape_text as escape;

pub const LONG_HELP: &str = "\
Run a command in a sandbox built from a base policy (default: worker), see from outside the \
sandbox every path it opens, executes, lists or looks up and every address it connects to, and \
write the policy that extends the base with the least binds it needs. Runs repeat under each \
candidate until one wants nothing new (--rounds). A path in a secret place (SSH and cloud \
credentials, the host's keys, container sockets: those `check` knows) is reported as wanted, not \
granted, and never added. The policy is written only when `check --fail-on high` passes on it and \
the command, replayed under it unobserved, ends as it did when learned.\n\n\
Examples:\n  substrat-sandbox learn --out make.toml -- make test\n  \
substrat-sandbox learn --policy strict --workspace ~/proj -- git status";

#[derive(Debug, clap::Args)]
pub struct LearnArgs {
    /// The base policy: a file, or a built-in name (worker, reviewer, strict).
    #[arg(long, default_value = "worker", value_name = "POLICY")]
    pub policy: String,
    /// The workspace (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Write the learned policy here (default: stdout; the command's own stdout goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The sandbox backend of every run (as `run --backend`).
    #[arg(long, value_enum, default_value_t = crate::launch::BackendArg::Auto)]
    pub backend: crate::launch::BackendArg,
    /// At most this many observed runs before the learned policy must settle.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub rounds: u32,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Exit 0: written; 1: the checks or the replay failed (nothing written);
/// 2: usage or setup.
pub fn learn(args: &LearnArgs) -> ExitCode {
    match learn_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("substrat-sandbox learn: {}", crate::term::error_text(&e));
            ExitCode::from(2)
        }
    }
}

/// What every run of one learning shares.
struct Learning {
    program: PathBuf,
    backend: &'static str,
    workspace: PathBuf,
    command: Vec<OsString>,
    scratch: tempfile::TempDir,
}

impl Learning {
    fn run_args(&self, policy: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["run".into(), "--policy".into(), policy.into()];
        a.extend(["--backend".into(), self.backend.into()]);
        a.push("--workspace".into());
        a.push(self.workspace.clone().into());
        a.push("--".into());
        a.extend(self.command.iter().cloned());
        a
    }
}

/// The plan's input, and the host places the base lets the command write.
fn plan_input(args: &LearnArgs, workspace: &Path) -> Result<(PlanInput, Vec<PathBuf>)> {
    let loaded = crate::launch::load_policy(&args.policy, &LoadOptions::default())?;
    if matches!(
        loaded.seccomp,
        substrat_policy::load::SeccompChoice::Unconfined
    ) {
        bail!(
            "policy {}: learn needs a seccomp profile in the base (the observer tells the \
             sandbox's processes by the filter loaded just before the command)",
            args.policy
        );
    }
    // Resolved (`..` and links): the home is judged where it is.
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .map(|h| h.canonicalize().unwrap_or(h));
    substrat_policy::learn::secret::set_homes(host::passwd_homes());
    let ctx = ExpandContext {
        home: home.clone().unwrap_or_else(|| PathBuf::from("/")),
        workspace: workspace.to_path_buf(),
        agent_id: "learn".to_string(),
    };
    let fs = &loaded.policy.filesystem;
    let mut covered: Vec<PathBuf> = fs
        .binds
        .iter()
        .map(|b| b.target())
        .chain(fs.tmpfs.iter())
        .filter_map(|t| t.expand(&ctx).ok())
        .collect();
    covered.extend(["/proc", "/dev", "/sys"].map(PathBuf::from));
    // The launcher's own directory inside (the workspace's git directory,
    // the bridges' sockets): never the host's.
    if let Some(own) = Path::new(substrat_sandbox::gitdir::GIT_DIR_INSIDE).parent() {
        covered.push(own.to_path_buf());
    }
    covered.push(workspace.to_path_buf());
    let writable: Vec<PathBuf> = fs
        .binds
        .iter()
        .filter(|b| b.writable())
        .filter_map(|b| b.source.expand(&ctx).ok())
        .collect();
    // `extends` of a file is its absolute path; a name stays a name.
    let base = if args.policy.contains('/') || args.policy.ends_with(".toml") {
        Path::new(&args.policy)
            .canonicalize()
            .with_context(|| format!("policy {}", args.policy))?
            .display()
            .to_string()
    } else {
        args.policy.clone()
    };
    let input = PlanInput {
        base,
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        home,
        covered,
    };
    Ok((input, writable))
}

/// The binds as a comparable set: what a run was given.
fn granted(plan: &Plan) -> Vec<(PathBuf, bool)> {
    plan.binds
        .iter()
        .map(|b| (b.source.clone(), b.writable))
        .collect()
}

fn learn_inner(args: &LearnArgs) -> Result<ExitCode> {
    let program = std::env::current_exe().context("cannot find this program")?;
    let given = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let workspace = given
        .canonicalize()
        .with_context(|| format!("workspace {}", given.display()))?;
    let (input, base_writable) = plan_input(args, &workspace)?;
    // Where the command can write, the policy is never written: it could
    // plant a link there, or replace the file after the check.
    let out = args
        .out
        .as_deref()
        .map(|o| out::destination(o, &workspace, &base_writable))
        .transpose()?;
    let learning = Learning {
        program,
        backend: match args.backend {
            crate::launch::BackendArg::Auto => "auto",
            crate::launch::BackendArg::Native => "native",
            crate::launch::BackendArg::Bwrap => "bwrap",
        },
        workspace,
        command: args.command.clone(),
        scratch: tempfile::Builder::new()
            .prefix("substrat-learn")
            .tempdir()?,
    };
    let (planned, text, learned_status) = settle(args, &learning, &input)?;
    let file = learning.scratch.path().join("learned.toml");
    std::fs::write(&file, &text)?;
    if let Some(code) = audit_and_replay(&learning, &file, learned_status)? {
        return Ok(code);
    }
    summary(&planned, &input);
    match &out {
        Some(out) => {
            let written: Vec<PathBuf> = planned
                .binds
                .iter()
                .filter(|b| b.writable)
                .map(|b| b.source.clone())
                .collect();
            out::write(out, &text, &written)?
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Observed runs until one is given everything the plan asks: the plan,
/// its policy text, and that last run's status. Every candidate passes
/// `check --fail-on high` (`vet`) before a run under it.
fn settle(
    args: &LearnArgs,
    learning: &Learning,
    input: &PlanInput,
) -> Result<(Plan, String, ExitStatus)> {
    let mut observed = Observations::default();
    let mut given: Vec<(PathBuf, bool)> = Vec::new();
    let mut policy = args.policy.clone();
    for round in 1..=args.rounds {
        let started = std::time::Instant::now();
        let (status, seen) = observe::observe(
            &learning.program,
            &learning.run_args(&policy),
            learning.scratch.path(),
        )?;
        eprintln!(
            "learn: run {round}: {} calls, {} paths and {} destinations seen, {}, {:.2} s",
            seen.calls,
            seen.paths.len(),
            seen.destinations.len(),
            status_text(status),
            started.elapsed().as_secs_f64()
        );
        // Every command executes at least itself: nothing seen means the
        // sandbox never started (the launcher said why above).
        if seen.paths.is_empty() {
            bail!("run {round} did not start the command: no policy is offered");
        }
        observed.merge(seen);
        if observed.truncated {
            bail!(
                "the command used more than {} paths or {} bytes of names: the record is \
                 incomplete, no policy is offered",
                substrat_policy::learn::MAX_PATHS,
                substrat_policy::learn::MAX_PATH_BYTES
            );
        }
        let file = learning.scratch.path().join(format!("round-{round}.toml"));
        let (planned, text) = vet::vet(
            &learning.program,
            &file,
            plan(&observed, input, &host::RealHost),
            &observed,
            input,
        )?;
        if granted(&planned) == given {
            return Ok((planned, text, status));
        }
        given = granted(&planned);
        policy = file.display().to_string();
    }
    bail!(
        "the command still wanted more after {} runs (--rounds): it may not do the same each run",
        args.rounds
    )
}

fn status_text(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit {code}"),
        None => format!("{status}"),
    }
}

/// `check --fail-on high` on the policy, then the command replayed under
/// it, unobserved: an exit code when either fails (nothing is written).
fn audit_and_replay(
    learning: &Learning,
    file: &Path,
    learned: ExitStatus,
) -> Result<Option<ExitCode>> {
    let check = Command::new(&learning.program)
        .args(["check", "--fail-on", "high"])
        .arg(file)
        .stdout(Stdio::piped())
        .output()
        .context("cannot run check")?;
    if !check.status.success() {
        eprintln!(
            "substrat-sandbox learn: the learned policy fails `check --fail-on high`; not written:\n{}",
            String::from_utf8_lossy(&check.stdout)
        );
        return Ok(Some(ExitCode::from(1)));
    }
    let replay = Command::new(&learning.program)
        .args(learning.run_args(&file.display().to_string()))
        .stdout(observe::stderr_for_stdout()?)
        .status()
        .context("cannot replay the command")?;
    eprintln!(
        "learn: replay under the learned policy: {}",
        status_text(replay)
    );
    if replay.code() != learned.code() {
        eprintln!(
            "substrat-sandbox learn: the replay ended with {}, the learned run with {}: not written",
            status_text(replay),
            status_text(learned)
        );
        return Ok(Some(ExitCode::from(1)));
    }
    Ok(None)
}

fn summary(planned: &Plan, input: &PlanInput) {
    eprintln!(
        "learn: {} binds added to {}; check passed; the replay ended as learned",
        planned.binds.len(),
        escape(&input.base)
    );
    for r in &planned.refused {
        eprintln!(
            "learn: wanted, not granted: {} ({})",
            substrat_policy::text::escape_path(&r.path),
            escape(&r.why)
        );
    }
}
