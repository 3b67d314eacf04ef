//! Rules on what the agent gets from the broker and the launcher: secrets
//! in the environment, rate, output, step, messaging, spawning and tool
//! limits.

use super::Emit;
use crate::load::LoadedPolicy;
use crate::model::MAX_TOOLS;

pub(super) const SECRET_WORDS: [&str; 10] = [
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "CREDENTIAL",
    "AUTH",
    "APIKEY",
    "PAT",
];

/// Whether a variable name has a word (between `_`) that names a secret:
/// `GITHUB_TOKEN`, `CURSOR_API_KEY`, `DB_PASSWORD`, `AWS_SECRET_ACCESS_KEY`,
/// but not `MONKEY_BUSINESS`. Plural words count (`CREDENTIALS`).
pub(super) fn looks_secret(name: &str) -> bool {
    name.to_ascii_uppercase().split(['_', '*']).any(|word| {
        let singular = word.strip_suffix('S').unwrap_or(word);
        SECRET_WORDS.contains(&word) || SECRET_WORDS.contains(&singular)
    })
}

pub(super) fn secret_env(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, name) in p.policy.env.allow.iter().enumerate() {
        if name != "*" && looks_secret(name) {
            e.at(
                &format!("env.allow[{i}]"),
                format!("`{name}` looks like a secret and passes into the sandbox"),
            );
        }
    }
    for name in p.policy.env.set.keys().filter(|n| looks_secret(n)) {
        e.at(
            &crate::source::join_key("env.set", name),
            format!("`{name}` looks like a secret and is written into the policy"),
        );
    }
}

pub(super) fn hosted_tools(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, tool) in p.policy.model.hosted_tools.iter().enumerate() {
        e.at(
            &format!("model.hosted_tools[{i}]"),
            format!(
                "`{}` runs on the model provider's side, outside the sandbox and the broker",
                tool.as_str()
            ),
        );
    }
}

/// Names of every length and character class a model name may have: a
/// pattern matching all of them (`*`, `?*`, `*?*`, `**`, `[!~]*`...)
/// matches every model.
const PROBE_MODELS: &[&str] = &[
    "a",
    "Z",
    "0",
    ".",
    "_",
    "@",
    ":",
    "/",
    "claude-opus-4-1",
    "gpt-5",
    "models/gemini-2.5-pro",
    "ft:gpt-4o:org@x",
    "x-----------------------------------------------------------------y",
];

pub(super) fn matches_every_model(pattern: &str) -> bool {
    let one = [pattern.to_string()];
    PROBE_MODELS
        .iter()
        .all(|name| crate::model::model_matches(&one, name))
}

pub(super) fn model_any(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let patterns = p.policy.model.models.as_deref().unwrap_or_default();
    for (i, pattern) in patterns.iter().enumerate() {
        if matches_every_model(pattern) {
            e.at(
                &format!("model.models[{i}]"),
                format!("`{pattern}` matches every model"),
            );
        }
    }
}

pub(super) fn env_passthrough_all(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, name) in p.policy.env.allow.iter().enumerate() {
        if name == "*" {
            e.at(
                &format!("env.allow[{i}]"),
                "`*` passes the whole host environment",
            );
        }
    }
}

pub(super) fn no_rate_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    if m.calls_per_minute.is_none() {
        e.at(
            "mcp",
            "`mcp.calls_per_minute` is not set: tool calls are not rate limited",
        );
    } else if m.burst.is_none() {
        e.at(
            "mcp",
            "`mcp.burst` is not set: the whole minute's calls may come at once",
        );
    }
}

pub(super) fn tool_cap(p: &LoadedPolicy, e: &mut Emit<'_>) {
    match p.policy.mcp.tool_cap {
        None => e.at("mcp", format!("`mcp.tool_cap` is not set (cursor-agent silently keeps the first {MAX_TOOLS})")),
        Some(cap) if cap > MAX_TOOLS => e.at("mcp.tool_cap", format!(
            "tool cap {cap} is above {MAX_TOOLS}: cursor-agent silently drops every tool after the 40th"
        )),
        Some(_) => {}
    }
}

pub(super) fn no_output_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.mcp.max_output_bytes.is_none() {
        e.at("mcp", "`mcp.max_output_bytes` is not set");
    }
}

pub(super) fn no_step_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.mcp.tool_steps_per_turn.is_none() {
        e.at("mcp", "`mcp.tool_steps_per_turn` is not set");
    }
}

pub(super) fn unbounded_messaging(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    report_unset(
        e,
        &[
            ("max_message_bytes", m.max_message_bytes.is_none()),
            ("inbox_depth", m.inbox_depth.is_none()),
            ("broadcast_fanout", m.broadcast_fanout.is_none()),
        ],
    );
}

pub(super) fn unbounded_spawning(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    report_unset(
        e,
        &[
            ("spawn_depth", m.spawn_depth.is_none()),
            ("children_per_agent", m.children_per_agent.is_none()),
        ],
    );
}

/// One finding at `mcp` naming the keys (key, unset) that are not set.
fn report_unset(e: &mut Emit<'_>, keys: &[(&str, bool)]) {
    let missing: Vec<&str> = keys
        .iter()
        .filter(|(_, absent)| *absent)
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        e.at("mcp", format!("not set: mcp.{}", missing.join(", mcp.")));
    }
}

pub(super) fn no_tool_scope(p: &LoadedPolicy, e: &mut Emit<'_>) {
    match &p.policy.tools.allow {
        None => e.at("tools", "`tools.allow` is not set: every tool is in scope"),
        Some(list) => {
            if let Some(i) = list.iter().position(|pat| pat == "*") {
                e.at(&format!("tools.allow[{i}]"), "`*` puts every tool in scope");
            }
        }
    }
}
