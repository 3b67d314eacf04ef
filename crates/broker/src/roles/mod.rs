//! Roles as seed 004 describes its agents: a name, a description, the tools
//! the role uses, the arguments it takes, and `resolve`, which turns
//! arguments into the role's system prompt and opening messages. Three
//! kinds: a policy's static `[persona]`, a Lua script (`lua`), and Rust
//! types an embedding program registers (`Role`).
//!
//! Roles stay policies here: the sandbox of an agent is its role's policy
//! whatever kind of role resolves its prompt.

pub mod eval;
pub mod gate;
pub mod lua;
#[cfg(test)]
mod lua_tests;
pub mod script;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Arguments given to a role (`prompts/get`, `agent spawn --arg k=v`).
pub type RoleArgs = BTreeMap<String, String>;

/// An argument a role takes (seed 004 §4.2); an MCP prompt argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleArgument {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub required: bool,
}

/// One opening message (seed 004 §4.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptMessage {
    pub role: MessageRole,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    User,
    Assistant,
    System,
}

/// A resolved role (seed 004 §4.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolePrompt {
    pub system: String,
    /// The tools the role declares (its policy's scope still applies).
    pub tools: Vec<String>,
    pub messages: Vec<PromptMessage>,
}

/// Where a role comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleSource {
    /// A policy's `[persona]`.
    Toml,
    Lua,
    Rust,
}

/// Limits on one resolve.
pub const MAX_SYSTEM_BYTES: usize = 256 << 10;
pub const MAX_MESSAGES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RoleError {
    #[error("role `{role}`: argument `{name}` is required")]
    MissingArgument { role: String, name: String },
    #[error("role `{role}` takes no argument `{name}` (it takes: {takes})")]
    UnknownArgument {
        role: String,
        name: String,
        takes: String,
    },
    #[error("role `{role}`: {message}")]
    Script { role: String, message: String },
    #[error("role `{role}` ran past its time limit of {ms} ms")]
    Timeout { role: String, ms: u64 },
    #[error("role `{role}` ran past its memory limit of {bytes} bytes")]
    Memory { role: String, bytes: usize },
    #[error("role `{role}`: too many role evaluations at once; try again")]
    Busy { role: String },
    #[error(
        "role `{role}`: an earlier evaluation still runs past its time limit (stuck in one native call); the role is refused until it ends"
    )]
    Stuck { role: String },
    #[error("role `{role}`: {message}")]
    Invalid { role: String, message: String },
    /// An agent over its evaluations at once or in a minute (`gate`).
    #[error(
        "role `{role}`: too many role evaluations by this agent; try again in {retry_after_ms} ms"
    )]
    Limited { role: String, retry_after_ms: u64 },
}

/// Read-only team functions a role's `resolve` may call (seed 004's
/// `context`, in this project's terms). Each call counts against the
/// role's limit of steps.
pub trait TeamContext: Send + Sync {
    /// The team: each agent's name, role and state.
    fn team(&self) -> Value;
    /// The calling agent's inbox: how many messages wait, from whom.
    fn inbox(&self) -> Value;
    /// One agent as `inspect_agent` shows it; None when there is none.
    fn inspect(&self, name: &str) -> Option<Value>;
}

/// A context with nothing in it: `role test` and callers without a team.
#[derive(Debug, Default)]
pub struct NoTeam;

impl TeamContext for NoTeam {
    fn team(&self) -> Value {
        Value::Array(Vec::new())
    }
    fn inbox(&self) -> Value {
        serde_json::json!({"waiting": 0, "from": []})
    }
    fn inspect(&self, _name: &str) -> Option<Value> {
        None
    }
}

