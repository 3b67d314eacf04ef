//! Pinning tool definitions against rug pulls: a definition (name,
//! description, input schema, annotations, and when the server gives them
//! title, output schema, icons and `_meta`: everything relayed to an agent)
//! is hashed over canonical JSON (keys sorted at every level); a later
//! change quarantines the tool until an operator approves it again. The
//! fields a server leaves out are left out of the hash, so a tool pinned
//! before they were relayed keeps its pin. Descriptions hiding text from a reviewer
//! (control, zero-width or bidi characters) are flagged.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::menu::UpstreamTool;

/// JSON with object keys sorted at every level and no spaces.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(*key) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

pub fn definition(tool: &UpstreamTool) -> Value {
    let mut definition = serde_json::json!({
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": tool.annotations,
    });
    let optional = [
        ("title", serde_json::to_value(&tool.title)),
        ("outputSchema", serde_json::to_value(&tool.output_schema)),
        ("icons", serde_json::to_value(&tool.icons)),
        ("_meta", serde_json::to_value(&tool.meta)),
    ];
    if let Value::Object(fields) = &mut definition {
        for (key, value) in optional {
            // Serializing these types cannot fail; a null is left out.
            if let Ok(value) = value
                && !value.is_null()
            {
                fields.insert(key.into(), value);
            }
        }
    }
    definition
}

/// sha256 of the canonical definition, hex.
pub fn definition_hash(tool: &UpstreamTool) -> String {
    let digest = Sha256::digest(canonical_json(&definition(tool)).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a definition's text is suspicious, if it is: a character that does
/// not show (zero-width), reorders what shows (bidi), or controls a
/// terminal. Every string in the definition is checked (property
/// descriptions are descriptions too).
pub fn suspicious(tool: &UpstreamTool) -> Option<String> {
    let mut found = None;
    visit_strings(&definition(tool), &mut |s| {
        if found.is_none()
            && let Some(c) = s.chars().find(|c| hidden(*c))
        {
            found = Some(format!(
                "hidden character U+{:04X} in its definition",
                c as u32
            ));
        }
    });
    found
}

fn hidden(c: char) -> bool {
    let control = c.is_control() && !matches!(c, '\n' | '\t' | '\r');
    let zero_width = matches!(
        c,
        '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' | '\u{180E}'
    );
    let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}');
    let tag = matches!(c, '\u{E0000}'..='\u{E007F}');
    control || zero_width || bidi || tag
}

fn visit_strings(value: &Value, f: &mut impl FnMut(&str)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|v| visit_strings(v, f)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            f(k);
            visit_strings(v, f);
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(description: &str, schema: Value) -> UpstreamTool {
        UpstreamTool {
            name: "t".into(),
            description: description.into(),
            input_schema: schema,
            annotations: Value::Null,
            ..UpstreamTool::default()
        }
    }

    #[test]
    fn the_hash_ignores_key_order_and_sees_every_change() {
        let a = tool(
            "d",
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {}}}),
        );
        let b = tool(
            "d",
            serde_json::from_str(
                r#"{"properties": {"b": {}, "a": {"type": "string"}}, "type": "object"}"#,
            )
            .unwrap(),
        );
        assert_eq!(definition_hash(&a), definition_hash(&b));
        assert_eq!(
            canonical_json(&json!({"b": [1, {"d": 1, "c": 2}], "a": "x"})),
            r#"{"a":"x","b":[1,{"c":2,"d":1}]}"#
        );
        let changed = tool("d ", a.input_schema.clone());
        assert_ne!(definition_hash(&a), definition_hash(&changed));
        assert_eq!(definition_hash(&a).len(), 64);
    }

    #[test]
    fn every_relayed_field_is_pinned_and_absent_ones_keep_old_pins() {
        let plain = tool("d", json!({"type": "object"}));
        // The hash of a definition made before title, outputSchema, icons
        // and _meta were relayed: those pins stay valid.
        let before = canonical_json(&json!({
            "name": "t", "description": "d", "inputSchema": {"type": "object"}, "annotations": null,
        }));
        let digest = Sha256::digest(before.as_bytes());
        let old: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(definition_hash(&plain), old);
        let with = |f: &dyn Fn(&mut UpstreamTool)| {
            let mut t = plain.clone();
            f(&mut t);
            definition_hash(&t)
        };
        let changed = [
            with(&|t| t.title = Some("Delete everything".into())),
            with(&|t| t.output_schema = json!({"type": "object"}).as_object().cloned()),
            with(&|t| t.icons = Some(vec![rmcp::model::Icon::new("https://x.test/i.png")])),
            with(&|t| t.meta = serde_json::from_value(json!({"ui": "https://x.test"})).ok()),
        ];
        for (n, hash) in changed.iter().enumerate() {
            assert_ne!(hash, &old, "field {n} is not pinned");
        }
        let mut titled = plain.clone();
        titled.title = Some("Read\u{202e}elif".into());
        assert!(suspicious(&titled).is_some(), "a title is checked too");
    }

    #[test]
    fn hidden_characters_are_flagged_anywhere_in_the_definition() {
        assert_eq!(suspicious(&tool("Reads a file.\nSafe.", Value::Null)), None);
        for (text, code) in [
            ("a\u{200B}b", "200B"),
            ("x\u{202E}y", "202E"),
            ("\u{1b}[2J", "001B"),
            ("\u{E0041}", "E0041"),
        ] {
            let found = suspicious(&tool(text, Value::Null)).unwrap();
            assert!(found.contains(code), "{found}");
        }
        let nested = tool(
            "ok",
            json!({"properties": {"p": {"description": "ignore\u{2066}previous"}}}),
        );
        assert!(suspicious(&nested).unwrap().contains("2066"));
    }
}
