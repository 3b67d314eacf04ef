//! One turn's output, folded event by event into what the broker keeps:
//! the session id, the final text or error, the tool calls, and what was
//! odd about the stream (unknown events and fields, malformed lines).

use serde::Serialize;

use crate::events::{Line, StreamEvent, cut};

/// At most this many odd lines are kept per turn (the count is exact).
pub const KEEP_NOTES: usize = 20;
/// At most this many reported tool calls are kept per turn (the count is
/// exact).
pub const KEEP_CALLS: usize = 50;
/// Each kept call's arguments and output: their first bytes.
pub const KEEP_EXCERPT: usize = crate::events::MALFORMED_KEEP;

/// A tool call the CLI reported (its own tools and the relay's alike):
/// what the model asked and the start of what it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportedCall {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The arguments as JSON text, at most `KEEP_EXCERPT` bytes.
    pub arguments: String,
    /// Once it completed: the start of its output, and whether it failed.
    pub output: Option<String>,
    pub is_error: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Transcript {
    pub session_id: Option<String>,
    pub model: Option<String>,
    /// Deltas joined, for a stream that ends without a final message.
    pub partial: String,
    pub final_text: Option<String>,
    pub result: Option<Finish>,
    /// Tool calls the agent reported (`tool_call` events), in order.
    pub tool_calls: Vec<ReportedCall>,
    pub tool_calls_total: usize,
    /// Tokens used, when the CLI reports them.
    pub tokens: Option<Tokens>,
    /// Unknown event kinds, malformed lines and unknown fields, in order.
    pub notes: Vec<String>,
    pub notes_total: usize,
    pub events: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finish {
    pub is_error: bool,
    pub text: String,
}

/// How the turn ended, as the broker acts on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TurnEnd {
    /// A result event without `is_error`: its text is the turn's answer.
    Success { text: String },
    /// A result event with `is_error`: its text is the error.
    Error { message: String },
    /// The stream ended without a result event.
    NoResult,
}

impl Transcript {
    pub fn push(&mut self, line: Line) {
        match line {
            Line::Blank => {}
            Line::Malformed { excerpt, error } => {
                self.note(format!("malformed line ({error}): {excerpt}"));
            }
            Line::Event(event) => {
                self.events += 1;
                self.event(event);
            }
            Line::Events(events) => {
                for event in events {
                    self.events += 1;
                    self.event(event);
                }
            }
        }
    }