/// A role an embedding program compiles in (seed 004 §3.3), registered
/// with `Broker::register_role` under the name of the policy whose
/// sandbox its agents get. `resolve` is synchronous: it runs on a thread
/// of its own with the role's time limit.
pub trait Role: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// Tool names or globs the role uses; empty: its policy's scope.
    fn tools(&self) -> Vec<String>;
    fn arguments(&self) -> Vec<RoleArgument> {
        Vec::new()
    }
    /// Whether `resolve` returns within the role's time limit by itself
    /// (a script role's evaluator is killed at its limit): then it runs on
    /// the caller's thread, else on a thread of its own (`on_thread`).
    fn bounded(&self) -> bool {
        false
    }
    fn resolve(
        &self,
        args: &RoleArgs,
        context: Arc<dyn TeamContext>,
    ) -> Result<RolePrompt, RoleError>;
}

/// A script role's limits from its policy: `[persona]` timeout and memory,
/// and as many context calls as the role has tool steps in a turn.
pub fn script_limits(policy: &substrat_policy::model::Policy) -> lua::LuaLimits {
    use substrat_policy::model::{DEFAULT_SCRIPT_MEMORY_MB, DEFAULT_SCRIPT_TIMEOUT_MS};
    let persona = &policy.persona;
    let mb = persona.memory_mb.unwrap_or(DEFAULT_SCRIPT_MEMORY_MB);
    lua::LuaLimits {
        timeout: Duration::from_millis(persona.timeout_ms.unwrap_or(DEFAULT_SCRIPT_TIMEOUT_MS)),
        memory_bytes: usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        context_calls: policy
            .mcp
            .tool_steps_per_turn
            .unwrap_or(DEFAULT_CONTEXT_CALLS),
    }
}

/// Context calls of a role with no step limit.
pub const DEFAULT_CONTEXT_CALLS: u32 = 50;

/// The script of a policy's `[persona]`: the loader already joined it to
/// the directory of the file that names it (joining it again to the
/// policy's directory made `roles/roles/x.lua` of a relative one).
pub fn script_path(loaded: &substrat_policy::LoadedPolicy) -> Option<std::path::PathBuf> {
    loaded.policy.persona.script.clone()
}

/// Loads every policy's script role (each script's top level runs once,
/// with its limits, to learn what it declares).
pub fn load_scripts(
    roles: &BTreeMap<String, substrat_policy::LoadedPolicy>,
) -> Result<Vec<Arc<dyn Role>>, RoleError> {
    let mut out: Vec<Arc<dyn Role>> = Vec::new();
    for (name, loaded) in roles {
        let Some(path) = script_path(loaded) else {
            continue;
        };
        let config =
            serde_json::to_value(&loaded.policy.persona.config).map_err(|e| RoleError::Script {
                role: name.clone(),
                message: format!("persona.config: {e}"),
            })?;
        // Its top level runs in an evaluator, with the role's limits.
        let role = script::ScriptRole::load(name, &path, config, script_limits(&loaded.policy))?;
        out.push(Arc::new(role));
    }
    Ok(out)
}

/// Evaluations in their time now, and those past it (by role). A script
/// stuck in one native call cannot be stopped from outside its thread: it
/// leaves the running count when its caller gives up (so it cannot take
/// the capacity of other roles) and its role is refused until it ends (so
/// it cannot pile threads up).
struct Slots {
    running: usize,
    overdue: BTreeMap<String, usize>,
}

static SLOTS: std::sync::Mutex<Slots> = std::sync::Mutex::new(Slots {
    running: 0,
    overdue: BTreeMap::new(),
});
/// At most this many evaluations within their time at once.
pub const MAX_RUNNING: usize = 4;
/// How long past its own time limit a role's thread is waited for.
const GRACE: Duration = Duration::from_secs(1);

fn slots() -> std::sync::MutexGuard<'static, Slots> {
    SLOTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `work` for `role` on a thread of its own: the caller waits at most
