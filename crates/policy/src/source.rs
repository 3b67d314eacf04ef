//! TOML sources with positions: every key path of a document is mapped to the
//! file, line and column where it was written, so that errors and `check`
//! findings can point at the exact place a reviewer has to look.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};

use crate::error::{ErrorKind, PolicyError};
use crate::location::Location;

/// Key path (`filesystem.binds[2].source`) to the location of that key.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    entries: BTreeMap<String, Location>,
}

impl SourceMap {
    /// The location of `key_path`, or of its nearest ancestor that has one.
    pub fn lookup(&self, key_path: &str) -> Option<&Location> {
        let mut path = key_path;
        loop {
            if let Some(location) = self.entries.get(path) {
                return Some(location);
            }
            path = parent_path(path)?;
        }
    }

    /// Later sources win: used when a policy overrides what it extends.
    /// Entries below an overridden array or value are replaced as a whole.
    pub fn overlay(&mut self, other: SourceMap, replaced_prefixes: &[String]) {
        self.entries.retain(|path, _| {
            !replaced_prefixes
                .iter()
                .any(|prefix| is_same_or_below(path, prefix))
        });
        self.entries.extend(other.entries);
    }

    /// The entries of array `from`'s items, moved to array `to` from index
    /// `offset` on (`from[1].source` -> `to[offset + 1].source`); `from`
    /// itself is dropped.
    pub fn move_array_items(&mut self, from: &str, to: &str, offset: usize) {
        let items = format!("{from}[");
        let moved: Vec<(String, Location)> = self
            .entries
            .iter()
            .filter(|(path, _)| path.starts_with(&items) || path.as_str() == from)
            .map(|(path, location)| (path.clone(), location.clone()))
            .collect();
        for (path, location) in moved {
            self.entries.remove(&path);
            let Some(rest) = path.strip_prefix(&items) else {
                continue;
            };
            let Some((index, tail)) = rest.split_once(']') else {
                continue;
            };
            if let Ok(index) = index.parse::<usize>() {
                let new_path = format!("{to}[{}]{tail}", offset + index);
                self.entries.insert(new_path, location);
            }
        }
    }

    fn insert(&mut self, key_path: String, location: Location) {
        self.entries.insert(key_path, location);
    }
}

fn is_same_or_below(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('.') || rest.starts_with('['),
        None => false,
    }
}

/// `a.b[3].c` -> `a.b[3]` -> `a.b` -> `a` -> None.
pub fn parent_path(path: &str) -> Option<&str> {
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

/// Appends a table key to a key path, quoting keys that are not bare TOML keys.
pub fn join_key(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

pub fn join_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// Parses one TOML document into a plain table plus the positions of its keys.
pub fn parse_toml(file: &Path, text: &str) -> Result<(toml::Table, SourceMap), PolicyError> {
    // One parse: the positions are read off the parsed document, which then
    // becomes the table (the launcher parses a policy on every launch).
    let spanned = DeTable::parse(text).map_err(|err| syntax_error(file, text, &err))?;
    let lines = LineIndex::new(text);
    let mut map = SourceMap::default();
    record_table(spanned.get_ref(), "", file, &lines, &mut map);
    let table = toml::Table::deserialize(toml::de::Deserializer::from(spanned))
        .map_err(|err| syntax_error(file, text, &err))?;
    Ok((table, map))
}

fn syntax_error(file: &Path, text: &str, err: &toml::de::Error) -> PolicyError {
    let offset = err.span().map(|span| span.start).unwrap_or(0);
    let location = LineIndex::new(text).location(file, offset);
    PolicyError::new(
        ErrorKind::Syntax,
        location,
        "",
        err.message().trim().to_string(),
    )
}

fn record_table(
    table: &DeTable<'_>,
    prefix: &str,
    file: &Path,
    lines: &LineIndex,
    map: &mut SourceMap,
) {
    for (key, value) in table.iter() {
        let path = join_key(prefix, key.get_ref());
        map.insert(path.clone(), lines.location(file, key.span().start));
        record_value(value.get_ref(), &path, file, lines, map);
    }
}

fn record_value(
    value: &DeValue<'_>,
    path: &str,
    file: &Path,
    lines: &LineIndex,
    map: &mut SourceMap,
) {
    match value {
        DeValue::Table(table) => record_table(table, path, file, lines, map),
        DeValue::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let item_path = join_index(path, index);
                map.insert(item_path.clone(), lines.location(file, item.span().start));
                record_value(item.get_ref(), &item_path, file, lines, map);
            }
        }
        _ => {}
    }
}

/// Byte offsets to 1-based line and column (columns count characters).
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { text, starts }
    }

    pub(crate) fn location(&self, file: &Path, offset: usize) -> Location {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&start| start <= offset);
        let start = self
            .starts
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(0);
        let column = self
            .text
            .get(start..offset)
            .map(|s| s.chars().count())
            .unwrap_or(0);
        Location {
            file: file.to_path_buf(),
            line: line.max(1),
            column: column + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_nested_keys_and_array_items_to_lines() {
        let text = "version = 1\n[filesystem]\nbinds = [\n  { source = \"/usr\" },\n  { source = \"/etc\" },\n]\n";
        let (_, map) = parse_toml(Path::new("p.toml"), text).unwrap();
        let at = |p: &str| {
            let l = map.lookup(p).unwrap();
            (l.line, l.column)
        };
        assert_eq!(at("version"), (1, 1));
        assert_eq!(at("filesystem"), (2, 2));
        assert_eq!(at("filesystem.binds[1].source"), (5, 5));
        // An absent key falls back to its nearest written ancestor.
        assert_eq!(at("filesystem.binds[1].mode"), (5, 3));
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let err = parse_toml(Path::new("p.toml"), "version = 1\nname = \n").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Syntax);
        assert_eq!((err.location.line, err.location.column), (2, 8));
    }

    #[test]
    fn parent_paths() {
        assert_eq!(parent_path("a.b[3].c"), Some("a.b[3]"));
        assert_eq!(parent_path("a.b[3]"), Some("a.b"));
        assert_eq!(parent_path("a"), None);
        assert_eq!(join_key("env.set", "A.B"), "env.set.\"A.B\"");
    }
}