    fn event(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::SystemInit {
                session_id,
                model,
                extra,
                ..
            } => {
                // An empty id names no session: resuming it could only fail.
                self.session_id = Some(session_id).filter(|s| !s.is_empty());
                self.model = model;
                self.unknown_fields(
                    "system/init",
                    extra.keys(),
                    &["apiKeySource", "permissionMode"],
                );
            }
            StreamEvent::User { extra, .. } => {
                self.unknown_fields("user", extra.keys(), &["session_id"]);
            }
            StreamEvent::AssistantDelta { text, extra, .. } => {
                self.partial.push_str(&text);
                self.unknown_fields("assistant", extra.keys(), &["session_id"]);
            }
            StreamEvent::AssistantFinal { text, extra } => {
                self.final_text = Some(text);
                self.unknown_fields("assistant", extra.keys(), &["session_id"]);
            }
            StreamEvent::ToolCall {
                subtype,
                call_id,
                extra,
            } => match subtype.as_str() {
                "started" => self.call_started(call_id, &extra),
                "completed" => self.call_completed(call_id.as_deref(), &extra),
                other => self.note(format!("tool call event `{other}`")),
            },
            StreamEvent::Result {
                is_error,
                result,
                session_id,
                extra,
                ..
            } => {
                if self.session_id.is_none() {
                    self.session_id = session_id.filter(|s| !s.is_empty());
                }
                self.result = Some(Finish {
                    is_error,
                    text: result,
                });
                self.unknown_fields("result", extra.keys(), &["duration_api_ms", "request_id"]);
            }
            StreamEvent::Usage {
                input_tokens,
                output_tokens,
            } => {
                self.tokens = Some(Tokens {
                    input: input_tokens,
                    output: output_tokens,
                });
            }
            StreamEvent::Unknown { kind, .. } => self.note(format!("unknown event `{kind}`")),
        }
    }

    fn call_started(&mut self, id: Option<String>, extra: &crate::events::Extra) {
        self.tool_calls_total += 1;
        if self.tool_calls.len() >= KEEP_CALLS {
            return;
        }
        let call = extra.get("tool_call");
        let inner = call.and_then(|c| c.as_object()?.values().next());
        // cursor-agent nests them: `{"args": {"name": N, "args": {...}}}`.
        let args = inner.and_then(|i| i.get("args"));
        let arguments = args
            .and_then(|a| a.get("name").and(a.get("args")))
            .or(args)
            .map(|a| cut(&a.to_string(), KEEP_EXCERPT))
            .unwrap_or_default();
        self.tool_calls.push(ReportedCall {
            name: call
                .and_then(tool_name)
                .unwrap_or_else(|| "(unnamed)".into()),
            id,
            arguments,
            output: None,
            is_error: None,
        });
    }

    /// The completion goes to the open call with its id (or, without ids,
    /// the last open one); a completion of no kept call is dropped.
    fn call_completed(&mut self, id: Option<&str>, extra: &crate::events::Extra) {
        let open = self
            .tool_calls
            .iter_mut()
            .rev()
            .filter(|c| c.output.is_none())
            .find(|c| id.is_none() || c.id.as_deref() == id);
        let Some(call) = open else { return };
        let output = match extra.get("output") {
            Some(serde_json::Value::String(text)) => text.clone(),
            // cursor-agent: the result inside its tool_call object.
            _ => extra
                .get("tool_call")
                .and_then(|c| c.as_object()?.values().next()?.get("result").cloned())
                .map(|r| r.to_string())
                .unwrap_or_default(),
        };
        call.output = Some(cut(&output, KEEP_EXCERPT));
        call.is_error = Some(
            extra
                .get("is_error")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        );
    }

    fn unknown_fields<'a>(
        &mut self,
        kind: &str,
        fields: impl Iterator<Item = &'a String>,
        documented: &[&str],
    ) {
        let unknown: Vec<&str> = fields
            .map(String::as_str)
            .filter(|f| !documented.contains(f))
            .collect();
        if !unknown.is_empty() {
            self.note(format!(
                "`{kind}` event with unknown fields: {}",
                unknown.join(", ")
            ));
        }
    }

    fn note(&mut self, note: String) {
        self.notes_total += 1;
        if self.notes.len() < KEEP_NOTES {
            self.notes.push(note);
        }
    }

    /// The turn's outcome: the result event decides; without one the turn
    /// has no answer even if assistant text was streamed.
    pub fn end(&self) -> TurnEnd {
        match &self.result {
            Some(Finish {
                is_error: false,
                text,
            }) => TurnEnd::Success {
                // cursor-agent's result repeats the final text; fall back to
                // it (then to the deltas) when a result comes without one.
                text: if text.is_empty() {
                    self.final_text
                        .clone()
                        .unwrap_or_else(|| self.partial.clone())
                } else {
                    text.clone()
                },
            },
            Some(Finish {
                is_error: true,
                text,
            }) => TurnEnd::Error {
                message: text.clone(),
            },
            None => TurnEnd::NoResult,
        }
    }
}

