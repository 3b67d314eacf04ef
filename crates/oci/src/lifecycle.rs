//! `update`, `pause`, `resume`, and signals delivered into a container
//! rather than ending it (runc's command line for each).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use substrat_oci::state::{self, Status};
use substrat_oci::update::{self, Asked, Setting};

use crate::operator::Operator;

#[derive(Debug, clap::Args)]
pub struct UpdateArgs {
    /// `linux.resources` as JSON, from this file or `-` (stdin).
    #[arg(long, short)]
    resources: Option<PathBuf>,
    /// Memory limit (bytes, or with k, m, g; -1: none).
    #[arg(long, short, allow_hyphen_values = true)]
    memory: Option<String>,
    /// Memory plus swap: accepted, not applied.
    #[arg(long, allow_hyphen_values = true)]
    memory_swap: Option<String>,
    /// CFS quota in microseconds (-1: none).
    #[arg(long, allow_hyphen_values = true)]
    cpu_quota: Option<i64>,
    /// CFS period in microseconds.
    #[arg(long)]
    cpu_period: Option<u64>,
    /// A CPU weight: accepted, not applied.
    #[arg(long)]
    cpu_share: Option<u64>,
    /// Maximum number of processes (-1: none).
    #[arg(long, allow_hyphen_values = true)]
    pids_limit: Option<i64>,
    /// Refused: CPU sets are not supported.
    #[arg(long)]
    cpuset_cpus: Option<String>,
    /// Refused: CPU sets are not supported.
    #[arg(long)]
    cpuset_mems: Option<String>,
    /// Refused: block I/O is not supported.
    #[arg(long)]
    blkio_weight: Option<u16>,
    /// Refused: no kernel memory limit.
    #[arg(long)]
    kernel_memory: Option<String>,
    /// Refused: no memory reservation.
    #[arg(long)]
    memory_reservation: Option<String>,
    id: String,
}

/// A size as runc reads it: bytes, or a number with k, m, g (powers of
/// 1024, `b` and a trailing `b` or `i`/`ib` allowed).
fn bytes(text: &str) -> Result<i64> {
    let lower = text.trim().to_ascii_lowercase();
    if lower == "-1" {
        return Ok(-1);
    }
    let split = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let n: i64 = digits.parse().with_context(|| format!("size `{text}`"))?;
    let shift = match unit.trim_end_matches('b').trim_end_matches('i') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => bail!("size `{text}`: unknown unit"),
    };
    n.checked_mul(1 << shift)
        .with_context(|| format!("size `{text}` is too large"))
}

fn asked(args: &UpdateArgs) -> Result<Asked> {
    let refused = [
        ("--cpuset-cpus", args.cpuset_cpus.is_some()),
        ("--cpuset-mems", args.cpuset_mems.is_some()),
        ("--blkio-weight", args.blkio_weight.is_some()),
        ("--kernel-memory", args.kernel_memory.is_some()),
        ("--memory-reservation", args.memory_reservation.is_some()),
    ];
    if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
        bail!("{flag}: not supported by this runtime");
    }
    let mut asked = match &args.resources {
        Some(path) => {
            let mut bytes = Vec::new();
            if path.as_os_str() == "-" {
                std::io::stdin().take(1 << 20).read_to_end(&mut bytes)?;
            } else {
                bytes = std::fs::read(path)
                    .with_context(|| format!("--resources {}", path.display()))?;
            }
            update::parse(&bytes)?
        }
        None => Asked::default(),
    };
    // The single flags win over the file, as in runc.
    if let Some(memory) = &args.memory {
        asked.memory = Setting::of(bytes(memory)?).or(asked.memory);
    }
    if args.memory_swap.is_some() {
        asked
            .notes
            .push("--memory-swap: not applied (no swap limit is set)".into());
    }
    if let Some(quota) = args.cpu_quota {
        asked.cpu_quota = Setting::of(quota).or(asked.cpu_quota);
    }
    if let Some(period) = args.cpu_period {
        asked.cpu_period = Some(period).filter(|p| *p > 0).or(asked.cpu_period);
    }
    if args.cpu_share.is_some_and(|s| s != 1024) {
        asked
            .notes
            .push("--cpu-share: not applied (the default weight is kept)".into());
    }
    if let Some(pids) = args.pids_limit {
        asked.pids = Setting::of(pids).or(asked.pids);
    }
    Ok(asked)
}

