//! Loading a policy: read the file and everything it `extends`, merge them
//! (later files win; tables merge key by key, arrays and values are replaced),
//! deserialize with key paths, validate, and resolve the seccomp profile.

use std::path::{Path, PathBuf};

use serde_path_to_error::Segment;

use crate::builtin;
use crate::error::{ErrorKind, PolicyError, PolicyErrors};
use crate::location::Location;
use crate::model::Policy;
use crate::seccomp::SeccompProfile;
use crate::source::{SourceMap, join_index, join_key, parse_toml};
use crate::validate::validate;

/// How deep `extends` may nest before we call it a mistake.
const MAX_EXTENDS_DEPTH: usize = 8;

/// Where names (not paths) are looked up, after the policy's own directory
/// and before the built-ins.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub policy_dirs: Vec<PathBuf>,
    pub seccomp_dirs: Vec<PathBuf>,
}

/// A policy ready for planning and auditing.
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    /// The role name: the file stem (`worker` for policies/worker.toml).
    pub name: String,
    pub path: PathBuf,
    /// The files that made it, the policy itself first, then what it extends.
    pub chain: Vec<PathBuf>,
    pub policy: Policy,
    pub sources: SourceMap,
    pub seccomp: SeccompChoice,
}

#[derive(Debug, Clone)]
pub enum SeccompChoice {
    Unconfined,
    Profile {
        name: String,
        path: PathBuf,
        profile: SeccompProfile,
    },
}

impl LoadedPolicy {
    /// The location of a key path, falling back to the top of the policy file.
    pub fn locate(&self, key_path: &str) -> Location {
        self.sources
            .lookup(key_path)
            .cloned()
            .unwrap_or_else(|| Location::start_of(&self.path))
    }
}

/// Loads a policy file, or a built-in policy when `path` is `builtin:NAME`.
pub fn load_file(path: &Path, options: &LoadOptions) -> Result<LoadedPolicy, PolicyErrors> {
    let text = read_policy(path)?;
    load_str(path, &text, options)
}

/// Loads a built-in policy by name (`worker`, `reviewer`, `strict`).
pub fn load_builtin(
    name: &str,
    options: &LoadOptions,
) -> Option<Result<LoadedPolicy, PolicyErrors>> {
    let text = builtin::policy(name)?;
    Some(load_str(
        Path::new(&builtin::policy_label(name)),
        text,
        options,
    ))
}

/// Loads policy text as if read from `path` (used by tests and fuzzing).
pub fn load_str(
    path: &Path,
    text: &str,
    options: &LoadOptions,
) -> Result<LoadedPolicy, PolicyErrors> {
    let layers = read_chain(path, text, options)?;
    let chain: Vec<PathBuf> = layers.iter().map(|l| l.path.clone()).collect();
    let (table, sources) = merge_layers(layers);
    let policy = deserialize(table, &sources, path)?;
    let mut errors = validate(&policy, &sources, path);
    let seccomp = match resolve_seccomp(&policy, &sources, path, options) {
        Ok(choice) => Some(choice),
        Err(err) => {
            errors.push(err);
            None
        }
    };
    match seccomp {
        Some(seccomp) if errors.is_empty() => Ok(LoadedPolicy {
            name: role_name(path),
            path: path.to_path_buf(),
            chain,
            policy,
            sources,
            seccomp,
        }),
        _ => Err(PolicyErrors(errors)),
    }
}

fn role_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "policy".to_string())
}

fn read_policy(path: &Path) -> Result<String, PolicyError> {
    std::fs::read_to_string(path).map_err(|err| {
        PolicyError::new(
            ErrorKind::Io,
            Location::start_of(path),
            "",
            format!("cannot read policy: {err}"),
        )
    })
}

struct Layer {
    path: PathBuf,
    table: toml::Table,
    sources: SourceMap,
}

