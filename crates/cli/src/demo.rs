//! `substrat-sandbox demo`: a sandboxed agent team from start to end. A
//! daemon in a temporary state directory runs the stand-in agent; a lead
//! spawns two workers, asks one a sync question and gets the reply as its
//! next turn, broadcasts, reads its inbox; a worker's attempts on its
//! sibling's workspace and on its own mcp.json fail. Exit 0 only if every
//! step happened.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use substrat_broker::control::Request;

use crate::daemon::call;
use crate::team_plan::{TeamPaths, lead_instructions};

/// The demo's exit status: 0 when every step held, 1 when one did not, 2
/// when it could not run.
pub fn exit_code(outcome: Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!(
                "substrat-sandbox demo: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

/// A child process (the daemon, the scripted model) stopped when dropped.
pub(crate) struct Stopped(pub Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SIGTERM: a clean shutdown, as an operator would stop it.
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.0.wait();
    }
}

/// The demo's temporary directory (its workspace `ws` and state
/// directory `state`): removed when the demo ends, however it ends,
/// unless kept; either way it says where it was.
pub(crate) struct DemoDir {
    pub(crate) root: PathBuf,
    keep: bool,
}

impl DemoDir {
    /// A fresh directory of this user's alone (0700, a random name made
    /// with `mkdir`, which fails on anything already there): never one
    /// another local user made beforehand at a name they could predict
    /// (`substrat-demo-PID` was), whose entries they could swap for
    /// links while the demo writes through them.
    pub(crate) fn new(keep: bool) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::Builder::new()
            .prefix("substrat-demo-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .context("cannot create the demo directory")?
            .keep();
        std::fs::create_dir(root.join("ws")).context("cannot create the demo directory")?;
        Ok(Self { root, keep })
    }
}

impl Drop for DemoDir {
    fn drop(&mut self) {
        let shown = substrat_policy::text::escape_path(&self.root);
        if self.keep {
            println!("== kept {shown}");
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
            println!("== removed {shown} (--keep keeps it)");
        }
    }
}

/// How long nothing may run or wait before the demo says its team can no
/// longer finish (a turn's end and the turn it queued are one step apart).
const STALL: Duration = Duration::from_secs(2);

/// Notices a team that can no longer finish: no agent has a turn running
/// or queued, for `STALL` on end.
#[derive(Default)]
pub(crate) struct StallWatch {
    since: Option<Instant>,
}

impl StallWatch {
    /// `agents`: the answer of `agent list`; the reason once stalled.
    pub(crate) fn check(&mut self, agents: &[Value]) -> Option<String> {
        let busy = agents
            .iter()
            .any(|a| matches!(a["turn"]["status"].as_str(), Some("running" | "queued")));
        if busy || agents.is_empty() {
            self.since = None;
            return None;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        (since.elapsed() >= STALL).then(|| {
            let states: Vec<String> = agents
                .iter()
                .map(|a| {
                    crate::agent_text::safe(&format!(
                        "{} {}",
                        a["name"].as_str().unwrap_or("?"),
                        a["state"].as_str().unwrap_or("?")
                    ))
                })
                .collect();
            format!(
                "the team can no longer finish: no turn runs or waits ({})",
                states.join(", ")
            )
        })
    }
}

/// The stand-in team's demo; true if every step happened.
pub fn demo(keep: bool) -> Result<bool> {
    let dir = DemoDir::new(keep)?;
    let root = &dir.root;
    let ws = root.join("ws").canonicalize()?;
    let state = root.join("state");
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    println!(
        "== a daemon with the stand-in agent; state in {}",
        state.display()
    );
    let daemon = Stopped(
        Command::new(std::env::current_exe()?)
            .args(["daemon", "--provider", "stand-in", "--state-dir"])
            .arg(&state)
            .env("SUBSTRAT_LOG", "warn,rmcp=error")
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start the daemon")?,
    );
    wait_for_socket(
        &crate::daemon::control_socket(&state)?,
        Duration::from_secs(10),
    )?;
    let paths = TeamPaths {
        workspace: &ws,
        state_dir: &state,
        home: &home,
    };
    let spawned = call(
        &state,
        &Request::Spawn {
            name: "lead".into(),
            role: "worker".into(),
            workspace: ws.display().to_string(),
            model: None,
            provider: None,
            instructions: lead_instructions(&paths),
            args: Default::default(),
        },
    )?;
    if spawned["ok"] != true {
        bail!("spawn refused: {spawned}");
    }
    println!(
        "== spawned the lead in {}; its plan runs in turns",
        ws.display()
    );
    let stalled = wait_for_flow(&state)?;
    let ok = report(&state, &ws);
    if let Some(reason) = &stalled {
        println!("== stopped: {}", crate::agent_text::safe(reason));
    }
    drop(daemon);
    Ok(ok && stalled.is_none())
}

/// Waits until the daemon's control socket answers.
pub(crate) fn wait_for_socket(path: &Path, limit: Duration) -> Result<()> {
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        if start.elapsed() > limit {
            bail!("the daemon did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn inspect(state: &Path, name: &str) -> Result<Value> {
    let reply = call(state, &Request::Inspect { name: name.into() })?;
    Ok(reply["activity"].clone())
}

/// A progress line for a long wait: printed when what it says changes,
/// so a log gets a few lines and a person sees the team move.
pub(crate) struct Progress {
    last: String,
    start: Instant,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            last: String::new(),
            start: Instant::now(),
        }
    }

    /// `agents`: the answer of `agent list`.
    pub(crate) fn agents(&mut self, agents: &[Value]) {
        let states: Vec<String> = agents
            .iter()
            .map(|a| {
                format!(
                    "{} {}",
                    a["name"].as_str().unwrap_or("?"),
                    a["state"].as_str().unwrap_or("?")
                )
            })
            .collect();
        let line = states.join(", ");
        if line != self.last {
            println!("  ... {line} ({:.0} s)", self.start.elapsed().as_secs_f64());
            self.last = line;
        }
    }
}

/// Waits until the lead has had its four turns and nothing is queued, or
/// until the team can no longer get there (the reason).
fn wait_for_flow(state: &Path) -> Result<Option<String>> {
    let start = Instant::now();
    let mut progress = Progress::new();
    let mut stall = StallWatch::default();
    loop {
        let list = call(state, &Request::List)?;
        let agents = list["agents"].as_array().cloned().unwrap_or_default();
        progress.agents(&agents);
        let settled = agents.len() == 3
            && agents
                .iter()
                .all(|a| a["state"] == "idle" || a["state"] == "failed");
        let lead = inspect(state, "lead")?;
        let done = lead["recent_turns"]
            .as_array()
            .map_or(0, |t| t.iter().filter(|t| t["status"] == "done").count());
        if settled && done >= 4 {
            return Ok(None);
        }
        if let Some(reason) = stall.check(&agents) {
            return Ok(Some(reason));
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the flow did not finish in 120 s; last state: {list}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints the flow turn by turn, then each checked step; true if all held.
fn report(state: &Path, ws: &Path) -> bool {
    println!("== the turns, oldest first");
    let team = TeamTurns {
        lead: turns_of(state, "lead"),
        w1: turns_of(state, "w1"),
        w2: turns_of(state, "w2"),
    };
    println!("== what happened");
    let mut all = true;
    for (what, held) in team.checks(state, ws) {
        println!("  [{}] {what}", if held { "ok" } else { "FAILED" });
        all &= held;
    }
    let verdict = if all {
        "all steps happened"
    } else {
        "some steps did not happen"
    };
    println!("== {verdict}");
    all
}

/// An agent's recent turns, oldest first, each printed as it is read.
fn turns_of(state: &Path, name: &str) -> Vec<Value> {
    let mut turns = inspect(state, name)
        .ok()
        .and_then(|a| a["recent_turns"].as_array().cloned())
        .unwrap_or_default();
    turns.reverse();
    for t in &turns {
        println!(
            "  [{name}] {} turn, {}\n      got:      {}\n      answered: {}",
            t["kind"].as_str().unwrap_or("?"),
            t["status"].as_str().unwrap_or("?"),
            first_line(t["prompt"].as_str().unwrap_or("")),
            first_line(t["result"].as_str().or(t["error"].as_str()).unwrap_or(""))
        );
    }
    turns
}

/// A turn's answer, or nothing.
fn result_of(t: Option<&Value>) -> String {
    t.and_then(|t| t["result"].as_str())
        .unwrap_or("")
        .to_string()
}

struct TeamTurns {
    lead: Vec<Value>,
    w1: Vec<Value>,
    w2: Vec<Value>,
}

impl TeamTurns {
    /// Each step the demo promises, and whether the turns show it.
    fn checks(&self, state: &Path, ws: &Path) -> [(&'static str, bool); 7] {
        let (lead, w1, w2) = (&self.lead, &self.w1, &self.w2);
        let probe = result_of(w2.first());
        [
            (
                "the lead spawned w1 and w2 (each in a subdirectory of its workspace)",
                result_of(lead.first()).contains("call spawn_agent: ok:")
                    && w1.first().is_some_and(|t| t["kind"] == "instructions")
                    && w2.first().is_some_and(|t| t["kind"] == "instructions"),
            ),
            (
                "w1 answered the sync question in a turn of its own",
                w1.iter()
                    .any(|t| t["kind"] == "message" && result_of(Some(t)) == "the answer is 42"),
            ),
            (
                "the answer came back as the lead's next turn (`Reply from w1 ...`)",
                lead.get(1).is_some_and(|t| {
                    let prompt = t["prompt"].as_str().unwrap_or("");
                    t["kind"] == "reply"
                        && prompt.starts_with("Reply from w1 (to message ")
                        && prompt.ends_with("):\nthe answer is 42")
                        && result_of(Some(t)).contains("call broadcast: ok:")
                }),
            ),
            (
                "the broadcast reached both workers; each reply was a turn of the lead",
                lead.len() == 4 && lead[2..].iter().all(|t| t["kind"] == "reply"),
            ),
            (
                // The reports are read by whichever reply turn comes first
                // after they arrive: judged on the messages, delivered (taken
                // by check_inbox), not on the turns' (truncated) results.
                "the lead read both workers' reports from its inbox",
                reports_read(state),
            ),
            (
                "w2 could not read w1's workspace (not in its sandbox)",
                probe.contains(&format!(
                    "read {}/w1/notes.txt: error: No such file",
                    ws.display()
                )),
            ),
            (
                "w2 could not rewrite its mcp.json (read-only bind)",
                probe.contains("write .cursor/mcp.json: error: Read-only file system"),
            ),
        ]
    }
}

/// Whether both workers' reports reached the lead's inbox and were taken.
fn reports_read(state: &Path) -> bool {
    let messages = inspect(state, "lead")
        .ok()
        .and_then(|a| a["recent_messages"].as_array().cloned())
        .unwrap_or_default();
    ["w1", "w2"].iter().all(|worker| {
        messages.iter().any(|m| {
            m["kind"] == "report"
                && m["counterpart"] == *worker
                && m["direction"] == "in"
                && m["status"] == "delivered"
        })
    })
}

/// The text on one line (line breaks shown as ` / `), cut at 110 chars.
/// Its lines joined, cut to 110 characters and escaped (an agent's or
/// model's text: no terminal controls reach the operator's terminal).
fn first_line(text: &str) -> String {
    let line = text.lines().collect::<Vec<_>>().join(" / ");
    let cut: String = line.chars().take(110).collect();
    let shown = crate::agent_text::safe(&cut);
    if cut.len() < line.len() {
        format!("{shown} ...")
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::DemoDir;

    #[test]
    fn a_turns_text_is_shown_escaped() {
        let shown = super::first_line("done\u{1b}]52;c;cHduZWQ=\u{7}\nnext\u{9b}2J");
        assert!(shown.starts_with("done"), "{shown}");
        assert!(shown.contains(" / next"), "{shown}");
        assert!(
            !shown.contains(['\u{1b}', '\u{7}', '\u{9b}']),
            "controls reach the terminal: {shown:?}"
        );
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Another local user can make `substrat-demo-PID` in the shared
    /// temporary directory before the demo runs (PIDs are predictable):
    /// the demo must not work in it.
    #[test]
    fn the_demo_never_works_in_a_directory_made_before_it() {
        let planted = std::env::temp_dir().join(format!("substrat-demo-{}", std::process::id()));
        std::fs::create_dir_all(planted.join("ws")).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = DemoDir::new(false).unwrap();
        let root = dir.root.clone();
        assert_ne!(root, planted, "the demo took the planted directory");
        let meta = std::fs::symlink_metadata(&root).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o777, 0o700, "{}", root.display());
        assert_eq!(meta.uid(), rustix::process::getuid().as_raw());
        assert!(root.join("ws").is_dir());
        drop(dir);
        assert!(!root.exists(), "not removed");
        assert!(
            planted.exists(),
            "the planted directory is not the demo's to remove"
        );
        std::fs::remove_dir_all(&planted).unwrap();
    }
}
