//! Roles written inline in the daemon's configuration file (seed 004
//! §3.1 and §3.2), made into the policies they stand for: each extends a
//! policy (default `worker`) for its sandbox, scopes its tools, and holds
//! its persona. The policy text is generated with the toml crate (values
//! are quoted by it, never pasted) and loaded like a file beside the
//! configuration, so `extends` and a script's `path` resolve from there.
//!
//! ```toml
//! [roles.code-reviewer]
//! description = "Reviews code changes against project conventions"
//! extends = "reviewer"
//! tools = ["send_message", "check_inbox"]
//! system_prompt = "You are a senior code reviewer ..."
//!
//! [roles.script.incident-responder]
//! path = "roles/incident-responder.lua"
//! timeout = 30            # seconds
//! search_limit = 5        # any other key: the script's `config`
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::load::{LoadOptions, LoadedPolicy, load_str, valid_role_name};

/// The daemon's configuration file: its state database and its roles.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonFile {
    /// Where the state database is (`--state`): `sqlite:PATH` or a
    /// `postgres://` URL.
    state: Option<String>,
    #[serde(default)]
    roles: BTreeMap<String, toml::Value>,
}

/// The `state` the daemon's configuration file names, if any.
pub fn daemon_state(file: &Path) -> Result<Option<String>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    daemon_state_str(&text).map_err(|e| format!("{}: {e}", file.display()))
}

/// The `state` a configuration file's text names, if any.
pub fn daemon_state_str(text: &str) -> Result<Option<String>, String> {
    let parsed: DaemonFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
    Ok(parsed.state)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticRole {
    extends: Option<String>,
    description: Option<String>,
    tools: Option<Vec<String>>,
    system_prompt: String,
}

/// A script role: the keys below, and any other key for its `config`.
#[derive(Debug, Deserialize)]
struct ScriptRole {
    extends: Option<String>,
    description: Option<String>,
    tools: Option<Vec<String>>,
    path: PathBuf,
    /// Seconds, as in the seed.
    timeout: Option<u64>,
    memory_mb: Option<u64>,
    #[serde(flatten)]
    config: BTreeMap<String, toml::Value>,
}

/// One inline role as the text of the policy it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineRole {
    pub name: String,
    pub policy_text: String,
}

