//! Semantic rules a policy must meet to be loaded at all (as opposed to
//! `check` findings, which are judgements about a valid policy). All
//! problems are collected so a user fixes them in one round.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::Path;

use crate::error::{ErrorKind, PolicyError};
use crate::location::Location;
use crate::model::{ByteSize, NetworkMode, POLICY_VERSION, Policy};
use crate::paths::{PathTemplate, validate_relative};
use crate::source::SourceMap;

const MAX_TEXT_BYTES: usize = 64 * 1024;

struct Errors<'a> {
    sources: &'a SourceMap,
    path: &'a Path,
    list: Vec<PolicyError>,
}

impl Errors<'_> {
    fn push(&mut self, kind: ErrorKind, key_path: &str, message: impl Into<String>) {
        let location = self
            .sources
            .lookup(key_path)
            .cloned()
            .unwrap_or_else(|| Location::start_of(self.path));
        self.list
            .push(PolicyError::new(kind, location, key_path, message));
    }

    fn range(&mut self, key_path: &str, value: Option<u64>, range: RangeInclusive<u64>) {
        if let Some(v) = value
            && !range.contains(&v)
        {
            self.push(
                ErrorKind::OutOfRange,
                key_path,
                format!(
                    "{v} is out of range: `{key_path}` must be between {} and {}",
                    range.start(),
                    range.end()
                ),
            );
        }
    }

    fn size(&mut self, key_path: &str, value: Option<ByteSize>, range: RangeInclusive<u64>) {
        if let Some(ByteSize(v)) = value
            && !range.contains(&v)
        {
            self.push(
                ErrorKind::OutOfRange,
                key_path,
                format!(
                    "{} is out of range: `{key_path}` must be between {} and {}",
                    ByteSize(v),
                    ByteSize(*range.start()),
                    ByteSize(*range.end())
                ),
            );
        }
    }

    fn path(&mut self, key_path: &str, template: &PathTemplate) {
        if let Err(err) = template.validate() {
            self.push(ErrorKind::InvalidPath, key_path, err.to_string());
        }
    }

    fn text(&mut self, key_path: &str, value: Option<&String>) {
        if value.is_some_and(|v| v.len() > MAX_TEXT_BYTES) {
            self.push(
                ErrorKind::OutOfRange,
                key_path,
                format!("`{key_path}` is longer than 64 KiB"),
            );
        }
        // A system prompt reaches the turns' command lines (exec cannot
        // carry a NUL), the descriptions the operator's screen.
        if value.is_some_and(|v| v.contains('\0')) {
            self.push(
                ErrorKind::Invalid,
                key_path,
                format!("`{key_path}` contains a NUL byte"),
            );
        }
    }
}

pub(crate) fn validate(policy: &Policy, sources: &SourceMap, path: &Path) -> Vec<PolicyError> {
    let mut errors = Errors {
        sources,
        path,
        list: Vec::new(),
    };
    top_level(policy, &mut errors);
    filesystem(policy, &mut errors);
    limits(policy, &mut errors);
    env(policy, &mut errors);
    tools(policy, &mut errors);
    errors.list
}

fn top_level(policy: &Policy, errors: &mut Errors<'_>) {
    if policy.version != POLICY_VERSION {
        errors.push(
            ErrorKind::UnsupportedVersion,
            "version",
            format!(
                "policy version {} is not supported; this build reads version {POLICY_VERSION}",
                policy.version
            ),
        );
    }
    proxy(policy, errors);
    layer(policy, errors);
    let ns = &policy.namespaces;
    for (name, on) in [("user", ns.user), ("mount", ns.mount)] {
        if !on {
            errors.push(ErrorKind::Invalid, &format!("namespaces.{name}"), format!(
                "the sandbox is built on a {name} namespace; `namespaces.{name} = false` cannot be enforced"
            ));
        }
    }
    errors.text("description", policy.description.as_ref());
    errors.text("persona.description", policy.persona.description.as_ref());
    errors.text(
        "persona.system_prompt",
        policy.persona.system_prompt.as_ref(),
    );
    persona_script(&policy.persona, errors);
}

