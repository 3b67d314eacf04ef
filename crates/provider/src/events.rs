//! The events every provider's stream is read into, and cursor-agent's
//! `--output-format stream-json` (seed 002), whose shapes they follow: one
//! JSON object per line. Each line becomes typed events; fields the types
//! do not name are kept in `extra`, event types we do not know are kept
//! whole, and a line that is not a JSON object is reported as malformed.
//! Nothing here panics on input.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest line kept verbatim in a malformed-line report.
pub const MALFORMED_KEEP: usize = 200;

/// Fields of an event that its type does not name.
pub type Extra = BTreeMap<String, Value>;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StreamEvent {
    /// `system`/`init`: the session id this turn runs in.
    SystemInit {
        session_id: String,
        model: Option<String>,
        cwd: Option<String>,
        extra: Extra,
    },
    /// The echo of the prompt.
    User { text: String, extra: Extra },
    /// A partial delta (`--stream-partial-output`): has `timestamp_ms`.
    AssistantDelta {
        text: String,
        timestamp_ms: u64,
        extra: Extra,
    },
    /// The final assistant message: no `timestamp_ms`.
    AssistantFinal { text: String, extra: Extra },
    /// A tool call starting or completing (cursor-agent emits these; seed
    /// 002 does not list them, so everything but the names stays in `extra`).
    ToolCall {
        subtype: String,
        call_id: Option<String>,
        extra: Extra,
    },
    /// The end of the turn.
    Result {
        is_error: bool,
        result: String,
        subtype: Option<String>,
        duration_ms: Option<u64>,
        session_id: Option<String>,
        extra: Extra,
    },
    /// An error or a retry the CLI reported on its way (Claude Code's
    /// `system`/`api_retry`, Codex's `error` events and items, Gemini CLI's
    /// `error` events): not the turn's end, but why it may come to one.
    Problem { retry: bool, message: String },
    /// Tokens the turn used, as the CLI counts them.
    Usage {
        input_tokens: u64,
        output_tokens: u64,
    },
    /// A well-formed event of a type (or `system` subtype) we do not know.
    Unknown { kind: String, raw: Value },
}

impl StreamEvent {
    /// A tool call starting, in the shape cursor-agent reports it.
    pub fn tool_started(call_id: Option<String>, name: &str, arguments: Value) -> Self {
        let mut extra = Extra::new();
        extra.insert(
            "tool_call".into(),
            serde_json::json!({"mcpToolCall": {"name": name, "args": arguments}}),
        );
        StreamEvent::ToolCall {
            subtype: "started".into(),
            call_id,
            extra,
        }
    }

    /// A tool call's end, with the start of its output.
    pub fn tool_completed(call_id: Option<String>, is_error: bool, output: &str) -> Self {
        let mut extra = Extra::new();
        extra.insert("is_error".into(), Value::Bool(is_error));
        extra.insert("output".into(), Value::String(cut(output, MALFORMED_KEEP)));
        StreamEvent::ToolCall {
            subtype: "completed".into(),
            call_id,
            extra,
        }
    }
}

/// What one stdout line was.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "line", rename_all = "snake_case")]
pub enum Line {
    Event(StreamEvent),
    /// A line that carries several events (a message with several blocks).
    Events(Vec<StreamEvent>),
    /// Not a JSON object, or a known type with fields of the wrong shape.
    Malformed {
        /// The start of the line (at most `MALFORMED_KEEP` bytes, whole chars).
        excerpt: String,
        error: String,
    },
    Blank,
}

#[derive(Deserialize)]
struct Content {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: String,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Vec<Content>,
}

impl Message {
    /// The text blocks joined; other block kinds (tool use...) carry no text.
    fn text(&self) -> String {
        self.content
            .iter()
            .filter(|c| c.kind == "text")
            .map(|c| c.text.as_str())
            .collect()
    }
}

