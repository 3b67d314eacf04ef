//! Which probe `check --prove` runs inside, and the proof that it speaks
//! this prover's battery. A probe from another build (the static copy
//! `scripts/static-probe` left, older than the code) would run another
//! battery and be judged by this one's table: it is never used.
//!
//! The probe is looked for, in order: `$SUBSTRAT_PROBE` when set (then
//! only there: a probe named on purpose is used or refused, never
//! swapped), else beside this program (where `cargo build` and
//! `cargo install` put it): `substrat-probe-static` (starts in any view),
//! then `substrat-probe`. Each is asked `battery-version`; the first whose
//! answer is this prover's is used, and each one passed over is named with
//! why.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// The environment variable naming the probe to run (tests, packagers).
pub const PROBE_ENV: &str = "SUBSTRAT_PROBE";

/// How long a probe may take to say its battery.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The probe chosen, and why any other was passed over.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub path: PathBuf,
    /// Set when a probe found first was passed over: which, and why.
    pub note: Option<String>,
}

/// The probe to run, chosen once per process (and its note printed once
/// on stderr).
pub fn chosen() -> Result<Chosen> {
    static CHOSEN: OnceLock<Result<Chosen, String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let chosen = choose().map_err(|e| format!("{e:#}"));
        if let Ok(Chosen {
            path,
            note: Some(note),
        }) = &chosen
        {
            eprintln!("check --prove: using {}: {note}", path.display());
        }
        chosen
    });
    match chosen {
        Ok(chosen) => Ok(chosen.clone()),
        Err(e) => bail!("{e}"),
    }
}

fn choose() -> Result<Chosen> {
    let want = substrat_battery::version_line();
    if let Some(named) = std::env::var_os(PROBE_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(named);
        return match speaks(&path, &want) {
            Ok(()) => Ok(Chosen { path, note: None }),
            Err(why) => bail!(
                "refusing to prove with {} ({PROBE_ENV}): {why}; nothing was judged",
                path.display()
            ),
        };
    }
    let exe = std::env::current_exe()?;
    let candidates: Vec<PathBuf> = ["substrat-probe-static", "substrat-probe"]
        .iter()
        .map(|name| exe.with_file_name(name))
        .filter(|p| p.is_file())
        .collect();
    if candidates.is_empty() {
        bail!(
            "substrat-probe is missing: check --prove runs it inside the sandbox \
             (install it beside {}, or name it in {PROBE_ENV})",
            exe.display()
        );
    }
    let mut passed_over = Vec::new();
    for path in candidates {
        match speaks(&path, &want) {
            Ok(()) => {
                let note = (!passed_over.is_empty()).then(|| passed_over.join("; "));
                return Ok(Chosen { path, note });
            }
            Err(why) => passed_over.push(format!("{} passed over: {why}", path.display())),
        }
    }
    bail!(
        "refusing to prove: no probe beside {} speaks this battery ({}); nothing was judged. \
         Rebuild them (`cargo build -p substrat-probe`, scripts/static-probe)",
        exe.display(),
        passed_over.join("; ")
    )
}

/// Whether the probe at `path` answers `want` to `battery-version`; if
/// not, what it said.
fn speaks(path: &Path, want: &str) -> Result<(), String> {
    let said = version_of(path)?;
    if said == want {
        return Ok(());
    }
    let theirs = match said.strip_prefix("substrat-battery ") {
        Some(digest) => format!("battery {digest}"),
        None => "no battery version (a build older than this check)".to_string(),
    };
    Err(format!(
        "it speaks {theirs}, this prover {}: built from other source{}",
        want.trim_start_matches("substrat-"),
        if path.ends_with("substrat-probe-static") {
            " (rebuild it with scripts/static-probe)"
        } else {
            ""
        }
    ))
}

/// The first line the probe prints to `battery-version`, run on the host
/// (nothing but that line is asked of it), within [`ANSWER_TIMEOUT`].
fn version_of(path: &Path) -> Result<String, String> {
    let mut child = Command::new(path)
        .arg(substrat_battery::VERSION_COMMAND)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("it does not start: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > ANSWER_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it did not answer {} within {} s",
                    substrat_battery::VERSION_COMMAND,
                    ANSWER_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    }
    let mut out = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout.take(4096).read_to_string(&mut out);
    }
    Ok(out.lines().next().unwrap_or("").trim().to_string())
}
