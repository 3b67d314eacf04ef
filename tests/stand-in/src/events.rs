//! cursor-agent's stream-json output: one JSON object per stdout line,
//! flushed per line. Structs keep the keys in cursor-agent's order.

use std::io::Write;

use serde::Serialize;
use serde_json::{Map, Value};

/// The largest partial-output chunk, in characters.
pub const CHUNK_CHARS: usize = 16;

#[derive(Serialize)]
struct Init<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    subtype: &'static str,
    #[serde(rename = "apiKeySource")]
    api_key_source: &'static str,
    cwd: &'a str,
    session_id: &'a str,
    model: &'a str,
    #[serde(rename = "permissionMode")]
    permission_mode: &'static str,
}

#[derive(Serialize)]
struct TextBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: [TextBlock<'a>; 1],
}

#[derive(Serialize)]
struct Said<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: Message<'a>,
    session_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp_ms: Option<u64>,
}

#[derive(Serialize)]
struct ToolCall<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    subtype: &'static str,
    call_id: &'a str,
    tool_call: McpToolCall<'a>,
    session_id: &'a str,
}

#[derive(Serialize)]
struct McpToolCall<'a> {
    #[serde(rename = "mcpToolCall")]
    call: CallBody<'a>,
}

#[derive(Serialize)]
struct CallBody<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<&'a Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a str>,
}

#[derive(Serialize)]
struct Outcome<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    subtype: &'static str,
    duration_ms: u64,
    duration_api_ms: u64,
    is_error: bool,
    result: &'a str,
    session_id: &'a str,
    request_id: &'a str,
}

/// The stdout event writer of one session.
#[derive(Debug, Clone)]
pub struct Events {
    pub session_id: String,
}

/// Writes one line to stdout and flushes it. A closed stdout is ignored:
/// the turn still runs to the end and stores its session.
pub fn raw_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn emit<T: Serialize>(event: &T) {
    match serde_json::to_string(event) {
        Ok(line) => raw_line(&line),
        Err(e) => eprintln!("stand-in: cannot encode an event: {e}"),
    }
}

impl Events {
    pub fn init(&self, cwd: &str, model: &str) {
        emit(&Init {
            kind: "system",
            subtype: "init",
            api_key_source: "stand-in",
            cwd,
            session_id: &self.session_id,
            model,
            permission_mode: "default",
        });
    }

    fn said(&self, kind: &'static str, text: &str, timestamp_ms: Option<u64>) {
        let role = kind;
        emit(&Said {
            kind,
            message: Message {
                role,
                content: [TextBlock { kind: "text", text }],
            },
            session_id: &self.session_id,
            timestamp_ms,
        });
    }

    pub fn user(&self, prompt: &str) {
        self.said("user", prompt, None);
    }

    /// The final assistant message (no timestamp_ms).
    pub fn assistant(&self, text: &str) {
        self.said("assistant", text, None);
    }

    /// The text in partial chunks of at most [`CHUNK_CHARS`] characters.
    pub fn partials(&self, text: &str) {
        for chunk in chunks(text, CHUNK_CHARS) {
            self.said("assistant", &chunk, Some(crate::session::now_ms()));
        }
    }

    pub fn tool_started(&self, call_id: &str, name: &str, args: &Map<String, Value>) {
        self.tool_call(
            "started",
            call_id,
            CallBody {
                name,
                args: Some(args),
                is_error: None,
                result: None,
            },
        );
    }

    pub fn tool_completed(&self, call_id: &str, name: &str, is_error: bool, result: &str) {
        self.tool_call(
            "completed",
            call_id,
            CallBody {
                name,
                args: None,
                is_error: Some(is_error),
                result: Some(result),
            },
        );
    }

    fn tool_call(&self, subtype: &'static str, call_id: &str, call: CallBody<'_>) {
        emit(&ToolCall {
            kind: "tool_call",
            subtype,
            call_id,
            tool_call: McpToolCall { call },
            session_id: &self.session_id,
        });
    }

    /// The closing result event.
    pub fn result(&self, is_error: bool, text: &str, duration_ms: u64) {
        let request_id = uuid::Uuid::new_v4().to_string();
        emit(&Outcome {
            kind: "result",
            subtype: if is_error { "error" } else { "success" },
            duration_ms,
            duration_api_ms: 0,
            is_error,
            result: text,
            session_id: &self.session_id,
            request_id: &request_id,
        });
    }
}

/// Splits `text` into pieces of at most `n` characters (never inside a character).
pub fn chunks(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_by_characters() {
        assert_eq!(chunks("abcdé", 2), vec!["ab", "cd", "é"]);
        assert_eq!(chunks("", 16), Vec::<String>::new());
    }

    #[test]
    fn event_shapes_keep_cursor_agents_key_order() {
        let line = serde_json::to_string(&Outcome {
            kind: "result",
            subtype: "success",
            duration_ms: 5,
            duration_api_ms: 0,
            is_error: false,
            result: "ok",
            session_id: "S",
            request_id: "R",
        })
        .unwrap();
        assert_eq!(
            line,
            r#"{"type":"result","subtype":"success","duration_ms":5,"duration_api_ms":0,"is_error":false,"result":"ok","session_id":"S","request_id":"R"}"#
        );
        let line = serde_json::to_string(&Said {
            kind: "assistant",
            message: Message {
                role: "assistant",
                content: [TextBlock {
                    kind: "text",
                    text: "hi",
                }],
            },
            session_id: "S",
            timestamp_ms: Some(7),
        })
        .unwrap();
        assert_eq!(
            line,
            r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"hi"}]},"session_id":"S","timestamp_ms":7}"#
        );
    }
}