/// The policy and its ancestors, the policy itself first.
fn read_chain(path: &Path, text: &str, options: &LoadOptions) -> Result<Vec<Layer>, PolicyError> {
    let mut layers: Vec<Layer> = Vec::new();
    let mut current = (path.to_path_buf(), text.to_string());
    loop {
        let (path, text) = current;
        let (table, sources) = parse_toml(&path, &text)?;
        let parent = match table.get("extends") {
            None => None,
            Some(toml::Value::String(name)) => Some(name.clone()),
            Some(other) => {
                return Err(extends_error(
                    &sources,
                    &path,
                    format!(
                        "`extends` must be a policy name or path string, not a {}",
                        other.type_str()
                    ),
                ));
            }
        };
        let extends_location = sources.lookup("extends").cloned();
        layers.push(Layer {
            path: path.clone(),
            table,
            sources,
        });
        let Some(name) = parent else { break };
        let location = extends_location.unwrap_or_else(|| Location::start_of(&path));
        if layers.len() > MAX_EXTENDS_DEPTH {
            return Err(PolicyError::new(
                ErrorKind::Extends,
                location,
                "extends",
                format!("`extends` nests deeper than {MAX_EXTENDS_DEPTH} levels"),
            ));
        }
        let next = resolve_extends(&name, &path, options).map_err(|e| {
            PolicyError::new(
                ErrorKind::Extends,
                location.clone(),
                "extends",
                e.to_string(),
            )
        })?;
        if layers.iter().any(|l| same_file(&l.path, &next.0)) {
            return Err(PolicyError::new(
                ErrorKind::Extends,
                location,
                "extends",
                format!(
                    "`extends = \"{name}\"` forms a cycle through {}",
                    next.0.display()
                ),
            ));
        }
        current = next;
    }
    Ok(layers)
}

