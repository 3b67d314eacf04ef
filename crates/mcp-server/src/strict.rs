//! Whether a line is JSON the broker's gate reads the same way: the gate
//! refuses duplicate object keys at any depth (parsers disagree on which
//! one wins), while `serde_json::Value` keeps the last. A line with them
//! cannot be mirrored by the relay (it would wait for an answer to an id
//! the gate never reads): the relay answers it itself.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value walked for duplicate keys, its contents not kept.
struct Unique;

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON without duplicate keys")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key) {
                return Err(de::Error::custom("duplicate key"));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

/// The most values one message may hold (a tool call's arguments are a
/// few dozen): a 4 MiB `[0,0,0,...]` would otherwise be two million
/// values. The broker's gate refuses a line of more (id null, before it
/// reads the id); the failover relay answers such a line itself.
pub const MAX_VALUES: usize = 65_536;

/// Whether `text` holds more than `max` values, by its structure outside
/// strings: each value but the first follows a `,`, `[`, or `:`. The
/// gate's count and the relay's are this one.
pub fn value_count_over(text: &[u8], max: usize) -> bool {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &byte in text {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b',' | b'[' | b':' => {
                count += 1;
                if count > max {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Whether `line` is JSON with an object that repeats a key (at any
/// depth). False for JSON without, and for what is not JSON at all.
pub fn repeats_a_key(line: &[u8]) -> bool {
    // Read as the relay reads it (`Value`: strings must be UTF-8), so the
    // two readings differ in the repeated keys only.
    serde_json::from_slice::<serde_json::Value>(line).is_ok()
        && serde_json::from_slice::<Unique>(line).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_found_at_any_depth() {
        assert!(repeats_a_key(br#"{"id":1,"id":2,"method":"x"}"#));
        assert!(repeats_a_key(
            br#"{"id":1,"method":"x","params":[{"a":1,"a":2}]}"#
        ));
        assert!(!repeats_a_key(
            br#"{"id":1,"method":"x","params":{"a":{"a":1}}}"#
        ));
        assert!(!repeats_a_key(b"not json"));
        assert!(!repeats_a_key(br#"{"id":1,"#));
        // Not UTF-8 in a string: not JSON to either reading.
        assert!(!repeats_a_key(b"\"a\xf1b\""));
    }
}
