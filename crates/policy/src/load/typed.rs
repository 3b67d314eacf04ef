//! A loaded table into a `Policy`, or every type error in it, each at its
//! place.

use std::path::Path;

use super::{classify, join_index, join_key, key_path_of, quoted};
use crate::error::{ErrorKind, PolicyError, PolicyErrors};
use crate::location::Location;
use crate::model::Policy;
use crate::source::SourceMap;

/// The policy, or every type error in it: after a first error each key
/// (each key of a table, each item of an array) is tried on its own, so
/// one run reports all of them, each at its place.
pub(super) fn deserialize(
    table: toml::Table,
    sources: &SourceMap,
    path: &Path,
) -> Result<Policy, PolicyErrors> {
    let first = match type_error(toml::Value::Table(table.clone())) {
        None => {
            return serde_path_to_error::deserialize(toml::Value::Table(table))
                .map_err(|e| PolicyErrors(vec![policy_error(sources, path, describe(&e))]));
        }
        Some(first) => first,
    };
    let mut found: Vec<TypeError> = Vec::new();
    for (key, value) in &table {
        match value {
            toml::Value::Table(inner) => {
                for (sub, item) in inner {
                    found.extend(errors_of(key, Some(sub), item));
                }
            }
            value => found.extend(errors_of(key, None, value)),
        }
    }
    // Each key was tried beside `version = 1`: a missing one is its own error.
    if !table.contains_key("version") {
        let message = "missing field `version`".to_string();
        found.push((String::new(), message.clone(), classify(&message)));
    }
    if found.is_empty() {
        found.push(first);
    }
    found.dedup();
    let mut errors: Vec<PolicyError> = found
        .into_iter()
        .map(|e| policy_error(sources, path, e))
        .collect();
    // In the order of the file, as a reader goes through it.
    errors.sort_by_key(|e| (e.location.line, e.location.column));
    Err(PolicyErrors(errors))
}

/// A type error: key path, message, kind.
type TypeError = (String, String, ErrorKind);

/// The errors of `key` (or `key.sub`) alone, beside `version = 1`; for an
/// array, of each item alone, with its own index.
fn errors_of(key: &str, sub: Option<&str>, value: &toml::Value) -> Vec<TypeError> {
    let alone = |value: toml::Value| {
        let mut table = toml::Table::new();
        if key != "version" {
            table.insert("version".into(), toml::Value::Integer(1));
        }
        let value = match sub {
            Some(sub) => toml::Value::Table(toml::Table::from_iter([(sub.to_string(), value)])),
            None => value,
        };
        table.insert(key.to_string(), value);
        type_error(toml::Value::Table(table))
    };
    let Some(error) = alone(value.clone()) else {
        return Vec::new();
    };
    let toml::Value::Array(items) = value else {
        return vec![error];
    };
    let array_path = match sub {
        Some(sub) => join_key(key, sub),
        None => key.to_string(),
    };
    let first_item = join_index(&array_path, 0);
    let per_item: Vec<TypeError> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| {
            let (key_path, message, kind) = alone(toml::Value::Array(vec![item.clone()]))?;
            let key_path = match key_path.strip_prefix(&first_item) {
                Some(rest) => format!("{}{rest}", join_index(&array_path, i)),
                None => key_path,
            };
            Some((key_path, message, kind))
        })
        .collect();
    if per_item.is_empty() {
        vec![error]
    } else {
        per_item
    }
}

fn type_error(value: toml::Value) -> Option<TypeError> {
    serde_path_to_error::deserialize::<_, Policy>(value)
        .err()
        .map(|e| describe(&e))
}

fn describe(err: &serde_path_to_error::Error<toml::de::Error>) -> TypeError {
    let mut key_path = key_path_of(err.path());
    let message = err.inner().message().trim().to_string();
    let kind = classify(&message);
    if kind == ErrorKind::UnknownKey
        && let Some(name) = quoted(&message)
        && !key_path.ends_with(name)
    {
        key_path = join_key(&key_path, name);
    }
    (key_path, message, kind)
}

fn policy_error(
    sources: &SourceMap,
    path: &Path,
    (key_path, message, kind): TypeError,
) -> PolicyError {
    let location = sources
        .lookup(&key_path)
        .cloned()
        .unwrap_or_else(|| Location::start_of(path));
    PolicyError::new(kind, location, key_path, message)
}
