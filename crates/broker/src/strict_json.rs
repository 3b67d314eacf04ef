//! JSON parsing that refuses duplicate object keys at any depth. JSON
//! parsers disagree on them (first wins, last wins, error), so a line one
//! reader accepts could mean something else to the next one (rmcp drops
//! such lines without answering). The gate judges with this parser.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

struct Strict(Value);

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON without duplicate keys")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

/// The most values one message may hold: the relay's (the failover relay
/// answers a line of more itself, so the two must agree).
pub use substrat_mcp_server::strict::MAX_VALUES;
use substrat_mcp_server::strict::value_count_over;

/// Parses one JSON text, refusing duplicate keys anywhere in it and texts
/// of more than MAX_VALUES values (counted before anything is built).
pub fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    if value_count_over(text.as_bytes(), MAX_VALUES) {
        return Err(de::Error::custom(format!(
            "more than {MAX_VALUES} values in one message"
        )));
    }
    serde_json::from_str::<Strict>(text).map(|s| s.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_refused_at_any_depth() {
        assert!(
            from_str(r#"{"id":1,"id":1}"#)
                .unwrap_err()
                .to_string()
                .contains("duplicate key `id`")
        );
        assert!(from_str(r#"{"params":{"a":1,"b":{"c":1,"c":2}}}"#).is_err());
        assert!(
            from_str(r#"[{"k":1},{"k":2}]"#).is_ok(),
            "the same key in different objects is fine"
        );
        assert_eq!(
            from_str(r#"{"a":[1,-2,3.5,"x",null,true]}"#).unwrap(),
            serde_json::json!({"a":[1,-2,3.5,"x",null,true]})
        );
        assert!(from_str("{").is_err() && from_str("1 2").is_err());
    }

    #[test]
    fn a_message_of_too_many_values_is_refused_before_it_is_built() {
        let many = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        // `[` then n-1 commas: n+1 counted (the array and its items).
        assert!(from_str(&many(MAX_VALUES - 1)).is_ok());
        let refused = from_str(&many(MAX_VALUES)).unwrap_err().to_string();
        assert!(refused.contains("more than 65536 values"), "{refused}");
        // Commas, brackets and colons inside strings are not values.
        let text = format!("{{\"a\":\"{}\"}}", ",[:\\\"".repeat(MAX_VALUES));
        assert!(from_str(&text).is_ok());
    }
}