/// A script role's settings belong to a script, within their bounds.
fn persona_script(persona: &crate::model::Persona, errors: &mut Errors<'_>) {
    use crate::model::{MAX_SCRIPT_MEMORY_MB, MAX_SCRIPT_TIMEOUT_MS};
    if persona.script.is_some() && persona.system_prompt.is_some() {
        errors.push(
            ErrorKind::Invalid,
            "persona.script",
            "a role's prompt comes from `system_prompt` or from `script`, not both".to_string(),
        );
    }
    let script_only = [
        ("timeout_ms", persona.timeout_ms.is_some()),
        ("memory_mb", persona.memory_mb.is_some()),
        ("config", !persona.config.is_empty()),
    ];
    for (key, given) in script_only {
        if given && persona.script.is_none() {
            errors.push(
                ErrorKind::Invalid,
                &format!("persona.{key}"),
                format!("`persona.{key}` is for a script role, and there is no `persona.script`"),
            );
        }
    }
    if persona
        .timeout_ms
        .is_some_and(|t| t == 0 || t > MAX_SCRIPT_TIMEOUT_MS)
    {
        errors.push(
            ErrorKind::OutOfRange,
            "persona.timeout_ms",
            format!("`persona.timeout_ms` must be 1-{MAX_SCRIPT_TIMEOUT_MS}"),
        );
    }
    if persona
        .memory_mb
        .is_some_and(|m| m == 0 || m > MAX_SCRIPT_MEMORY_MB)
    {
        errors.push(
            ErrorKind::OutOfRange,
            "persona.memory_mb",
            format!("`persona.memory_mb` must be 1-{MAX_SCRIPT_MEMORY_MB}"),
        );
    }
}

/// A layer quota belongs to the overlay mode (a direct workspace has no
/// layer to limit); a quota of nothing could never be written to.
fn layer(policy: &Policy, errors: &mut Errors<'_>) {
    let fs = &policy.filesystem;
    match (fs.workspace_mode, fs.layer_quota) {
        (crate::model::WorkspaceMode::Direct, Some(_)) => errors.push(
            ErrorKind::Invalid,
            "filesystem.layer_quota",
            "`layer_quota` is set but `workspace_mode` is not \"overlay\": it would be ignored",
        ),
        (_, Some(q)) if q.0 == 0 => errors.push(
            ErrorKind::OutOfRange,
            "filesystem.layer_quota",
            "a layer quota of 0 bytes: the agent could write nothing; omit it for no quota",
        ),
        _ => {}
    }
}

/// `[proxy]` belongs to `network = "proxy"`; its patterns and test hosts
/// must parse.
fn proxy(policy: &Policy, errors: &mut Errors<'_>) {
    if policy.network == NetworkMode::Proxy && !policy.namespaces.pid {
        errors.push(
            ErrorKind::Invalid,
            "namespaces.pid",
            "`network = \"proxy\"` needs the pid namespace: the proxy's bridge inside must end with the sandbox",
        );
    }
    let Some(proxy) = &policy.proxy else {
        return;
    };
    if policy.network != NetworkMode::Proxy {
        errors.push(
            ErrorKind::Invalid,
            "proxy",
            "`[proxy]` is set but `network` is not \"proxy\": it would be ignored",
        );
    }
    for (key, patterns) in [("proxy.allow", &proxy.allow), ("proxy.deny", &proxy.deny)] {
        for pattern in patterns {
            if let Err(e) = crate::hosts::HostPattern::parse(pattern) {
                errors.push(ErrorKind::Invalid, key, e.to_string());
            }
        }
    }
    for (name, address) in &proxy.test_hosts {
        if !crate::hosts::valid_hostname(name) || address.parse::<std::net::IpAddr>().is_err() {
            errors.push(
                ErrorKind::Invalid,
                "proxy.test_hosts",
                format!(
                    "`{name} = \"{address}\"`: expected a lowercase DNS name and an IP address"
                ),
            );
        }
    }
}