/// `timeout` and a little more, whatever the work does.
pub fn on_thread<T: Send + 'static>(
    role: &str,
    timeout: Duration,
    work: impl FnOnce() -> Result<T, RoleError> + Send + 'static,
) -> Result<T, RoleError> {
    {
        let mut s = slots();
        if s.overdue.get(role).is_some_and(|n| *n > 0) {
            return Err(RoleError::Stuck {
                role: role.to_string(),
            });
        }
        if s.running >= MAX_RUNNING {
            return Err(RoleError::Busy {
                role: role.to_string(),
            });
        }
        s.running += 1;
    }
    let overdue = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (name, flag) = (role.to_string(), overdue.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("role-{role}"))
        .spawn(move || {
            let outcome = work();
            let mut s = slots();
            if flag.load(Ordering::Acquire) {
                if let Some(n) = s.overdue.get_mut(&name) {
                    *n = n.saturating_sub(1);
                }
            } else {
                s.running -= 1;
            }
            drop(s);
            let _ = tx.send(outcome);
        });
    if spawned.is_err() {
        slots().running -= 1;
        return Err(RoleError::Busy {
            role: role.to_string(),
        });
    }
    match rx.recv_timeout(timeout + GRACE) {
        Ok(outcome) => outcome,
        Err(_) => {
            let mut s = slots();
            // It may have ended in between: then its answer is here.
            if let Ok(outcome) = rx.try_recv() {
                return outcome;
            }
            overdue.store(true, Ordering::Release);
            s.running -= 1;
            *s.overdue.entry(role.to_string()).or_default() += 1;
            Err(RoleError::Timeout {
                role: role.to_string(),
                ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            })
        }
    }
}

/// Resolves `role`, the arguments checked first: a compiled role on a
/// thread of its own (`on_thread`), a script role (`bounded`) on this one.
pub fn resolve_on_thread(
    role: Arc<dyn Role>,
    args: RoleArgs,
    context: Arc<dyn TeamContext>,
    timeout: Duration,
) -> Result<RolePrompt, RoleError> {
    let name = role.name().to_string();
    check_args(&name, &role.arguments(), &args)?;
    let prompt = if role.bounded() {
        role.resolve(&args, context)?
    } else {
        on_thread(&name, timeout, move || role.resolve(&args, context))?
    };
    check_prompt(&name, &prompt)?;
    Ok(prompt)
}

/// Discovery (seed 004 §4.1): `prompts/list`, `role list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleInfo {
    pub name: String,
    pub description: String,
    pub tools: Vec<String>,
    pub source: RoleSource,
    pub arguments: Vec<RoleArgument>,
}

/// A static role (its policy's `[persona]`): what discovery shows.
pub fn static_info(name: &str, loaded: &substrat_policy::LoadedPolicy) -> RoleInfo {
    let policy = &loaded.policy;
    RoleInfo {
        name: name.to_string(),
        description: policy
            .persona
            .description
            .clone()
            .or_else(|| policy.description.clone())
            .unwrap_or_default(),
        tools: policy.tools.allow.clone().unwrap_or_default(),
        source: RoleSource::Toml,
        arguments: Vec::new(),
    }
}

/// A static role resolved: its system prompt; it takes no argument.
pub fn static_prompt(
    name: &str,
    loaded: &substrat_policy::LoadedPolicy,
    args: &RoleArgs,
) -> Result<RolePrompt, RoleError> {
    check_args(name, &[], args)?;
    let policy = &loaded.policy;
    Ok(RolePrompt {
        system: policy.persona.system_prompt.clone().unwrap_or_default(),
        tools: policy.tools.allow.clone().unwrap_or_default(),
        messages: Vec::new(),
    })
}

/// A compiled or script role: what discovery shows.
pub fn resolved_info(role: &dyn Role, source: RoleSource) -> RoleInfo {
    RoleInfo {
        name: role.name().to_string(),
        description: role.description().to_string(),
        tools: role.tools(),
        source,
        arguments: role.arguments(),
    }
}

/// Checks given arguments against those declared: required ones present,
/// no unknown one.
pub fn check_args(
    role: &str,
    declared: &[RoleArgument],
    given: &RoleArgs,
) -> Result<(), RoleError> {
    if let Some(missing) = declared
        .iter()
        .find(|a| a.required && !given.contains_key(&a.name))
    {
        return Err(RoleError::MissingArgument {
            role: role.to_string(),
            name: missing.name.clone(),
        });
    }
    if let Some(unknown) = given
        .keys()
        .find(|k| !declared.iter().any(|a| &a.name == *k))
    {
        let takes = declared
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(RoleError::UnknownArgument {
            role: role.to_string(),
            name: unknown.clone(),
            takes: if takes.is_empty() {
                "none".into()
            } else {
                takes
            },
        });
    }
    Ok(())
}