pub fn update(root: &Path, args: &UpdateArgs, operator: &Operator) -> Result<()> {
    let asked = asked(args)?;
    let (dir, record) = state::load(root, &args.id)?;
    let status = state::status(&dir, &record);
    if status == Status::Stopped {
        bail!("container `{}` is not running", args.id);
    }
    // The policies `create` recorded: the operator's and the annotation's.
    let policies: Vec<_> = operator
        .policies(&record.policies)?
        .into_iter()
        .map(|p| {
            let c = &p.policy.cgroup;
            let limits = substrat_sandbox::plan::CgroupLimits {
                pids_max: c.pids_max,
                memory_max: c.memory_max.map(|m| m.0),
                cpu_max: c.cpu_max,
                enforcement: c.enforcement,
            };
            (p.name, limits)
        })
        .collect();
    let path = substrat_oci::freeze::recorded_path(&dir)
        .ok_or_else(|| update::UpdateError::NoGroup(args.id.clone()))?;
    for note in &asked.notes {
        eprintln!("{}: {note}", args.id);
    }
    // Checked there against the policies, with the CPU bandwidth as it
    // results (what is asked, the rest as it is), before anything is written.
    update::apply(&path, &args.id, record.pid, &asked, &policies)?;
    Ok(())
}

pub fn pause(root: &Path, id: &str) -> Result<()> {
    let (dir, record) = state::load(root, id)?;
    match state::status(&dir, &record) {
        Status::Running | Status::Created => Ok(substrat_oci::freeze::pause(&dir, id)?),
        Status::Paused => bail!("container `{id}` is paused already"),
        Status::Stopped => bail!("container `{id}` is not running"),
    }
}

pub fn resume(root: &Path, id: &str) -> Result<()> {
    let (dir, record) = state::load(root, id)?;
    match state::status(&dir, &record) {
        Status::Paused => Ok(substrat_oci::freeze::resume(&dir, id)?),
        Status::Stopped => bail!("container `{id}` is not running"),
        _ => bail!("container `{id}` is not paused"),
    }
}

/// What runc answers for a kill of a stopped container; containerd's shim
/// takes exactly these words for "already gone" (`checkKillError`).
const NOT_RUNNING: &str = "container not running";

pub fn kill(root: &Path, id: &str, signal: &str, all: bool) -> Result<()> {
    let kind = parse_signal(signal)?;
    let (dir, record) = state::load(root, id)?;
    if state::status(&dir, &record) == Status::Stopped {
        // runc: `kill --all` of a stopped container whose cgroup is gone
        // succeeds (the launcher removed ours before it exited); without
        // --all it fails with "container not running".
        if all {
            return Ok(());
        }
        bail!("container `{id}`: {NOT_RUNNING}");
    }
    let number = match kind {
        Kind::Delivered(signal) => {
            return deliver(&record, signal, all);
        }
        Kind::Ends(number) => number,
    };
    // The launcher reports the container ended by this signal (128 + N),
    // as if it had been delivered.
    std::fs::write(dir.join(crate::launcher::KILLED_BY), number.to_string())
        .context("cannot record the signal")?;
    crate::launch::end(&dir, &record);
    Ok(())
}

/// What `kill` does with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TERM, KILL, INT, QUIT: the launcher ends the whole container.
    Ends(i32),
    /// Any other: delivered to the container's process (`--all`: to every
    /// process of it), which decides what it means.
    Delivered(Signal),
}

