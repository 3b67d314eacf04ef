//! What the live view reads at each refresh (the daemon's `list`, the
//! selected agent's `inspect`, `tools`, and the end of its audit log) and
//! the operator's actions on an agent.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use substrat_broker::audit::{self, Recorded};
use substrat_broker::control::Request;

use crate::agent_text::safe;
use crate::daemon::call;

/// How much of the audit log's end is read for an agent's last calls.
const AUDIT_TAIL: u64 = 256 << 10;
/// An agent's last tool calls shown.
const CALLS_SHOWN: usize = 5;
/// The most of a diff kept for the view (the rest is said to be cut).
const DIFF_BYTES: u64 = 4 << 20;

/// One refresh.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub agents: Vec<Value>,
    pub servers: Vec<Value>,
    /// The selected agent's `inspect` and its last calls.
    pub detail: Option<(Value, Vec<Recorded>)>,
    /// Why the daemon could not be read, escaped.
    pub error: Option<String>,
}

/// Reads the team; `selected` (a name) also gets its details.
pub fn fetch(state_dir: &Path, selected: Option<&str>) -> Snapshot {
    let mut snapshot = Snapshot::default();
    match answered(state_dir, &Request::List) {
        Ok(reply) => snapshot.agents = array(&reply["agents"]),
        Err(e) => {
            snapshot.error = Some(e);
            return snapshot;
        }
    }
    if let Ok(reply) = answered(state_dir, &Request::Tools) {
        snapshot.servers = array(&reply["servers"]);
    }
    let chosen = selected.and_then(|name| snapshot.agents.iter().find(|a| a["name"] == name));
    if let Some(agent) = chosen {
        let name = agent["name"].as_str().unwrap_or("").to_string();
        let id = agent["id"].as_str().unwrap_or("").to_string();
        if let Ok(reply) = answered(state_dir, &Request::Inspect { name }) {
            snapshot.detail = Some((reply, last_calls(state_dir, &id)));
        }
    }
    snapshot
}

fn array(value: &Value) -> Vec<Value> {
    value.as_array().cloned().unwrap_or_default()
}

/// The daemon's reply when it said yes; its refusal or the failure to
/// reach it as text for the status line, escaped.
fn answered(state_dir: &Path, request: &Request) -> Result<Value, String> {
    let reply = call(state_dir, request).map_err(|e| safe(&format!("{e:#}")))?;
    if reply["ok"] == Value::Bool(true) {
        Ok(reply)
    } else {
        Err(safe(reply["message"].as_str().unwrap_or("refused")))
    }
}

/// The agent's last decisions in this daemon's audit log.
fn last_calls(state_dir: &Path, agent_id: &str) -> Vec<Recorded> {
    let Ok(mut file) = std::fs::File::open(state_dir.join("audit.log")) else {
        return Vec::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut tail = Vec::new();
    let read = file
        .seek(SeekFrom::Start(length.saturating_sub(AUDIT_TAIL)))
        .and_then(|_| file.take(AUDIT_TAIL).read_to_end(&mut tail));
    match read {
        Ok(_) => audit::recent(&tail, agent_id, CALLS_SHOWN),
        Err(_) => Vec::new(),
    }
}

/// What the operator can do to the selected agent from the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Suspend,
    Resume,
    Kill,
}

/// Asks the daemon; the outcome as a line for the status bar.
pub fn act(state_dir: &Path, action: Action, name: &str) -> String {
    let name = name.to_string();
    let (request, done) = match action {
        Action::Suspend => (Request::Suspend { name: name.clone() }, "suspended"),
        Action::Resume => (Request::Resume { name: name.clone() }, "resumed"),
        Action::Kill => (Request::Kill { name: name.clone() }, "killed"),
    };
    match answered(state_dir, &request) {
        Ok(_) => format!("{} {done}", safe(&name)),
        Err(e) => format!("{}: {e}", safe(&name)),
    }
}

/// The arguments of `agent diff` for `name`: options first, then `--`,
/// as an agent's name may start with a dash (`--stat`, `-h`).
fn diff_args(state_dir: &Path, name: &str) -> Vec<std::ffi::OsString> {
    vec![
        "agent".into(),
        "diff".into(),
        "--state-dir".into(),
        state_dir.into(),
        "--".into(),
        name.into(),
    ]
}

/// The agent's diff (`agent diff NAME`, this program in a process of its
/// own), as lines to scroll, escaped.
pub fn diff(state_dir: &Path, name: &str) -> Vec<String> {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return vec![safe(&format!("cannot find this program: {e}"))],
    };
    let child = Command::new(program)
        .args(diff_args(state_dir, name))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return vec![safe(&format!("cannot run `agent diff`: {e}"))],
    };
    // Its errors are read beside its output (either could fill its pipe).
    let stderr = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut err = err;
            let _ = (&mut err).take(64 << 10).read_to_end(&mut kept);
            let _ = std::io::copy(&mut err, &mut std::io::sink());
            kept
        })
    });
    let mut text = Vec::new();
    if let Some(out) = child.stdout.take() {
        let _ = out.take(DIFF_BYTES).read_to_end(&mut text);
    }
    let cut = text.len() as u64 >= DIFF_BYTES;
    // What is past the cut is not read: the child is stopped instead.
    let _ = child.kill();
    let _ = child.wait();
    let errors = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    let mut lines: Vec<String> =
        substrat_policy::text::escape_lines(&String::from_utf8_lossy(&text))
            .lines()
            .map(str::to_string)
            .collect();
    lines.extend(
        substrat_policy::text::escape_lines(&String::from_utf8_lossy(&errors))
            .lines()
            .map(str::to_string),
    );
    if cut {
        lines.push(format!("(cut at {} MiB)", DIFF_BYTES >> 20));
    }
    if lines.is_empty() {
        lines.push(format!("{}: no changes", safe(name)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::diff_args;
    use crate::{AgentCommand, Cli, Command};
    use clap::Parser;
    use std::path::Path;

    /// Agent names may start with a dash (`--stat`, `-h`): the diff asked
    /// for is still that agent's, of that state directory.
    #[test]
    fn the_diff_of_an_agent_named_like_an_option_is_its_own() {
        for name in ["--stat", "-h", "--", "--state-dir"] {
            let args = diff_args(Path::new("/st"), name);
            let cli = Cli::try_parse_from(std::iter::once("substrat-sandbox".into()).chain(args))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let Command::Agent(agent) = cli.command else {
                panic!("{name}: not an agent command");
            };
            match agent.command {
                AgentCommand::Diff { name: got, stat } => {
                    assert_eq!((got.as_str(), stat), (name, false));
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