/// A resolved prompt as an agent CLI's system prompt: the system text,
/// then the opening messages, each marked with its role.
pub fn persona_text(prompt: &RolePrompt) -> String {
    let mut text = prompt.system.trim().to_string();
    if !prompt.messages.is_empty() {
        text.push_str("\n\nOpening messages:");
        for m in &prompt.messages {
            let role = match m.role {
                MessageRole::User => "user",
                MessageRole::Assistant => "assistant",
                MessageRole::System => "system",
            };
            text.push_str(&format!("\n[{role}] {}", m.content));
        }
    }
    text
}

/// Bounds a resolved prompt: the system prompt's size, the number of
/// messages; no NUL byte, which its turns could not carry (`carried`).
pub fn check_prompt(role: &str, prompt: &RolePrompt) -> Result<(), RoleError> {
    let invalid = |message: String| RoleError::Invalid {
        role: role.to_string(),
        message,
    };
    if prompt.system.len() > MAX_SYSTEM_BYTES {
        return Err(invalid(format!(
            "the system prompt has {} bytes, over the limit of {MAX_SYSTEM_BYTES}",
            prompt.system.len()
        )));
    }
    if prompt.messages.len() > MAX_MESSAGES {
        return Err(invalid(format!(
            "{} opening messages, over the limit of {MAX_MESSAGES}",
            prompt.messages.len()
        )));
    }
    let texts = std::iter::once(&prompt.system).chain(prompt.messages.iter().map(|m| &m.content));
    for text in texts {
        if let Some(message) = crate::carried::refusal("the prompt it resolved to", text) {
            return Err(invalid(message));
        }
    }
    let total: usize = prompt.messages.iter().map(|m| m.content.len()).sum();
    if total > MAX_SYSTEM_BYTES {
        return Err(invalid(format!(
            "the opening messages have {total} bytes, over the limit of {MAX_SYSTEM_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(name: &str, required: bool) -> RoleArgument {
        RoleArgument {
            name: name.into(),
            description: String::new(),
            required,
        }
    }

    #[test]
    fn arguments_are_checked_against_the_declared_ones() {
        let declared = [arg("service", true), arg("severity", false)];
        let given = |pairs: &[(&str, &str)]| -> RoleArgs {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            check_args("r", &declared, &given(&[("service", "db")])),
            Ok(())
        );
        assert_eq!(
            check_args("r", &declared, &given(&[("severity", "P1")]))
                .unwrap_err()
                .to_string(),
            "role `r`: argument `service` is required"
        );
        assert_eq!(
            check_args("r", &declared, &given(&[("service", "db"), ("x", "1")]))
                .unwrap_err()
                .to_string(),
            "role `r` takes no argument `x` (it takes: service, severity)"
        );
        assert_eq!(
            check_args("r", &[], &given(&[("x", "1")]))
                .unwrap_err()
                .to_string(),
            "role `r` takes no argument `x` (it takes: none)"
        );
    }

    /// What a script resolves to becomes its agent's command line at every
    /// turn: a NUL byte there is the resolve's error, not each turn's.
    #[test]
    fn a_resolved_prompt_with_a_nul_byte_is_refused() {
        let prompt = |system: &str, message: &str| RolePrompt {
            system: system.into(),
            tools: Vec::new(),
            messages: vec![PromptMessage {
                role: MessageRole::Assistant,
                content: message.into(),
            }],
        };
        assert_eq!(check_prompt("r", &prompt("ok", "ok")), Ok(()));
        for bad in [prompt("a\0b", "ok"), prompt("ok", "a\0b")] {
            assert_eq!(
                check_prompt("r", &bad).unwrap_err().to_string(),
                "role `r`: the prompt it resolved to: contains a NUL byte, which a launch cannot carry"
            );
        }
    }
}
