//! The learned policy as TOML text: `extends` the base, `binds_add` with
//! a comment per bind saying why, and what was wanted and not granted.
//! Every name in a comment is escaped (a newline in a file name cannot end
//! the comment); every value is a TOML string written by `toml`.

use std::path::Path;

use super::plan::{Plan, PlanInput};
use super::{AccessKind, Observations};
use crate::text::{escape_path, escape_text};

/// Longest command text kept in the description.
const COMMAND_TEXT_MAX: usize = 200;

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// A bind source as the policy writes it: `${HOME}/...` below the home.
pub fn source_text(source: &Path, home: Option<&Path>) -> String {
    match home.and_then(|h| source.strip_prefix(h).ok()) {
        Some(rest) if !rest.as_os_str().is_empty() => format!("${{HOME}}/{}", rest.display()),
        _ => source.display().to_string(),
    }
}

/// One word as a POSIX shell reads it back: bare when it holds only
/// characters no shell treats specially, else in single quotes (a `'`
/// inside as `'\''`).
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    match plain {
        true => word.to_string(),
        false => format!("'{}'", word.replace('\'', "'\\''")),
    }
}

/// The command as shell words, control characters escaped, cut at
/// `COMMAND_TEXT_MAX` characters: never backticks around it (a person
/// pasting the description into a shell runs nothing of it).
pub fn command_text(command: &[String]) -> String {
    let words: Vec<String> = command.iter().map(|w| shell_word(w)).collect();
    let text = escape_text(&words.join(" ")).into_owned();
    match text.char_indices().nth(COMMAND_TEXT_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// The policy file's text.
pub fn render(plan: &Plan, observed: &Observations, input: &PlanInput) -> String {
    let home = input.home.as_deref();
    let command = command_text(&input.command);
    let mut out = format!(
        "# Learned by substrat-sandbox learn: what {command} used beyond {base}.\n\
         # Checked (`check --fail-on high`) and replayed under this policy before it was written.\n",
        base = escape_text(&input.base),
    );
    if !plan.refused.is_empty() {
        out.push_str("# Wanted, not granted (never added):\n");
        for r in &plan.refused {
            out.push_str(&format!(
                "#   {}: {}\n",
                escape_path(&r.path),
                escape_text(&r.why)
            ));
        }
    }
    if !observed.destinations.is_empty() {
        out.push_str("# Connections tried (the base's network is kept):\n");
        for d in &observed.destinations {
            out.push_str(&format!("#   {}\n", escape_text(&d.to_string())));
        }
    }
    out.push_str(&format!(
        "version = 1\nextends = {}\ndescription = {}\n\n[filesystem]\nbinds_add = [\n",
        toml_string(&input.base),
        toml_string(&format!(
            "{}, plus what the command {command} used (learned)",
            input.base
        )),
    ));
    for bind in &plan.binds {
        let kinds: Vec<&str> = bind.kinds.iter().map(|k| AccessKind::word(*k)).collect();
        let example = bind
            .paths
            .iter()
            .next()
            .map(|p| escape_path(p).into_owned())
            .unwrap_or_default();
        let count = match bind.paths.len() {
            1 => example,
            n => format!("{n} paths, e.g. {example}"),
        };
        out.push_str(&format!(
            "  # {}: {count}\n  {{ source = {}, mode = \"{}\" }},\n",
            kinds.join(", "),
            toml_string(&source_text(&bind.source, home)),
            if bind.writable { "rw" } else { "ro" },
        ));
    }
    out.push_str("]\n");
    out
}

/// Which of the plan's binds `line` (1-based) of the rendered `text`
/// holds, by its source: a finding of `check` at that line is that bind's.
pub fn bind_at_line(plan: &Plan, input: &PlanInput, text: &str, line: usize) -> Option<usize> {
    let written = text.lines().nth(line.checked_sub(1)?)?;
    let home = input.home.as_deref();
    plan.binds.iter().position(|b| {
        written.contains(&format!(
            "{{ source = {}, ",
            toml_string(&source_text(&b.source, home))
        ))
    })
}