/// A signal by name (with or without SIG) or number.
pub fn parse_signal(text: &str) -> Result<Kind> {
    let signal = match text.parse::<i32>() {
        Ok(n) => Signal::try_from(n).ok(),
        Err(_) => {
            let upper = text.to_ascii_uppercase();
            let name = upper.strip_prefix("SIG").unwrap_or(&upper);
            format!("SIG{name}").parse::<Signal>().ok()
        }
    };
    match signal {
        Some(s @ (Signal::SIGTERM | Signal::SIGKILL | Signal::SIGINT | Signal::SIGQUIT)) => {
            Ok(Kind::Ends(s as i32))
        }
        Some(s) => Ok(Kind::Delivered(s)),
        None => {
            bail!("signal `{text}`: not a signal this runtime knows (1 to 31, by name or number)")
        }
    }
}

/// The container's process: the first child of its init (the launcher's
/// child is the holder, the holder's is init).
fn command_pid(launcher: i32) -> Option<i32> {
    let holder = state::first_child(launcher)?;
    let init = state::first_child(holder)?;
    state::first_child(init)
}

/// Every process of the container's pid namespace but its init (whose
/// namespace ignores what it does not handle anyway).
fn all_pids(launcher: i32) -> Vec<i32> {
    let Some(init) = state::first_child(launcher).and_then(state::first_child) else {
        return Vec::new();
    };
    let Ok(namespace) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != init)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|n| n == namespace)
        })
        .collect()
}

/// Delivers `signal` to the container's process (or every process of it).
pub fn deliver(record: &state::Record, signal: Signal, all: bool) -> Result<()> {
    let targets = if all {
        all_pids(record.pid)
    } else {
        command_pid(record.pid).into_iter().collect()
    };
    if targets.is_empty() {
        bail!(
            "container `{}`: its process is not running yet (start it first)",
            record.id
        );
    }
    for pid in targets {
        match nix::sys::signal::kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => bail!(
                "container `{}`: cannot send {signal} to {pid}: {e}",
                record.id
            ),
        }
    }
    Ok(())
}

/// The variable that names where a debug build kills itself (SIGKILL),
/// for the tests of what a runtime killed midway leaves.
pub const DIE_AT: &str = "SUBSTRAT_OCI_TEST_DIE_AT";

/// In a debug build, dies of SIGKILL here when `DIE_AT` names `point`
/// (stops, SIGSTOP, when it names `stop:POINT`: a slow runtime).
pub fn test_death(point: &str) {
    if !cfg!(debug_assertions) {
        return;
    }
    match std::env::var(DIE_AT) {
        Ok(p) if p == point => {
            let _ = nix::sys::signal::raise(Signal::SIGKILL);
        }
        Ok(p) if p.strip_prefix("stop:") == Some(point) => {
            let _ = nix::sys::signal::raise(Signal::SIGSTOP);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_signals_end_and_the_others_are_delivered() {
        for (text, ends) in [("TERM", 15), ("SIGKILL", 9), ("2", 2), ("sigquit", 3)] {
            assert_eq!(parse_signal(text).ok(), Some(Kind::Ends(ends)), "{text}");
        }
        for (text, signal) in [
            ("USR1", Signal::SIGUSR1),
            ("SIGHUP", Signal::SIGHUP),
            ("28", Signal::SIGWINCH),
            ("SIGSTOP", Signal::SIGSTOP),
        ] {
            assert_eq!(
                parse_signal(text).ok(),
                Some(Kind::Delivered(signal)),
                "{text}"
            );
        }
        for bad in ["", "0", "64", "SIGNOPE", "-9"] {
            assert!(parse_signal(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn sizes_are_read_as_runc_reads_them() {
        assert_eq!(bytes("64m").ok(), Some(64 << 20));
        assert_eq!(bytes("1G").ok(), Some(1 << 30));
        assert_eq!(bytes("512").ok(), Some(512));
        assert_eq!(bytes("-1").ok(), Some(-1));
        assert!(bytes("12q").is_err());
    }
}