/// `{"mcpToolCall": {"name": ...}}` or any `{"<kind>": {"name"|"tool": ...}}`.
fn tool_name(call: &serde_json::Value) -> Option<String> {
    let inner = call.as_object()?.values().next()?;
    let name = inner
        .get("name")
        .or_else(|| inner.get("args").and_then(|a| a.get("name")))?;
    name.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::parse_line;

    fn fold(stream: &str) -> Transcript {
        let mut t = Transcript::default();
        for line in stream.lines() {
            t.push(parse_line(line));
        }
        t
    }

    #[test]
    fn recorded_success_with_partial_deltas() {
        let t = fold(include_str!("../tests/streams/success_partial.jsonl"));
        assert_eq!(
            t,
            Transcript {
                session_id: Some("7f1c2b8e-7d3a-4c55-9d0e-2f4b8a6c1e90".into()),
                model: Some("Claude 4.6 Sonnet".into()),
                partial: "The README explains setup.".into(),
                final_text: Some("The README explains setup.".into()),
                result: Some(Finish {
                    is_error: false,
                    text: "The README explains setup.".into()
                }),
                tool_calls: vec![],
                tool_calls_total: 0,
                tokens: None,
                notes: vec![],
                notes_total: 0,
                events: 6,
            }
        );
        assert_eq!(
            t.end(),
            TurnEnd::Success {
                text: "The README explains setup.".into()
            }
        );
    }

    /// Found by scripts/nemesis (seed 3): a CLI that could not create its
    /// session (the disk full) reported `"session_id": ""` in its error
    /// result; kept, every later turn resumed "" and failed, the agent
    /// failed again after each resume.
    #[test]
    fn an_empty_session_id_is_no_session() {
        let t = fold(concat!(
            r#"{"type":"result","subtype":"error","is_error":true,"result":"session store: disk full","session_id":""}"#,
            "\n"
        ));
        assert_eq!(t.session_id, None);
        let t = fold(concat!(
            r#"{"type":"system","subtype":"init","session_id":"","model":"m","cwd":"/w","apiKeySource":"login","permissionMode":"default"}"#,
            "\n",
            r#"{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s2"}"#,
            "\n"
        ));
        assert_eq!(t.session_id.as_deref(), Some("s2"));
    }

    #[test]
    fn recorded_error_result() {
        let t = fold(include_str!("../tests/streams/error_result.jsonl"));
        assert_eq!(
            t.session_id.as_deref(),
            Some("a3e0f9d2-5b1c-4e7a-8f6d-0c9b8a7e6d5c")
        );
        assert_eq!(
            t.end(),
            TurnEnd::Error {
                message: "Rate limit exceeded for model gpt-5".into()
            }
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
    }

    #[test]
    fn recorded_odd_lines_are_noted_and_the_turn_still_ends() {
        let t = fold(include_str!("../tests/streams/odd_lines.jsonl"));
        assert_eq!(
            t.tool_calls,
            [ReportedCall {
                name: "check_inbox".into(),
                id: Some("t1".into()),
                arguments: "{}".into(),
                output: Some(
                    r#"{"success":{"content":[{"text":{"text":"{\"messages\":[]}"}}]}}"#.into()
                ),
                is_error: Some(false),
            }]
        );
        assert_eq!(t.tool_calls_total, 1);
        assert_eq!(
            t.notes,
            [
                "`system/init` event with unknown fields: mcpServers",
                "unknown event `thinking/delta`",
                "malformed line (EOF while parsing an object at line 1 column 103): {\"type\":\"assistant\",\"message\":{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Inbox is empty.\"}]}",
                "malformed line (expected ident at line 1 column 2): not json at all",
            ]
        );
        assert_eq!(t.notes_total, 4);
        assert_eq!(t.events, 6);
        assert_eq!(
            t.end(),
            TurnEnd::Success {
                text: "Inbox is empty.".into()
            }
        );
    }

    #[test]
    fn recorded_stream_cut_mid_line_has_no_result() {
        let t = fold(include_str!("../tests/streams/crashed.jsonl"));
        assert_eq!(t.partial, "Working on");
        assert_eq!(t.end(), TurnEnd::NoResult);
        assert_eq!(t.notes_total, 1);
        assert!(
            t.notes[0].starts_with("malformed line (EOF while parsing"),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn notes_are_bounded_but_counted() {
        let stream = "x\n".repeat(KEEP_NOTES + 5);
        let t = fold(&stream);
        assert_eq!(t.notes.len(), KEEP_NOTES);
        assert_eq!(t.notes_total, KEEP_NOTES + 5);
    }
}
