//! One turn's output, folded event by event into what the broker keeps:
//! the session id, the final text or error, the tool calls, and what was
//! odd about the stream (unknown events and fields, malformed lines).

use std::collections::VecDeque;

use serde::Serialize;

use crate::events::{Line, StreamEvent, cut};

/// At most this many odd lines are kept per turn (the count is exact).
pub const KEEP_NOTES: usize = 20;
/// At most this many reported tool calls are kept per turn (the count is
/// exact).
pub const KEEP_CALLS: usize = 50;
/// Each kept call's arguments and output: their first bytes.
pub const KEEP_EXCERPT: usize = crate::events::MALFORMED_KEEP;
/// The CLI's errors and retries: the last this many are kept (the count
/// is exact), each at most `KEEP_EXCERPT` bytes.
pub const KEEP_PROBLEMS: usize = 10;
/// The last this many events are kept, each as a short line, for a turn
/// that ends without saying why (a timeout).
pub const KEEP_LAST_EVENTS: usize = 5;
/// What of an event its line in `last_events` shows, at most.
const EVENT_EXCERPT: usize = 120;

/// An error or a retry the CLI reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub retry: bool,
    pub message: String,
}

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
    /// The CLI's errors and retries, the last `KEEP_PROBLEMS`.
    pub problems: VecDeque<Problem>,
    pub problems_total: usize,
    /// Lines that could not be read (malformed, or cut at the line limit).
    pub unreadable: usize,
    /// Whether the last line that was not blank could not be read.
    pub ended_unreadable: bool,
    /// The last `KEEP_LAST_EVENTS` events, each a short line.
    pub last_events: VecDeque<String>,
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
    /// The answer could not be read: the stream's last line, or the only
    /// place an empty successful result could have its text, was
    /// malformed or over the line limit.
    Unreadable,
}

impl Transcript {
    pub fn push(&mut self, line: Line) {
        match line {
            Line::Blank => return,
            Line::Malformed { excerpt, error } => {
                self.unreadable += 1;
                self.remember(format!("unreadable line ({error})"));
                self.note(format!("malformed line ({error}): {excerpt}"));
                self.ended_unreadable = true;
                return;
            }
            Line::Event(event) => {
                self.events += 1;
                self.remember(summary(&event));
                self.event(event);
            }
            Line::Events(events) => {
                for event in events {
                    self.events += 1;
                    self.remember(summary(&event));
                    self.event(event);
                }
            }
        }
        self.ended_unreadable = false;
    }

    fn remember(&mut self, line: String) {
        if self.last_events.len() == KEEP_LAST_EVENTS {
            self.last_events.pop_front();
        }
        self.last_events.push_back(cut(&line, EVENT_EXCERPT));
    }

    fn problem(&mut self, retry: bool, message: &str) {
        self.problems_total += 1;
        if self.problems.len() == KEEP_PROBLEMS {
            self.problems.pop_front();
        }
        self.problems.push_back(Problem {
            retry,
            message: cut(message, KEEP_EXCERPT),
        });
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
                // The CLI's claim, kept no longer than a model name.
                self.model = model.map(|m| cut(&m, substrat_policy::model::MAX_MODEL_NAME));
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
            StreamEvent::Problem { retry, message } => self.problem(retry, &message),
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
        let end = self.end_by_result();
        match end {
            TurnEnd::NoResult if self.ended_unreadable => TurnEnd::Unreadable,
            TurnEnd::Success { text } if text.is_empty() && self.unreadable > 0 => {
                TurnEnd::Unreadable
            }
            end => end,
        }
    }

    fn end_by_result(&self) -> TurnEnd {
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

/// An event as one short line of `last_events`.
fn summary(event: &StreamEvent) -> String {
    let short = |text: &str| cut(text, EVENT_EXCERPT);
    match event {
        StreamEvent::SystemInit { .. } => "session started".into(),
        StreamEvent::User { .. } => "prompt".into(),
        StreamEvent::AssistantDelta { text, .. } | StreamEvent::AssistantFinal { text, .. } => {
            format!("assistant: {}", short(text))
        }
        StreamEvent::ToolCall { subtype, extra, .. } => {
            let name = extra.get("tool_call").and_then(tool_name);
            format!("tool call {subtype}: {}", name.as_deref().unwrap_or("-"))
        }
        StreamEvent::Result { is_error, .. } => format!("result (error: {is_error})"),
        StreamEvent::Usage { .. } => "usage".into(),
        StreamEvent::Problem { retry, message } => {
            let what = if *retry { "retry" } else { "error" };
            format!("{what}: {}", short(message))
        }
        StreamEvent::Unknown { kind, .. } => format!("event `{}`", short(kind)),
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
                last_events: [
                    "prompt",
                    "assistant: The README ",
                    "assistant: explains setup.",
                    "assistant: The README explains setup.",
                    "result (error: false)",
                ]
                .into_iter()
                .map(String::from)
                .collect(),
                ..Transcript::default()
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
        // Its last line could not be read (the broker tells a crash from
        // an unreadable answer by the exit status).
        assert_eq!(t.end(), TurnEnd::Unreadable);
        assert_eq!(t.unreadable, 1);
        assert_eq!(t.notes_total, 1);
        assert!(
            t.notes[0].starts_with("malformed line (EOF while parsing"),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn an_empty_success_after_an_unreadable_line_is_unreadable() {
        let t = fold(concat!(
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"#,
            "\n",
            r#"{"type":"result","subtype":"success","is_error":false,"result":""}"#,
            "\n"
        ));
        assert_eq!(t.end(), TurnEnd::Unreadable);
        // With its text read, the same result is the answer.
        let t = fold(concat!(
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"hi"}]}}"#,
            "\n",
            r#"{"type":"result","subtype":"success","is_error":false,"result":""}"#,
            "\n"
        ));
        assert_eq!(t.end(), TurnEnd::Success { text: "hi".into() });
        // A blank line after the unreadable one changes nothing.
        let t = fold("{\"type\":\"resu\n\n");
        assert_eq!(t.end(), TurnEnd::Unreadable);
    }

    #[test]
    fn claude_retries_are_kept_bounded_and_counted() {
        let retry = r#"{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"retry_delay_ms":1200,"error_status":529,"error":"overloaded","session_id":"s"}"#;
        let mut t = Transcript::default();
        for _ in 0..KEEP_PROBLEMS + 3 {
            t.push(crate::claude::parse_line(retry));
        }
        assert_eq!(t.problems_total, KEEP_PROBLEMS + 3);
        assert_eq!(t.problems.len(), KEEP_PROBLEMS);
        assert_eq!(
            t.problems[0],
            Problem {
                retry: true,
                message: "model request failed (529, overloaded); retry 2 of 10 in 1200 ms".into()
            }
        );
        assert_eq!(t.last_events.len(), KEEP_LAST_EVENTS);
        assert!(t.notes.is_empty(), "{:?}", t.notes);
    }

    #[test]
    fn notes_are_bounded_but_counted() {
        let stream = "x\n".repeat(KEEP_NOTES + 5);
        let t = fold(&stream);
        assert_eq!(t.notes.len(), KEEP_NOTES);
        assert_eq!(t.notes_total, KEEP_NOTES + 5);
    }

    #[test]
    fn the_model_a_cli_reports_is_cut_to_a_model_names_length() {
        let long = "m".repeat(10_000);
        let line =
            format!(r#"{{"type":"system","subtype":"init","session_id":"s","model":"{long}"}}"#);
        let kept = fold(&format!("{line}\n")).model.unwrap_or_default();
        assert_eq!(kept.len(), substrat_policy::model::MAX_MODEL_NAME);
    }
}
