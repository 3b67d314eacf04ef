//! `substrat-sandbox agent ...` for people: one line per answer, and
//! `inspect` as text (`--json` gives machines the whole answer).

use std::fmt::Write as _;

use serde_json::Value;

use crate::AgentCommand;

pub fn print_human(command: &AgentCommand, reply: &Value) {
    match command {
        AgentCommand::Spawn { .. } => println!(
            "spawned {} ({}); its first turn is queued",
            field(&reply["name"]),
            field(&reply["id"])
        ),
        AgentCommand::Suspend { name } => println!("suspended {}", safe(name)),
        AgentCommand::Cert { name, .. } => println!(
            "a certificate for {} (sha256 {}; {} valid for it now): {}, {}, {}",
            safe(name),
            field(&reply["fingerprint"]),
            reply["certificates"].as_u64().unwrap_or(0),
            field(&reply["cert"]),
            field(&reply["key"]),
            field(&reply["ca"])
        ),
        AgentCommand::Resume { name } => println!("resumed {}", safe(name)),
        AgentCommand::Kill { name } => {
            println!("killed {}: failed until resumed", safe(name))
        }
        AgentCommand::Create { .. } => println!(
            "created {} ({}), socket {}",
            field(&reply["name"]),
            field(&reply["id"]),
            field(&reply["socket"])
        ),
        AgentCommand::List => {
            let empty = Vec::new();
            let agents = reply["agents"].as_array().unwrap_or(&empty);
            if agents.is_empty() {
                println!("no agents");
            }
            for a in agents {
                let indent = "  ".repeat(a["depth"].as_u64().unwrap_or(0) as usize);
                let reason = a["reason"]
                    .as_str()
                    .map(|r| format!(" ({})", safe(r)))
                    .unwrap_or_default();
                let layer = a["layer_bytes"]
                    .as_u64()
                    .map(|b| format!("  layer {}", human_bytes(b)))
                    .unwrap_or_default();
                // Another daemon of the database runs it: say which.
                let elsewhere = match &a["daemon"] {
                    d if d["here"] == false => format!(
                        "  on {}",
                        safe(d["daemon"].as_str().unwrap_or("a daemon not seen yet"))
                    ),
                    _ => String::new(),
                };
                println!(
                    "{indent}{}  {}{reason}  role {}  id {}{layer}{elsewhere}",
                    field(&a["name"]),
                    safe(a["state"].as_str().unwrap_or("?")),
                    field(&a["role"]),
                    field(&a["id"])
                );
            }
        }
        AgentCommand::Inspect { .. } => {
            print!("{}", inspect_text(&reply["agent"], &reply["activity"]))
        }
        AgentCommand::Send { name, .. } => println!(
            "queued as the next turn of {}: message {}",
            safe(name),
            field(&reply["message_id"])
        ),
        AgentCommand::Remove { name } => println!("removed {}", safe(name)),
        // Carried out by `agent_layer`, never sent to the daemon.
        AgentCommand::Diff { .. }
        | AgentCommand::Apply { .. }
        | AgentCommand::Discard { .. }
        | AgentCommand::Rollback { .. } => {}
    }
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
        "{}  {}{reason}  role {}  provider {}  id {}",
        s(&agent["name"]),
        s(&agent["state"]),
        s(&agent["role"]),
        safe(agent["provider"].as_str().unwrap_or("default")),
        s(&agent["id"])
    );
    let _ = writeln!(
        w,
        "  workspace {}  parent {}  session {}",
        s(&agent["workspace"]),
        s(&agent["parent"]),
        s(&agent["session_id"])
    );
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
        assert!(text.contains("\\u{1b}]52;c;"), "{text}");
    }
}