/// The roles of a daemon configuration file, in name order.
pub fn inline_roles(text: &str) -> Result<Vec<InlineRole>, String> {
    let file: DaemonFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let mut out = Vec::new();
    for (name, value) in file.roles {
        if name == "script" {
            let scripts: BTreeMap<String, ScriptRole> = value
                .try_into()
                .map_err(|e: toml::de::Error| format!("roles.script: {}", e.message()))?;
            for (name, role) in scripts {
                check_name(&name, &out)?;
                out.push(InlineRole {
                    policy_text: script_policy(&role)
                        .map_err(|e| format!("roles.script.{name}: {e}"))?,
                    name,
                });
            }
            continue;
        }
        let role: StaticRole = value
            .try_into()
            .map_err(|e: toml::de::Error| format!("roles.{name}: {}", e.message()))?;
        check_name(&name, &out)?;
        out.push(InlineRole {
            policy_text: static_policy(&role).map_err(|e| format!("roles.{name}: {e}"))?,
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn check_name(name: &str, seen: &[InlineRole]) -> Result<(), String> {
    if !valid_role_name(name) {
        return Err(format!(
            "`{name}` is not a role name (letters, digits, `-`, `_`)"
        ));
    }
    if seen.iter().any(|r| r.name == name) {
        return Err(format!("role `{name}` is defined twice"));
    }
    Ok(())
}

fn head(extends: &Option<String>, tools: &Option<Vec<String>>) -> toml::Table {
    let mut policy = toml::Table::new();
    policy.insert("version".into(), toml::Value::Integer(1));
    let parent = extends.clone().unwrap_or_else(|| "worker".into());
    policy.insert("extends".into(), toml::Value::String(parent));
    if let Some(tools) = tools {
        let allow = tools.iter().cloned().map(toml::Value::String).collect();
        let mut scope = toml::Table::new();
        scope.insert("allow".into(), toml::Value::Array(allow));
        policy.insert("tools".into(), toml::Value::Table(scope));
    }
    policy
}

fn static_policy(role: &StaticRole) -> Result<String, String> {
    let mut policy = head(&role.extends, &role.tools);
    let mut persona = toml::Table::new();
    if let Some(d) = &role.description {
        persona.insert("description".into(), toml::Value::String(d.clone()));
    }
    persona.insert(
        "system_prompt".into(),
        toml::Value::String(role.system_prompt.clone()),
    );
    policy.insert("persona".into(), toml::Value::Table(persona));
    toml::to_string(&policy).map_err(|e| e.to_string())
}

fn script_policy(role: &ScriptRole) -> Result<String, String> {
    let mut policy = head(&role.extends, &role.tools);
    let mut persona = toml::Table::new();
    if let Some(d) = &role.description {
        persona.insert("description".into(), toml::Value::String(d.clone()));
    }
    let path = role.path.to_str().ok_or("`path` is not UTF-8")?;
    persona.insert("script".into(), toml::Value::String(path.to_string()));
    if let Some(seconds) = role.timeout {
        let ms = seconds
            .checked_mul(1000)
            .and_then(|ms| i64::try_from(ms).ok())
            .ok_or("`timeout` is too large")?;
        persona.insert("timeout_ms".into(), toml::Value::Integer(ms));
    }
    if let Some(mb) = role.memory_mb {
        let mb = i64::try_from(mb).map_err(|_| "`memory_mb` is too large")?;
        persona.insert("memory_mb".into(), toml::Value::Integer(mb));
    }
    if !role.config.is_empty() {
        let config = role.config.clone().into_iter().collect();
        persona.insert("config".into(), toml::Value::Table(config));
    }
    policy.insert("persona".into(), toml::Value::Table(persona));
    toml::to_string(&policy).map_err(|e| e.to_string())
}

/// An inline role loaded, with the text of a policy file that stands for
/// it wherever it is written: the role has no file of its own (NAME.toml
/// beside the configuration is not it, and may be another policy), so a
/// launcher is given that text in a file of the daemon's.
#[derive(Debug, Clone)]
pub struct InlinePolicy {
    pub loaded: LoadedPolicy,
    /// Its `extends` the file (absolute) or built-in name it resolved to,
    /// its script's path absolute: the same policy read from anywhere.
    pub standalone: String,
}

/// Loads a configuration file's inline roles as policies, each as if it
/// were NAME.toml beside the file. The error names the file and the role.
pub fn load_inline(file: &Path, options: &LoadOptions) -> Result<Vec<InlinePolicy>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let roles = inline_roles(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let dir = file.parent().unwrap_or(Path::new("."));
    roles
        .into_iter()
        .map(|role| {
            let path = dir.join(format!("{}.toml", role.name));
            let failed =
                |message: String| format!("{}: role `{}`: {message}", file.display(), role.name);
            let loaded = load_str(&path, &role.policy_text, options).map_err(|errors| {
                failed(
                    errors
                        .0
                        .iter()
                        .map(|e| e.message.clone())
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
            let standalone = standalone_text(&role.policy_text, &loaded).map_err(failed)?;
            Ok(InlinePolicy { loaded, standalone })
        })
        .collect()
}

/// `text` (an inline role's policy) with what it names relative to the
/// configuration's directory replaced by what `loaded` resolved it to.
fn standalone_text(text: &str, loaded: &LoadedPolicy) -> Result<String, String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    if let Some(parent) = loaded.chain.get(1) {
        let extends = if crate::builtin::is_builtin_label(parent) {
            loaded_name(parent)
        } else {
            std::path::absolute(parent)
                .map_err(|e| format!("{}: {e}", parent.display()))?
                .to_str()
                .ok_or_else(|| format!("{}: not UTF-8", parent.display()))?
                .to_string()
        };
        table.insert("extends".into(), toml::Value::String(extends));
    }
    if let Some(script) = &loaded.policy.persona.script
        && let Some(persona) = table.get_mut("persona").and_then(toml::Value::as_table_mut)
    {
        let script = script.to_str().ok_or("`path` is not UTF-8")?;
        persona.insert("script".into(), toml::Value::String(script.to_string()));
    }
    toml::to_string(&table).map_err(|e| e.to_string())
}

/// A built-in's name from its label (`builtin:policies/worker.toml`).
fn loaded_name(label: &Path) -> String {
    label
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_roles_become_policy_texts() {
        let roles = inline_roles(
            r#"
            [roles.code-reviewer]
            description = "Reviews \"code\""
            extends = "reviewer"
            tools = ["send_message", "check_inbox"]
            system_prompt = """
            Review.
            [persona]
            script = "evil.lua"
            """

            [roles.script.incident]
            path = "roles/incident.lua"
            timeout = 30
            search_limit = 5
            priority_sources = ["runbooks"]
            "#,
        )
        .unwrap();
        assert_eq!(roles.len(), 2);
        assert_eq!(roles[0].name, "code-reviewer");
        let reviewer: toml::Table = toml::from_str(&roles[0].policy_text).unwrap();
        assert_eq!(reviewer["extends"].as_str(), Some("reviewer"));
        assert_eq!(reviewer["tools"]["allow"].as_array().unwrap().len(), 2);
        // The prompt stays one string, whatever it holds.
        let persona = reviewer["persona"].as_table().unwrap();
        assert!(
            persona["system_prompt"]
                .as_str()
                .unwrap()
                .contains("script = \"evil.lua\"")
        );
        assert!(!persona.contains_key("script"));
        let incident: toml::Table = toml::from_str(&roles[1].policy_text).unwrap();
        assert_eq!(incident["extends"].as_str(), Some("worker"));
        let persona = incident["persona"].as_table().unwrap();
        assert_eq!(persona["script"].as_str(), Some("roles/incident.lua"));
        assert_eq!(persona["timeout_ms"].as_integer(), Some(30_000));
        assert_eq!(persona["config"]["search_limit"].as_integer(), Some(5));
        assert_eq!(
            persona["config"]["priority_sources"][0].as_str(),
            Some("runbooks")
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            ("colour = 1", "unknown field `colour`"),
            (
                "[roles.a]\ndescription = \"x\"",
                "missing field `system_prompt`",
            ),
            (
                "[roles.a]\nsystem_prompt = \"x\"\nshell = true",
                "unknown field `shell`",
            ),
            ("[roles.script.a]\ntimeout = 3", "missing field `path`"),
            (
                "[roles.\"a b\"]\nsystem_prompt = \"x\"",
                "is not a role name",
            ),
            (
                "[roles.a]\nsystem_prompt = \"x\"\n[roles.script.a]\npath = \"a.lua\"",
                "defined twice",
            ),
            (
                "[roles.script.a]\npath = \"a.lua\"\ntimeout = 99999999999999999",
                "too large",
            ),
        ];
        for (text, wanted) in cases {
            let err = inline_roles(text).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