fn filesystem(policy: &Policy, errors: &mut Errors<'_>) {
    let fs = &policy.filesystem;
    let mut targets: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, bind) in fs.binds.iter().enumerate() {
        errors.path(&format!("filesystem.binds[{i}].source"), &bind.source);
        if let Some(target) = &bind.target {
            errors.path(&format!("filesystem.binds[{i}].target"), target);
        }
        if let Some(first) = targets.insert(bind.target().normalized_components(), i) {
            errors.push(
                ErrorKind::Invalid,
                &format!("filesystem.binds[{i}].target"),
                format!(
                    "bind target `{}` is already used by filesystem.binds[{first}]",
                    bind.target()
                ),
            );
        }
    }
    for (i, tmpfs) in fs.tmpfs.iter().enumerate() {
        errors.path(&format!("filesystem.tmpfs[{i}]"), tmpfs);
    }
    let protected = fs.protected_paths();
    for (i, p) in protected.iter().enumerate() {
        if let Err(e) = validate_relative(p) {
            errors.push(
                ErrorKind::InvalidPath,
                &format!("filesystem.protected[{i}]"),
                e.to_string(),
            );
        }
    }
    protected_not_covered(policy, &protected, errors);
}

/// A writable bind on or inside a protected path of another writable bind
/// would undo the protection (for example a rw bind of `.cursor/mcp.json`).
fn protected_not_covered(policy: &Policy, protected: &[String], errors: &mut Errors<'_>) {
    let binds = &policy.filesystem.binds;
    for (i, inner) in binds.iter().enumerate().filter(|(_, b)| b.writable()) {
        for (j, root) in binds.iter().enumerate().filter(|(_, b)| b.writable()) {
            if i == j {
                continue;
            }
            for p in protected {
                let guarded =
                    PathTemplate::new(&format!("{}/{}", root.target(), p.trim_end_matches('/')));
                if inner.target().is_within(&guarded) {
                    errors.push(ErrorKind::ProtectedPathCovered, &format!("filesystem.binds[{i}]"), format!(
                        "writable bind `{}` covers protected path `{p}` of writable bind filesystem.binds[{j}] (`{}`); make it read-only or remove it",
                        inner.target(),
                        root.target()
                    ));
                }
            }
        }
    }
}