#[derive(Deserialize)]
struct Init {
    session_id: String,
    model: Option<String>,
    cwd: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct Said {
    message: Message,
    timestamp_ms: Option<u64>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct ToolCall {
    subtype: String,
    call_id: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

#[derive(Deserialize)]
struct Finished {
    is_error: bool,
    #[serde(default)]
    result: String,
    subtype: Option<String>,
    duration_ms: Option<u64>,
    session_id: Option<String>,
    #[serde(flatten)]
    extra: Extra,
}

/// One line as a JSON object with its string `type` taken out; a blank
/// line, or the report of a malformed one, otherwise.
pub fn typed_object(line: &str) -> Result<(String, serde_json::Map<String, Value>), Line> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Err(Line::Blank);
    }
    let malformed = |error: String| Line::Malformed {
        excerpt: excerpt(line),
        error,
    };
    let mut object = match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(map)) => map,
        Ok(other) => {
            return Err(malformed(format!(
                "not a JSON object but {}",
                kind_of(&other)
            )));
        }
        Err(e) => return Err(malformed(e.to_string())),
    };
    match object.remove("type") {
        Some(Value::String(kind)) => Ok((kind, object)),
        _ => Err(malformed("no string `type` field".into())),
    }
}

/// A well-formed line of a shape the parser did not expect.
pub fn misshapen(line: &str, kind: &str, error: impl std::fmt::Display) -> Line {
    Line::Malformed {
        excerpt: excerpt(line.trim_end_matches(['\r', '\n'])),
        error: format!("`{kind}` event: {error}"),
    }
}

/// Parses one line of cursor-agent's stream-json output.
pub fn parse_line(line: &str) -> Line {
    let (kind, object) = match typed_object(line) {
        Ok(typed) => typed,
        Err(line) => return line,
    };
    let malformed = |error: String| Line::Malformed {
        excerpt: excerpt(line.trim_end_matches(['\r', '\n'])),
        error,
    };
    let subtype = object
        .get("subtype")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let raw = Value::Object(object);
    let typed = match (kind.as_str(), subtype.as_deref()) {
        ("system", Some("init")) => typed::<Init>(raw.clone()).map(|mut e| {
            e.extra.remove("subtype");
            StreamEvent::SystemInit {
                session_id: e.session_id,
                model: e.model,
                cwd: e.cwd,
                extra: e.extra,
            }
        }),
        ("user", _) => typed::<Said>(raw.clone()).map(|e| StreamEvent::User {
            text: e.message.text(),
            extra: e.extra,
        }),
        ("assistant", _) => typed::<Said>(raw.clone()).map(|e| match e.timestamp_ms {
            Some(timestamp_ms) => StreamEvent::AssistantDelta {
                text: e.message.text(),
                timestamp_ms,
                extra: e.extra,
            },
            None => StreamEvent::AssistantFinal {
                text: e.message.text(),
                extra: e.extra,
            },
        }),
        ("tool_call", _) => typed::<ToolCall>(raw.clone()).map(|e| StreamEvent::ToolCall {
            subtype: e.subtype,
            call_id: e.call_id,
            extra: e.extra,
        }),
        ("result", _) => typed::<Finished>(raw.clone()).map(|e| StreamEvent::Result {
            is_error: e.is_error,
            result: e.result,
            subtype: e.subtype,
            duration_ms: e.duration_ms,
            session_id: e.session_id,
            extra: e.extra,
        }),
        _ => {
            let kind = match subtype {
                Some(sub) => format!("{kind}/{sub}"),
                None => kind,
            };
            return Line::Event(StreamEvent::Unknown { kind, raw });
        }
    };
    match typed {
        Ok(event) => Line::Event(event),
        Err(e) => malformed(format!("`{kind}` event: {e}")),
    }
}

