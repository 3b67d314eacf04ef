//! What the live view shows, as text: pure functions of the daemon's
//! replies and the time, tested by comparing whole outputs. Every text an
//! agent chose (names, reasons, messages, tool names) is escaped here
//! (`agent_text::safe`), before anything draws it.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use substrat_broker::audit::Recorded;

use crate::agent_text::safe;

/// One agent's line in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The name as the daemon knows it (for requests), never drawn.
    pub name: String,
    /// The name escaped, indented under its parent.
    pub shown: String,
    pub role: String,
    pub state: String,
    /// Its latest turn: `running 12s`, `queued 3s`, `done 5m ago`.
    pub turn: String,
    /// Model tokens today, against its role's daily budget when it has one.
    pub tokens: String,
    pub layer: String,
    pub daemon: String,
}

/// The agents as a tree (children under their parent, siblings by name),
/// each with its latest turn at `now_ms`. Every agent has exactly one row,
/// however deep or large the tree (the roles may bound neither), made in
/// O(n log n): the table is made at every frame. Agents whose parents name
/// each other (no reply of a daemon has that) follow at the top level.
pub fn rows(agents: &[Value], now_ms: i64) -> Vec<Row> {
    let known: HashSet<&str> = agents.iter().map(name_of).collect();
    let mut sorted: Vec<&Value> = agents.iter().collect();
    sorted.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    let mut children: HashMap<&str, Vec<&Value>> = HashMap::new();
    let mut roots = Vec::new();
    for &agent in &sorted {
        let parent = agent["parent"]
            .as_str()
            .filter(|p| known.contains(p) && *p != name_of(agent));
        match parent {
            Some(p) => children.entry(p).or_default().push(agent),
            None => roots.push(agent),
        }
    }
    let mut out = Vec::with_capacity(agents.len());
    let mut seen: HashSet<*const Value> = HashSet::with_capacity(agents.len());
    for top in roots.into_iter().chain(sorted.iter().copied()) {
        // Depth first, without recursion (a chain may be long).
        let mut stack = vec![(top, 0usize)];
        while let Some((agent, depth)) = stack.pop() {
            if !seen.insert(agent as *const Value) {
                continue;
            }
            out.push(row(agent, depth, now_ms));
            if let Some(kids) = children.get(name_of(agent)) {
                stack.extend(kids.iter().rev().map(|&k| (k, depth + 1)));
            }
        }
    }
    out
}

fn name_of(agent: &Value) -> &str {
    agent["name"].as_str().unwrap_or("")
}

/// The indent that puts an agent under its parent: two columns a level,
/// at most eight levels, past which the depth is written, so that a deep
/// agent's name stays in its column.
fn indent(depth: usize) -> String {
    const SHOWN: usize = 8;
    match depth {
        0 => String::new(),
        1..=SHOWN => format!("{}└ ", "  ".repeat(depth - 1)),
        _ => format!("{}└{depth} ", "  ".repeat(SHOWN - 1)),
    }
}

fn row(agent: &Value, depth: usize, now_ms: i64) -> Row {
    let text = |v: &Value| safe(v.as_str().unwrap_or(""));
    let indent = indent(depth);
    let daemon = &agent["daemon"];
    Row {
        name: agent["name"].as_str().unwrap_or("").to_string(),
        shown: format!("{indent}{}", text(&agent["name"])),
        role: text(&agent["role"]),
        state: text(&agent["state"]),
        turn: turn_text(&agent["turn"], now_ms),
        tokens: tokens_text(
            &agent["model_usage"]["tokens_today"],
            &agent["tokens_per_day"],
        ),
        layer: agent["layer_bytes"]
            .as_u64()
            .map(human_bytes)
            .unwrap_or_default(),
        daemon: match daemon["here"].as_bool() {
            Some(true) => "here".to_string(),
            Some(false) => safe(daemon["daemon"].as_str().unwrap_or("elsewhere")),
            None => String::new(),
        },
    }
}