fn limits(policy: &Policy, errors: &mut Errors<'_>) {
    let r = &policy.rlimits;
    errors.range("rlimits.nofile", r.nofile, 16..=1_048_576);
    errors.range("rlimits.nproc", r.nproc, 1..=4_194_304);
    errors.size("rlimits.core", r.core, 0..=u64::MAX);
    errors.size("rlimits.fsize", r.fsize, 1 << 20..=u64::MAX);
    errors.size(
        "rlimits.address_space",
        r.address_space,
        64 << 20..=u64::MAX,
    );
    errors.range(
        "rlimits.cpu_seconds",
        r.cpu_seconds,
        1..=u64::from(u32::MAX),
    );

    let c = &policy.cgroup;
    errors.range("cgroup.pids_max", c.pids_max, 1..=4_194_304);
    errors.size("cgroup.memory_max", c.memory_max, 16 << 20..=u64::MAX);
    if let Some(cpu) = c.cpu_max
        && !(cpu.is_finite() && (0.01..=1024.0).contains(&cpu))
    {
        errors.push(
            ErrorKind::OutOfRange,
            "cgroup.cpu_max",
            format!(
                "{cpu} is out of range: `cgroup.cpu_max` is a number of CPUs between 0.01 and 1024"
            ),
        );
    }

    let budget = &policy.model;
    errors.range(
        "model.requests_per_minute",
        budget.requests_per_minute.map(u64::from),
        1..=100_000,
    );
    errors.range("model.tokens_per_turn", budget.tokens_per_turn, 1..=1 << 40);
    errors.range("model.tokens_per_day", budget.tokens_per_day, 1..=1 << 40);
    errors.range(
        "model.tokens_per_request",
        budget.tokens_per_request,
        1..=1 << 40,
    );
    errors.range(
        "model.concurrent_requests",
        budget.concurrent_requests.map(u64::from),
        1..=256,
    );
    models(budget, errors);
    let m = &policy.mcp;
    let n = |v: Option<u32>| v.map(u64::from);
    errors.range("mcp.calls_per_minute", n(m.calls_per_minute), 1..=60_000);
    errors.range("mcp.burst", n(m.burst), 1..=10_000);
    errors.range(
        "mcp.per_tool_calls_per_minute",
        n(m.per_tool_calls_per_minute),
        1..=60_000,
    );
    errors.range("mcp.per_tool_burst", n(m.per_tool_burst), 1..=10_000);
    errors.range(
        "mcp.tool_steps_per_turn",
        n(m.tool_steps_per_turn),
        1..=10_000,
    );
    // Above 40 parses on purpose: `check` explains why it is a finding.
    errors.range("mcp.tool_cap", n(m.tool_cap), 1..=10_000);
    errors.size("mcp.max_output_bytes", m.max_output_bytes, 1024..=64 << 20);
    errors.size("mcp.max_message_bytes", m.max_message_bytes, 1..=16 << 20);
    errors.range("mcp.max_list_entries", n(m.max_list_entries), 1..=1_000_000);
    errors.range("mcp.inbox_depth", n(m.inbox_depth), 1..=100_000);
    errors.range("mcp.spawn_depth", n(m.spawn_depth), 0..=32);
    errors.range("mcp.children_per_agent", n(m.children_per_agent), 0..=1_000);
    errors.range("mcp.broadcast_fanout", n(m.broadcast_fanout), 1..=1_000);
    if let (Some(burst), Some(rate)) = (m.burst, m.calls_per_minute)
        && burst > rate
    {
        errors.push(ErrorKind::OutOfRange, "mcp.burst", format!(
                "burst {burst} exceeds calls_per_minute {rate}: a burst is at most one minute of calls"
            ));
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn env(policy: &Policy, errors: &mut Errors<'_>) {
    for (i, entry) in policy.env.allow.iter().enumerate() {
        let name = entry.strip_suffix('*').unwrap_or(entry);
        let ok = if entry.ends_with('*') {
            name.is_empty() || is_env_name(name)
        } else {
            is_env_name(name)
        };
        if !ok {
            errors.push(
                ErrorKind::Invalid,
                &format!("env.allow[{i}]"),
                format!("`{entry}` is not a variable name or `PREFIX*` pattern"),
            );
        }
    }
    for (name, value) in &policy.env.set {
        let key = crate::source::join_key("env.set", name);
        if !is_env_name(name) {
            errors.push(
                ErrorKind::Invalid,
                &key,
                format!("`{name}` is not a valid variable name"),
            );
        }
        if value.contains('\0') {
            errors.push(ErrorKind::Invalid, &key, "value contains a NUL byte");
        }
    }
}

/// `model.models`: glob patterns of model names; `model.default` a name
/// within them.
fn models(budget: &crate::model::ModelBudget, errors: &mut Errors<'_>) {
    if let Some(patterns) = &budget.models {
        if patterns.is_empty() {
            errors.push(
                ErrorKind::Invalid,
                "model.models",
                "lists no model: an agent of the role could use none (leave it out to allow any)",
            );
        }
        for (i, pattern) in patterns.iter().enumerate() {
            let chars_ok = !pattern.is_empty()
                && pattern.len() <= crate::model::MAX_MODEL_NAME
                && pattern
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._:/@*?[]!".contains(c));
            if !chars_ok || glob::Pattern::new(pattern).is_err() {
                errors.push(ErrorKind::Invalid, &format!("model.models[{i}]"), format!(
                    "`{}` is not a model name or glob pattern (letters, digits, `-._:/@` and `* ? [ ]`)",
                    pattern.escape_debug()
                ));
            }
        }
    }
    if let Some(default) = &budget.default {
        if let Some(problem) = crate::model::model_name_problem(default) {
            errors.push(ErrorKind::Invalid, "model.default", problem);
        } else if !budget.allows_model(default) {
            errors.push(
                ErrorKind::Invalid,
                "model.default",
                format!("`{default}` is not within `model.models`"),
            );
        }
    }
}

fn tools(policy: &Policy, errors: &mut Errors<'_>) {
    let lists = [
        ("tools.allow", policy.tools.allow.as_deref().unwrap_or(&[])),
        ("tools.deny", &policy.tools.deny[..]),
    ];
    for (key, list) in lists {
        for (i, pattern) in list.iter().enumerate() {
            let chars_ok = !pattern.is_empty()
                && pattern.len() <= 128
                && pattern
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.*?[]!/".contains(c));
            if !chars_ok || glob::Pattern::new(pattern).is_err() {
                errors.push(ErrorKind::Invalid, &format!("{key}[{i}]"), format!(
                    "`{pattern}` is not a tool name or glob pattern (letters, digits, `_ - . /` and `* ? [ ]`)"
                ));
            }
        }
    }
}
