//! `substrat-sandbox agent ...` for people: one line per answer, and
//! `inspect` as text (`--json` gives machines the whole answer).

use std::fmt::Write as _;

use serde_json::Value;

use crate::AgentCommand;

pub fn print_human(command: &AgentCommand, reply: &Value) {
    print!("{}", human_text(command, reply));
}

/// What `print_human` prints: every string of the reply (names, states,
/// reasons, the agents' own words) through `safe`.
pub fn human_text(command: &AgentCommand, reply: &Value) -> String {
    match command {
        AgentCommand::Spawn { .. } => format!(
            "spawned {} ({}); its first turn is queued\n",
            field(&reply["name"]),
            field(&reply["id"])
        ),
        AgentCommand::Suspend { name } => format!("suspended {}\n", safe(name)),
        AgentCommand::Cert { name, .. } => format!(
            "a certificate for {} (sha256 {}; {} valid for it now): {}, {}, {}\n",
            safe(name),
            field(&reply["fingerprint"]),
            reply["certificates"].as_u64().unwrap_or(0),
            field(&reply["cert"]),
            field(&reply["key"]),
            field(&reply["ca"])
        ),
        AgentCommand::Resume { name } => format!("resumed {}\n", safe(name)),
        AgentCommand::Kill { name } => format!("killed {}: failed until resumed\n", safe(name)),
        AgentCommand::Create { .. } => format!(
            "created {} ({}), socket {}\n",
            field(&reply["name"]),
            field(&reply["id"]),
            field(&reply["socket"])
        ),
        AgentCommand::List => list_text(reply),
        AgentCommand::Inspect { .. } => inspect_text(&reply["agent"], &reply["activity"]),
        AgentCommand::Send { name, .. } => format!(
            "queued as the next turn of {}: message {}\n",
            safe(name),
            field(&reply["message_id"])
        ),
        AgentCommand::Remove { name } => format!("removed {}\n", safe(name)),
        // Carried out by `agent_layer`, never sent to the daemon.
        AgentCommand::Diff { .. }
        | AgentCommand::Review { .. }
        | AgentCommand::Apply { .. }
        | AgentCommand::Discard { .. }
        | AgentCommand::Rollback { .. } => String::new(),
    }
}

/// "provider claude  model sonnet": the CLI an agent runs and its model
/// (the one it asks for, else the one its CLI last said it ran, shown as
/// that CLI's claim: "(reported)").
fn provider_model(agent: &Value) -> String {
    let reported = if agent["model_reported"] == true {
        " (reported)"
    } else {
        ""
    };
    format!(
        "provider {}  model {}{reported}",
        safe(agent["provider"].as_str().unwrap_or("default")),
        safe(agent["model"].as_str().unwrap_or("default"))
    )
}

fn list_text(reply: &Value) -> String {
    let mut out = String::new();
    let agents = list(&reply["agents"]);
    if agents.is_empty() {
        out.push_str("no agents\n");
    }
    for a in agents {
        let indent = "  ".repeat(a["depth"].as_u64().unwrap_or(0) as usize);
        let reason = a["reason"]
            .as_str()
            .map(|r| format!(" ({})", safe(r)))
            .unwrap_or_default();
        // The model its CLI is started with, when one was chosen.
        let layer = a["layer_bytes"]
            .as_u64()
            .map(|b| format!("  layer {}", human_bytes(b)))
            .unwrap_or_default();
        let elsewhere = where_text(&a["daemon"]);
        let _ = writeln!(
            out,
            "{indent}{}  {}{reason}  role {}  {}  id {}{layer}{elsewhere}",
            field(&a["name"]),
            safe(a["state"].as_str().unwrap_or("?")),
            field(&a["role"]),
            provider_model(a),
            field(&a["id"])
        );
    }
    out
}

/// `tools list` for people: the servers, their tools and pins. Servers
/// name their tools and say why a pin holds: all of it escaped.
pub fn tools_text(reply: &Value) -> String {
    let mut out = String::new();
    let empty = Vec::new();
    let hash_of = |server: &str, tool: &str| {
        reply["pins"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|p| p["server"] == server && p["tool"] == tool)
            .and_then(|p| p["seen_hash"].as_str())
            .map(|h| h.chars().take(16).collect::<String>())
            .unwrap_or_default()
    };
    let servers = reply["servers"].as_array().unwrap_or(&empty);
    if servers.is_empty() {
        out.push_str(
            "no upstream MCP servers: this daemon was started without --upstreams FILE \
             (docs/upstreams.md); agents have the broker's own tools only\n",
        );
        return out;
    }
    let text = |v: &Value, or: &str| safe(v.as_str().unwrap_or(or));
    for server in servers {
        // The protocol version the server answered, while it is up.
        let version = server["status"]["protocol_version"]
            .as_str()
            .map(|v| format!("  MCP {}", safe(v)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}  {}  restarts {}{version}",
            text(&server["server"], ""),
            text(&server["status"]["status"], "?"),
            server["restarts"]
        );
        for tool in server["tools"].as_array().unwrap_or(&empty) {
            let pin = &tool["pin"];
            let reason = pin["reason"]
                .as_str()
                .map(|r| format!(": {}", safe(r)))
                .unwrap_or_default();
            let name = tool["tool"].as_str().unwrap_or("");
            let _ = writeln!(
                out,
                "  {}  {}{reason}  hash {}",
                safe(name),
                text(&pin["state"], "?"),
                safe(&hash_of(server["server"].as_str().unwrap_or(""), name))
            );
        }
    }
    out
}