/// A turn's status and how long it has been in it.
fn turn_text(turn: &Value, now_ms: i64) -> String {
    let Some(status) = turn["status"].as_str() else {
        return "-".to_string();
    };
    let at = |key: &str| turn[key].as_i64();
    match status {
        "running" => format!("running {}", age(at("started_at_ms"), now_ms)),
        "queued" => format!("queued {}", age(at("queued_at_ms"), now_ms)),
        other => format!(
            "{}{} {} ago",
            safe(other),
            failure_reason(turn),
            age(at("finished_at_ms"), now_ms)
        ),
    }
}

/// ` (timeout)`: why a failed turn failed, from `list` (`failure`) or
/// `inspect` (`stream_notes.failure.reason`); empty for other turns.
fn failure_reason(turn: &Value) -> String {
    turn["failure"]
        .as_str()
        .or(turn["stream_notes"]["failure"]["reason"].as_str())
        .map(|r| format!(" ({})", safe(r)))
        .unwrap_or_default()
}

fn age(since_ms: Option<i64>, now_ms: i64) -> String {
    let Some(since) = since_ms else {
        return "?".to_string();
    };
    let s = (now_ms - since).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

fn tokens_text(today: &Value, budget: &Value) -> String {
    let used = today.as_u64().unwrap_or(0);
    match budget.as_u64() {
        Some(b) => format!("{}/{}", count(used), count(b)),
        None => count(used),
    }
}

fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// The selected agent's details: why it is in its state, what waits for
/// it, its recent turns, its last tool calls (from the audit log) and its
/// recent messages.
pub fn detail(inspect: &Value, calls: &[Recorded], now_ms: i64) -> Vec<String> {
    let a = &inspect["activity"];
    let text = |v: &Value| safe(v.as_str().unwrap_or(""));
    let mut lines = vec![format!(
        "{} ({}): {}{}",
        text(&a["name"]),
        text(&a["role"]),
        text(&a["state"]),
        a["reason"]
            .as_str()
            .map(|r| format!(", {}", safe(r)))
            .unwrap_or_default()
    )];
    lines.push(format!(
        "queued: {} message(s), {} turn(s); awaiting {} repl(ies)",
        a["queued_messages"].as_u64().unwrap_or(0),
        a["queued_turns"].as_u64().unwrap_or(0),
        a["awaiting_replies"].as_u64().unwrap_or(0)
    ));
    lines.push("turns:".to_string());
    for t in a["recent_turns"].as_array().into_iter().flatten().take(3) {
        let why = t["error"].as_str().map(|e| format!(": {}", first_line(e)));
        lines.push(format!(
            "  {} {}{}",
            text(&t["kind"]),
            turn_text(t, now_ms),
            why.unwrap_or_default()
        ));
    }
    lines.push("last tool calls:".to_string());
    for c in calls {
        let reason = if c.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", first_line(&c.reason))
        };
        lines.push(format!(
            "  {} {} {:?}{reason}",
            age(Some(c.ts_ms), now_ms),
            safe(&c.tool),
            c.decision
        ));
    }
    lines.push("messages:".to_string());
    for m in a["recent_messages"]
        .as_array()
        .into_iter()
        .flatten()
        .take(5)
    {
        let arrow = if m["direction"] == "in" { "from" } else { "to" };
        lines.push(format!(
            "  {arrow} {}: {}",
            text(&m["counterpart"]),
            first_line(m["text"].as_str().unwrap_or(""))
        ));
    }
    lines
}

/// The first line of `text`, escaped and cut to 120 characters.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let cut: String = line.chars().take(120).collect();
    let more = if cut.len() < text.len() { " ..." } else { "" };
    format!("{}{more}", safe(&cut))
}

/// The upstream servers' health in one line.
pub fn servers(servers: &[Value]) -> String {
    if servers.is_empty() {
        return "upstreams: none".to_string();
    }
    let each: Vec<String> = servers
        .iter()
        .map(|s| {
            let status = &s["status"];
            let state = safe(status["status"].as_str().unwrap_or("?"));
            match status["reason"].as_str() {
                Some(r) => format!(
                    "{} {state} ({})",
                    safe(s["server"].as_str().unwrap_or("")),
                    first_line(r)
                ),
                None => format!("{} {state}", safe(s["server"].as_str().unwrap_or(""))),
            }
        })
        .collect();
    format!("upstreams: {}", each.join(", "))
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