fn extends_error(sources: &SourceMap, path: &Path, message: String) -> PolicyError {
    let location = sources
        .lookup("extends")
        .cloned()
        .unwrap_or_else(|| Location::start_of(path));
    PolicyError::new(ErrorKind::Extends, location, "extends", message)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn builtin_names() -> String {
    let names: Vec<&str> = builtin::POLICIES.iter().map(|(n, _)| *n).collect();
    names.join(", ")
}

/// Why the policy an `extends` names cannot be read.
#[derive(Debug, thiserror::Error)]
enum ExtendsError {
    #[error("a built-in policy cannot extend the path `{0}`")]
    BuiltinExtendsPath(String),
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{0}` is not a policy name (letters, digits, `-`, `_`)")]
    NotAName(String),
    #[error(
        "no policy named `{0}`: not beside this file, not in the policy directories, not built in (built-ins: {builtins})",
        builtins = builtin_names()
    )]
    NotFound(String),
}

/// A plain role name: letters, digits, `-`, `_` (what a policy is found
/// by, and what `role init` accepts).
pub fn valid_role_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `NAME.toml` in the first of `dirs` that has it, for a plain NAME
/// (letters, digits, `-`, `_`): how `extends`, `run --policy` and `check`
/// find a policy by name before the built-ins.
pub fn named_policy_file<'a>(
    name: &str,
    dirs: impl IntoIterator<Item = &'a PathBuf>,
) -> Option<PathBuf> {
    if !valid_role_name(name) {
        return None;
    }
    dirs.into_iter()
        .map(|dir| dir.join(format!("{name}.toml")))
        .find(|path| path.is_file())
}

/// `extends = "worker"` looks for worker.toml beside the policy, then in the
/// configured directories, then among the built-ins. A value with a `/` or
/// ending in `.toml` is a path relative to the policy's directory.
fn resolve_extends(
    name: &str,
    from: &Path,
    options: &LoadOptions,
) -> Result<(PathBuf, String), ExtendsError> {
    let from_dir = (!builtin::is_builtin_label(from))
        .then(|| from.parent().unwrap_or(Path::new(".")).to_path_buf());
    let read = |path: PathBuf| match std::fs::read_to_string(&path) {
        Ok(text) => Ok((path, text)),
        Err(source) => Err(ExtendsError::Read { path, source }),
    };
    if name.contains('/') || name.ends_with(".toml") {
        let dir = from_dir.ok_or_else(|| ExtendsError::BuiltinExtendsPath(name.to_string()))?;
        return read(dir.join(name));
    }
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ExtendsError::NotAName(name.to_string()));
    }
    if let Some(path) = named_policy_file(name, from_dir.iter().chain(options.policy_dirs.iter())) {
        return read(path);
    }
    match builtin::policy(name) {
        Some(text) => Ok((PathBuf::from(builtin::policy_label(name)), text.to_string())),
        None => Err(ExtendsError::NotFound(name.to_string())),
    }
}

/// Applies the layers from the root ancestor down to the policy itself.
fn merge_layers(mut layers: Vec<Layer>) -> (toml::Table, SourceMap) {
    let Some(root) = layers.pop() else {
        return (toml::Table::new(), SourceMap::default());
    };
    let (mut table, mut sources) = (toml::Table::new(), SourceMap::default());
    let mut next = Some(root);
    while let Some(mut layer) = next.take().or_else(|| layers.pop()) {
        let adds = take_binds_add(&mut layer.table);
        script_from_its_layer(&mut layer.table, &layer.path);
        prompt_replaces_prompt(&mut table, &layer.table);
        let mut replaced = Vec::new();
        merge_tables(&mut table, layer.table, "", &mut replaced);
        sources.overlay(layer.sources, &replaced);
        if let Some(adds) = adds {
            append_binds(&mut table, &mut sources, adds);
        }
    }
    (table, sources)
}

/// `persona.script` is relative to the file that names it: joined to that
/// file's directory here, once, before a policy extending that file
/// inherits it from elsewhere, and made absolute (a relative policy path
/// is relative to the current directory), so nothing joins it again.
fn script_from_its_layer(layer: &mut toml::Table, path: &Path) {
    let Some(persona) = layer.get_mut("persona").and_then(toml::Value::as_table_mut) else {
        return;
    };
    let Some(toml::Value::String(script)) = persona.get_mut("script") else {
        return;
    };
    if let Some(dir) = path.parent()
        && Path::new(script.as_str()).is_relative()
    {
        let joined = dir.join(script.as_str());
        let joined = std::path::absolute(&joined).unwrap_or(joined);
        *script = joined.display().to_string();
    }
}

/// A role's prompt comes from `persona.system_prompt` or `persona.script`:
/// a layer giving one drops the other from the layers below (a script
/// role extending `worker` does not inherit its system prompt).
fn prompt_replaces_prompt(table: &mut toml::Table, layer: &toml::Table) {
    let Some(given) = layer.get("persona").and_then(toml::Value::as_table) else {
        return;
    };
    let Some(below) = table.get_mut("persona").and_then(toml::Value::as_table_mut) else {
        return;
    };
    if given.contains_key("script") {
        below.remove("system_prompt");
    }
    if given.contains_key("system_prompt") {
        for key in ["script", "timeout_ms", "memory_mb", "config"] {
            below.remove(key);
        }
    }
}

/// `filesystem.binds_add` of one layer, when it is an array (anything
/// else stays for deserialization to report with its place).
fn take_binds_add(layer: &mut toml::Table) -> Option<Vec<toml::Value>> {
    let filesystem = layer.get_mut("filesystem")?.as_table_mut()?;
    if !filesystem.get("binds_add")?.is_array() {
        return None;
    }
    match filesystem.remove("binds_add") {
        Some(toml::Value::Array(adds)) => Some(adds),
        _ => None,
    }
}

/// The one rule for lists of binds: `binds` replaces what a layer below
/// gave, `binds_add` appends to the list in force (after this layer's own
/// `binds`). Their places move with them, so findings still point at them.
fn append_binds(table: &mut toml::Table, sources: &mut SourceMap, adds: Vec<toml::Value>) {
    let filesystem = table
        .entry("filesystem")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(filesystem) = filesystem.as_table_mut() else {
        return;
    };
    let binds = filesystem
        .entry("binds")
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    if let Some(binds) = binds.as_array_mut() {
        sources.move_array_items("filesystem.binds_add", "filesystem.binds", binds.len());
        binds.extend(adds);
    }
}

fn merge_tables(
    base: &mut toml::Table,
    over: toml::Table,
    prefix: &str,
    replaced: &mut Vec<String>,
) {
    for (key, value) in over {
        let path = join_key(prefix, &key);
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(over_table)) => {
                merge_tables(base_table, over_table, &path, replaced)
            }
            (_, value) => {
                replaced.push(path);
                base.insert(key, value);
            }
        }
    }
}

fn key_path_of(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        out = match segment {
            Segment::Seq { index } => join_index(&out, *index),
            Segment::Map { key } => join_key(&out, key),
            Segment::Enum { variant } => join_key(&out, variant),
            Segment::Unknown => join_key(&out, "?"),
        };
    }
    out
}

fn classify(message: &str) -> ErrorKind {
    if message.starts_with("unknown field") {
        ErrorKind::UnknownKey
    } else if message.starts_with("missing field") {
        ErrorKind::MissingKey
    } else if message.starts_with("invalid value: integer") {
        ErrorKind::OutOfRange
    } else {
        ErrorKind::WrongType
    }
}

/// The first `name` in backquotes of a serde message.
fn quoted(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// `unconfined`, a name found in the seccomp directories or built in, or a
/// path relative to the file that set it.
fn resolve_seccomp(
    policy: &Policy,
    sources: &SourceMap,
    path: &Path,
    options: &LoadOptions,
) -> Result<SeccompChoice, PolicyError> {
    let value = policy.seccomp.profile.as_str();
    let location = sources
        .lookup("seccomp.profile")
        .cloned()
        .unwrap_or_else(|| Location::start_of(path));
    let missing = |message: String| {
        PolicyError::new(
            ErrorKind::MissingSeccompProfile,
            location.clone(),
            "seccomp.profile",
            message,
        )
    };
    if value == "unconfined" {
        return Ok(SeccompChoice::Unconfined);
    }
    let (file, text) = if value.contains('/') || value.ends_with(".json") {
        let file = if Path::new(value).is_absolute() {
            PathBuf::from(value)
        } else if builtin::is_builtin_label(&location.file) {
            return Err(missing(format!(
                "a built-in policy cannot name the relative profile path `{value}`"
            )));
        } else {
            location.file.parent().unwrap_or(Path::new(".")).join(value)
        };
        let text = std::fs::read_to_string(&file).map_err(|err| {
            missing(format!(
                "cannot read seccomp profile `{}`: {err}",
                file.display()
            ))
        })?;
        (file, text)
    } else {
        find_named_profile(value, options).ok_or_else(|| {
            missing(format!(
                "no seccomp profile named `{value}` in {} and none built in (built-ins: {}; or use `unconfined`)",
                describe_dirs(&options.seccomp_dirs),
                builtin::SECCOMP_PROFILES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ))
        })?
    };
    let profile = SeccompProfile::parse(&file, &text)?;
    Ok(SeccompChoice::Profile {
        name: value.to_string(),
        path: file,
        profile,
    })
}

fn find_named_profile(name: &str, options: &LoadOptions) -> Option<(PathBuf, String)> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return None;
    }
    let file = format!("{name}.json");
    for dir in &options.seccomp_dirs {
        let path = dir.join(&file);
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Some((path, text));
        }
    }
    builtin::seccomp_profile(name).map(|text| {
        (
            PathBuf::from(builtin::seccomp_label(name)),
            text.to_string(),
        )
    })
}

fn describe_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        "no seccomp directory".to_string()
    } else {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

mod typed;
use typed::deserialize;

#[cfg(test)]
mod binds_add_tests;

#[cfg(test)]
mod errors_tests;