/// 1536 -> "1.5 KiB".
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// An agent, its recent turns and messages, in words.
/// Where an agent runs and why (several daemons): `  on DAEMON (why)`
/// for another daemon's, `  (why)` for this one's; nothing when unknown.
fn where_text(daemon: &Value) -> String {
    let why = daemon["why"]
        .as_str()
        .map(|w| format!(" ({})", safe(w)))
        .unwrap_or_default();
    if daemon["here"] == false {
        format!(
            "  on {}{why}",
            safe(daemon["daemon"].as_str().unwrap_or("a daemon not seen yet"))
        )
    } else if daemon["here"] == true {
        format!(" {why}").trim_end().to_string()
    } else {
        String::new()
    }
}

pub fn inspect_text(agent: &Value, activity: &Value) -> String {
    let s = |v: &Value| safe(v.as_str().unwrap_or("-"));
    let mut out = String::new();
    let w = &mut out;
    let reason = agent["reason"]
        .as_str()
        .map(|r| format!(" ({})", safe(r)))
        .unwrap_or_default();
    let _ = writeln!(
        w,
        "{}  {}{reason}  role {}  {}  id {}",
        s(&agent["name"]),
        s(&agent["state"]),
        s(&agent["role"]),
        provider_model(agent),
        s(&agent["id"])
    );
    let _ = writeln!(
        w,
        "  workspace {}  parent {}  session {}",
        s(&agent["workspace"]),
        s(&agent["parent"]),
        s(&agent["session_id"])
    );
    let place = where_text(&agent["daemon"]);
    if !place.is_empty() {
        let _ = writeln!(w, "  runs{place}  socket {}", s(&agent["socket"]));
    }
    let _ = writeln!(
        w,
        "  queued: {} turn(s), {} message(s); awaiting {} sync repl(ies)",
        activity["queued_turns"], activity["queued_messages"], activity["awaiting_replies"]
    );
    let usage = &agent["model_usage"];
    if usage["requests"].as_u64().unwrap_or(0) > 0 {
        let _ = writeln!(
            w,
            "  model: {} request(s), {} tokens in, {} out ({} requests, {} tokens today)",
            usage["requests"],
            usage["input_tokens"],
            usage["output_tokens"],
            usage["requests_today"],
            usage["tokens_today"]
        );
    }
    let tools: Vec<String> = list(&activity["tools"]).iter().map(s).collect();
    let _ = writeln!(w, "  tools: {}", tools.join(" "));
    turns_text(w, list(&activity["recent_turns"]));
    messages_text(w, list(&activity["recent_messages"]));
    out
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

/// The first line of `text`, at most 100 characters, made safe to print.
fn line(text: &Value) -> String {
    let text = text.as_str().unwrap_or("");
    let first = text.lines().next().unwrap_or("");
    let mut cut: String = first.chars().take(100).collect();
    if cut.len() < text.len() {
        cut.push_str(" ...");
    }
    safe(&cut)
}

/// Agents write prompts, results and names: control characters (escape
/// sequences that set the clipboard, retitle the window or hide lines),
/// bidirectional overrides and invisible characters never reach the
/// operator's terminal, only their visible spelling (`policy::text`).
pub fn safe(text: &str) -> String {
    substrat_policy::text::escape_text(text).into_owned()
}

/// A string field of a reply, made safe (empty when absent).
fn field(value: &Value) -> String {
    safe(value.as_str().unwrap_or(""))
}

fn turns_text(w: &mut String, turns: &[Value]) {
    let _ = writeln!(
        w,
        "recent turns:{}",
        if turns.is_empty() { " none" } else { "" }
    );
    for t in turns {
        let took = match (t["started_at_ms"].as_i64(), t["finished_at_ms"].as_i64()) {
            (Some(a), Some(b)) => format!(", {:.1} s", (b - a) as f64 / 1000.0),
            _ => String::new(),
        };
        let _ = writeln!(
            w,
            "  turn {} {} {} (attempt {}{took})",
            safe(t["turn_id"].as_str().unwrap_or("?")),
            field(&t["kind"]),
            field(&t["status"]),
            t["attempts"]
        );
        let _ = writeln!(w, "    prompt: {}", line(&t["prompt"]));
        if !t["result"].is_null() {
            let _ = writeln!(w, "    result: {}", line(&t["result"]));
        }
        if !t["error"].is_null() {
            let _ = writeln!(w, "    error: {}", line(&t["error"]));
        }
        failure_text(w, &t["stream_notes"]["failure"]);
        let reported = list(&t["stream_notes"]["reported_tool_calls"]);
        if !reported.is_empty() {
            let calls: Vec<String> = reported
                .iter()
                .map(|c| {
                    let mark = if c["is_error"] == true {
                        " (error)"
                    } else {
                        ""
                    };
                    format!("{}{mark}", safe(c["name"].as_str().unwrap_or("?")))
                })
                .collect();
            let _ = writeln!(w, "    tool calls: {}", calls.join(", "));
        }
    }
}

/// Why a turn failed: the reason, the CLI's errors and retries, the
/// gateway's failed model requests, and the last events its CLI wrote.
fn failure_text(w: &mut String, failure: &Value) {
    let Some(reason) = failure["reason"].as_str() else {
        return;
    };
    let _ = writeln!(w, "    why: {}", safe(reason));
    let total = failure["cli_errors_total"].as_u64().unwrap_or(0);
    let errors = list(&failure["cli_errors"]);
    if total > errors.len() as u64 {
        let _ = writeln!(w, "    cli errors: {total}, the last {}:", errors.len());
    }
    for e in errors {
        let what = if e["retry"] == true { "retry" } else { "error" };
        let _ = writeln!(w, "    cli {what}: {}", line(&e["message"]));
    }
    for e in list(&failure["model_errors"]) {
        let _ = writeln!(
            w,
            "    model request: {} {}: {}",
            field(&e["kind"]),
            e["status"],
            line(&e["reason"])
        );
    }
    for e in list(&failure["last_events"]) {
        let _ = writeln!(w, "    last event: {}", line(e));
    }
}

fn messages_text(w: &mut String, messages: &[Value]) {
    let _ = writeln!(
        w,
        "recent messages:{}",
        if messages.is_empty() { " none" } else { "" }
    );
    for m in messages {
        let way = if m["direction"] == "in" { "from" } else { "to" };
        let _ = writeln!(
            w,
            "  {way} {} [{} {}]: {}",
            safe(m["counterpart"].as_str().unwrap_or("?")),
            field(&m["kind"]),
            field(&m["status"]),
            line(&m["text"])
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Each class of character an agent could use on a terminal: C0, CSI,
    /// OSC (title, clipboard), DCS, DEL, C1, bidi, invisible, newline, tab.
    pub const EVERY_CLASS: &str = "n\u{1}\u{7}\u{1b}[31m\u{1b}]0;t\u{7}\u{1b}]52;c;eA==\u{1b}\\\
        \u{1b}P+q\u{1b}\\\u{7f}\u{9b}2J\u{85}\u{202e}\u{2066}\u{200f}\u{61c}\u{200b}\u{2028}\
        \u{feff}\u{e0041}\n\t";

    pub fn assert_shown_safe(text: &str) {
        let raw: Vec<char> = text
            .chars()
            .filter(|c| substrat_policy::text::is_unsafe(*c) && *c != '\n')
            .collect();
        assert!(raw.is_empty(), "raw {raw:?} in:\n{text}");
        assert!(text.contains("\\x1b[31m\\x1b]0;t\\x07"), "{text}");
    }

    fn every_command(bad: &str) -> Vec<AgentCommand> {
        let name = bad.to_string();
        vec![
            AgentCommand::Spawn {
                name: name.clone(),
                role: name.clone(),
                workspace: PathBuf::from(bad),
                model: None,
                provider: None,
                args: Vec::new(),
                instructions: name.clone(),
            },
            AgentCommand::Create {
                name: name.clone(),
                role: name.clone(),
                parent: None,
                workspace: None,
                provider: None,
            },
            AgentCommand::List,
            AgentCommand::Inspect { name: name.clone() },
            AgentCommand::Send {
                name: name.clone(),
                text: name.clone(),
            },
            AgentCommand::Suspend { name: name.clone() },
            AgentCommand::Resume { name: name.clone() },
            AgentCommand::Kill { name: name.clone() },
            AgentCommand::Remove { name: name.clone() },
            AgentCommand::Cert {
                name,
                out: PathBuf::from(bad),
                replace: false,
            },
        ]
    }

    /// A reply whose every string is `bad`.
    fn reply(bad: &str) -> Value {
        let agent = serde_json::json!({
            "name": bad, "id": bad, "state": bad, "role": bad, "reason": bad,
            "provider": bad, "model": bad, "workspace": bad, "parent": bad, "session_id": bad,
            "depth": 1, "layer_bytes": 10, "socket": bad,
            "daemon": {"here": false, "daemon": bad, "why": bad},
        });
        let activity = serde_json::json!({
            "tools": [bad],
            "recent_turns": [{
                "turn_id": bad, "kind": bad, "status": bad, "attempts": 1,
                "prompt": bad, "result": bad, "error": bad,
                "stream_notes": {"reported_tool_calls": [{"name": bad, "is_error": true}],
                    "failure": {"reason": bad, "cli_errors": [{"retry": true, "message": bad}],
                        "cli_errors_total": 3,
                        "model_errors": [{"kind": bad, "status": 500, "reason": bad}],
                        "last_events": [bad]}},
            }],
            "recent_messages": [{
                "direction": "in", "counterpart": bad, "kind": bad, "status": bad, "text": bad,
            }],
        });
        serde_json::json!({
            "name": bad, "id": bad, "socket": bad, "message_id": bad,
            "fingerprint": bad, "certificates": 1, "cert": bad, "key": bad, "ca": bad,
            "agents": [agent.clone()], "agent": agent, "activity": activity,
        })
    }

    #[test]
    fn a_model_the_cli_reported_is_shown_as_its_claim() {
        let agent = serde_json::json!({"name": "w", "provider": "claude",
            "model": "opus\u{1b}[2J", "model_reported": true});
        let line = provider_model(&agent);
        assert!(line.starts_with("provider claude  model opus"), "{line}");
        assert!(
            line.ends_with(" (reported)") && !line.contains('\u{1b}'),
            "{line}"
        );
        let chosen = serde_json::json!({"provider": "claude", "model": "sonnet"});
        assert_eq!(provider_model(&chosen), "provider claude  model sonnet");
    }

    #[test]
    fn a_failed_turn_says_why() {
        let agent = serde_json::json!({"name": "w", "state": "idle", "role": "worker",
            "provider": "codex", "model": "gpt-5", "id": "a1"});
        let activity = serde_json::json!({"recent_turns": [{
            "turn_id": "t1", "kind": "prompt", "status": "failed", "attempts": 1,
            "prompt": "p", "error": "the agent reported an error: gone",
            "stream_notes": {"failure": {"reason": "upstream_error",
                "cli_errors": [{"retry": true, "message": "Reconnecting... 1/5"}],
                "cli_errors_total": 4,
                "model_errors": [{"kind": "upstream", "status": 500,
                    "reason": "the model upstream answered 500 Internal Server Error"}],
                "last_events": ["retry: Reconnecting... 1/5"]}}}]});
        let text = inspect_text(&agent, &activity);
        for expected in [
            "w  idle  role worker  provider codex  model gpt-5  id a1",
            "    error: the agent reported an error: gone",
            "    why: upstream_error",
            "    cli errors: 4, the last 1:",
            "    cli retry: Reconnecting... 1/5",
            "    model request: upstream 500: the model upstream answered 500 Internal Server Error",
            "    last event: retry: Reconnecting... 1/5",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "{expected:?} in\n{text}"
            );
        }
    }

    #[test]
    fn every_answer_shows_agent_text_escaped() {
        let reply = reply(EVERY_CLASS);
        for command in every_command(EVERY_CLASS) {
            let text = human_text(&command, &reply);
            assert_shown_safe(&text);
        }
    }

    #[test]
    fn tools_list_shows_servers_words_escaped() {
        let bad = EVERY_CLASS;
        let reply = serde_json::json!({
            "servers": [{"server": bad, "status": {"status": bad, "protocol_version": bad}, "restarts": 0,
                "tools": [{"tool": bad, "pin": {"state": bad, "reason": bad}}]}],
            "pins": [{"server": bad, "tool": bad, "seen_hash": bad}],
        });
        assert_shown_safe(&tools_text(&reply));
    }

    #[test]
    fn agent_text_cannot_drive_the_terminal() {
        let agent = serde_json::json!({"name": "a\u{1b}]52;c;cGF5bG9hZA==\u{7}", "state": "idle"});
        let activity = serde_json::json!({
            "recent_turns": [{"turn_id": "t", "prompt": "hi\u{1b}[2J", "result": "ok\u{9b}31m"}],
            "recent_messages": [{"direction": "in", "counterpart": "b\u{1b}[1A", "text": "x"}],
        });
        let text = inspect_text(&agent, &activity);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("\\x1b]52;c;"), "{text}");
    }
}