fn typed<T: serde::de::DeserializeOwned>(raw: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(raw)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first `MALFORMED_KEEP` bytes of `line`, cut at a char boundary.
fn excerpt(line: &str) -> String {
    cut(line, MALFORMED_KEEP)
}

/// At most `max` bytes of `text`, cut at a char boundary.
pub fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn seed_shapes_become_typed_events() {
        let init = r#"{"type":"system","subtype":"init","apiKeySource":"login","cwd":"/w","session_id":"s1","model":"Claude 4.6 Sonnet","permissionMode":"default"}"#;
        let mut extra = Extra::new();
        extra.insert("apiKeySource".into(), json!("login"));
        extra.insert("permissionMode".into(), json!("default"));
        assert_eq!(
            parse_line(init),
            Line::Event(StreamEvent::SystemInit {
                session_id: "s1".into(),
                model: Some("Claude 4.6 Sonnet".into()),
                cwd: Some("/w".into()),
                extra,
            })
        );
        let delta = r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"del"},{"type":"text","text":"ta"}]},"session_id":"s1","timestamp_ms":1772104286759}"#;
        let mut extra = Extra::new();
        extra.insert("session_id".into(), json!("s1"));
        assert_eq!(
            parse_line(delta),
            Line::Event(StreamEvent::AssistantDelta {
                text: "delta".into(),
                timestamp_ms: 1772104286759,
                extra: extra.clone(),
            })
        );
        let last = r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"full"}]},"session_id":"s1"}"#;
        assert_eq!(
            parse_line(last),
            Line::Event(StreamEvent::AssistantFinal {
                text: "full".into(),
                extra,
            })
        );
        let failed = r#"{"type":"result","subtype":"error","duration_ms":5,"is_error":true,"result":"quota","session_id":"s1","request_id":"r"}"#;
        let mut extra = Extra::new();
        extra.insert("request_id".into(), json!("r"));
        assert_eq!(
            parse_line(failed),
            Line::Event(StreamEvent::Result {
                is_error: true,
                result: "quota".into(),
                subtype: Some("error".into()),
                duration_ms: Some(5),
                session_id: Some("s1".into()),
                extra,
            })
        );
    }

    #[test]
    fn unknown_types_and_fields_are_kept() {
        assert_eq!(
            parse_line(r#"{"type":"thinking","text":"hm"}"#),
            Line::Event(StreamEvent::Unknown {
                kind: "thinking".into(),
                raw: json!({"text": "hm"}),
            })
        );
        assert_eq!(
            parse_line(r#"{"type":"system","subtype":"compact","n":1}"#),
            Line::Event(StreamEvent::Unknown {
                kind: "system/compact".into(),
                raw: json!({"subtype": "compact", "n": 1}),
            })
        );
        let Line::Event(StreamEvent::User { extra, .. }) = parse_line(
            r#"{"type":"user","message":{"role":"user","content":[]},"session_id":"s","new_field":[1]}"#,
        ) else {
            panic!("a user event");
        };
        assert_eq!(extra.get("new_field"), Some(&json!([1])));
    }

    #[test]
    fn malformed_lines_are_reported_not_fatal() {
        let cases = [
            ("{\"type\":\"result\"", "EOF while parsing"),
            ("[1,2]", "not a JSON object but an array"),
            ("{\"kind\":1}", "no string `type` field"),
            (
                "{\"type\":\"result\",\"is_error\":\"yes\"}",
                "`result` event:",
            ),
            (
                "{\"type\":\"system\",\"subtype\":\"init\"}",
                "missing field `session_id`",
            ),
        ];
        for (line, wanted) in cases {
            match parse_line(line) {
                Line::Malformed { excerpt, error } => {
                    assert_eq!(excerpt, line);
                    assert!(error.contains(wanted), "{line}: {error}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        assert_eq!(parse_line("  \r\n"), Line::Blank);
        let long = format!("é{}", "x".repeat(300));
        let Line::Malformed { excerpt, .. } = parse_line(&long) else {
            panic!("malformed");
        };
        assert_eq!(excerpt.len(), MALFORMED_KEEP);
    }
}
