//! Tokens used, read from a model's response as it streams through: the
//! server-sent events of a streaming call (their `data:` lines, each a JSON
//! object) or the whole JSON body of a plain one (an object, or an array
//! of them: Gemini's stream without `alt=sse`). The bytes are the model
//! API's; a line or body too long to hold is skipped, never buffered
//! without bound, and nothing here can fail the response.
//!
//! A reading is whole only when the answer said how much it used in the
//! form its API ends with (Anthropic's `message_delta`, OpenAI's final
//! `response.*`, Gemini's last chunk with a finish reason), or was an
//! error before any generation (nothing used). Anything else (an encoded
//! body, a line skipped, an answer cut short, an error after the answer
//! began) is partial, and the gateway counts it at the request's maximum.

use serde::Serialize;
use serde_json::Value;

use crate::api::Api;

/// The longest SSE line, and the largest plain JSON body, that is parsed.
pub const MAX_HELD: usize = 1 << 20;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The model the upstream says answered, when it says.
    pub model: Option<String>,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// What was read of an answer's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// All it used.
    Whole(Usage),
    /// What could be read, which may be less than it used.
    Partial(Usage),
}

/// How the response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    EventStream,
    Json,
    /// Compressed or otherwise encoded: not read.
    Encoded,
}

/// Where an answer is, as far as its usage goes.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Something other than an error came (the answer began).
    began: bool,
    /// An error came.
    error: bool,
    /// The usage the answer ends with came.
    complete: bool,
    /// Anthropic: `message_start` came (its input count).
    started: bool,
    /// Gemini: a finish reason came; its usage count came.
    finished: bool,
    counted: bool,
}

/// Fed the response body chunk by chunk; `finish` gives the usage seen.
#[derive(Debug)]
pub struct UsageTap {
    api: Api,
    framing: Framing,
    held: Vec<u8>,
    /// The current line or body outgrew `MAX_HELD`: skip to its end.
    skipping: bool,
    /// A line was skipped: what it said is unknown.
    skipped: bool,
    usage: Usage,
    progress: Progress,
}

impl UsageTap {
    pub fn new(api: Api, framing: Framing) -> Self {
        Self {
            api,
            framing,
            held: Vec::new(),
            skipping: false,
            skipped: false,
            usage: Usage::default(),
            progress: Progress::default(),
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        match self.framing {
            Framing::Json => {
                if self.held.len() + chunk.len() > MAX_HELD {
                    self.skipping = true;
                    self.held = Vec::new();
                } else if !self.skipping {
                    self.held.extend_from_slice(chunk);
                }
            }
            Framing::EventStream => self.feed_lines(chunk),
            Framing::Encoded => {}
        }
    }

    fn feed_lines(&mut self, mut chunk: &[u8]) {
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = chunk.split_at(end);
            if !self.skipping && self.held.len() + line.len() <= MAX_HELD {
                self.held.extend_from_slice(line);
                let whole = std::mem::take(&mut self.held);
                self.event_line(&whole);
            } else {
                self.skipped = true;
            }
            self.held.clear();
            self.skipping = false;
            chunk = &rest[1..];
        }
        if self.skipping || self.held.len() + chunk.len() > MAX_HELD {
            self.skipping = true;
            self.held.clear();
        } else {
            self.held.extend_from_slice(chunk);
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data.trim_ascii().is_empty() || data == b"[DONE]" {
            return;
        }
        match serde_json::from_slice::<Value>(data) {
            Ok(value) => self.apply(&value),
            // A line of data that is not JSON: what it said is unknown.
            Err(_) => self.skipped = true,
        }
    }

    /// What was read (a plain body is parsed now).
    pub fn finish(mut self) -> Reading {
        match self.framing {
            Framing::Json if self.skipping => self.skipped = true,
            Framing::Json => match serde_json::from_slice::<Value>(&self.held) {
                Ok(Value::Array(items)) => items.iter().for_each(|item| self.apply(item)),
                Ok(value) => self.apply(&value),
                Err(_) => self.skipped = true,
            },
            Framing::EventStream if self.skipping => self.skipped = true,
            Framing::EventStream if !self.held.is_empty() => {
                let last = std::mem::take(&mut self.held);
                self.event_line(&last);
            }
            Framing::EventStream => {}
            Framing::Encoded => self.skipped = true,
        }
        let p = self.progress;
        if self.skipped {
            Reading::Partial(self.usage)
        } else if p.complete {
            Reading::Whole(self.usage)
        } else if p.error && !p.began {
            Reading::Whole(Usage::default())
        } else {
            Reading::Partial(self.usage)
        }
    }

    fn apply(&mut self, value: &Value) {
        if !value.is_object() {
            self.skipped = true;
            return;
        }
        match self.api {
            Api::Anthropic => self.anthropic(value),
            Api::OpenAi => self.openai(value),
            Api::Gemini => self.gemini(value),
        }
    }

    /// `message_start` carries the input (and a first output count),
    /// `message_delta` the output so far (cumulative; the last one comes
    /// with the stop reason); a plain body has `usage` at the top.
    fn anthropic(&mut self, value: &Value) {
        let (usage, model) = match value["type"].as_str() {
            Some("message_start") => {
                self.progress.started = true;
                (&value["message"]["usage"], &value["message"]["model"])
            }
            Some("message_delta") => (&value["usage"], &Value::Null),
            Some("message") => (&value["usage"], &value["model"]),
            Some("error") => {
                self.progress.error = true;
                return;
            }
            _ => {
                self.progress.began = true;
                return;
            }
        };
        self.progress.began = true;
        let input = count(&usage["input_tokens"]).map(|input| {
            input
                .saturating_add(count(&usage["cache_read_input_tokens"]).unwrap_or(0))
                .saturating_add(count(&usage["cache_creation_input_tokens"]).unwrap_or(0))
        });
        if let Some(input) = input {
            self.usage.input_tokens = input;
        }
        let output = count(&usage["output_tokens"]);
        if let Some(output) = output {
            self.usage.output_tokens = output;
        }
        match value["type"].as_str() {
            Some("message_delta") if output.is_some() && self.progress.started => {
                self.progress.complete = true;
            }
            Some("message") if input.is_some() && output.is_some() => {
                self.progress.complete = true;
            }
            _ => {}
        }
        self.model(model);
    }

    /// `response.completed` (or failed, incomplete) carries the response
    /// with its usage; a plain body is the response itself.
    fn openai(&mut self, value: &Value) {
        let response = match value["type"].as_str() {
            Some("response.completed" | "response.failed" | "response.incomplete") => {
                &value["response"]
            }
            Some("error") => {
                self.progress.error = true;
                return;
            }
            _ if value["object"] == "response" => value,
            None if value["error"].is_object() => {
                self.progress.error = true;
                return;
            }
            _ => {
                self.progress.began = true;
                return;
            }
        };
        self.progress.began = true;
        let usage = &response["usage"];
        let (input, output) = (
            count(&usage["input_tokens"]),
            count(&usage["output_tokens"]),
        );
        if let (Some(input), Some(output)) = (input, output) {
            self.usage.input_tokens = input;
            self.usage.output_tokens = output;
            self.progress.complete = true;
        }
        self.model(&response["model"]);
    }

    /// Every chunk may carry `usageMetadata` (the counts so far); the
    /// answer is whole once a chunk says why it finished.
    fn gemini(&mut self, value: &Value) {
        if value["error"].is_object() {
            self.progress.error = true;
            return;
        }
        self.progress.began = true;
        let finish = value["candidates"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["finishReason"].is_string()))
            || value["promptFeedback"]["blockReason"].is_string();
        self.progress.finished |= finish;
        let usage = &value["usageMetadata"];
        if let Some(input) = count(&usage["promptTokenCount"]) {
            let tool_prompt = count(&usage["toolUsePromptTokenCount"]).unwrap_or(0);
            let parts = count(&usage["candidatesTokenCount"])
                .unwrap_or(0)
                .saturating_add(count(&usage["thoughtsTokenCount"]).unwrap_or(0))
                .saturating_add(tool_prompt);
            let output = match count(&usage["totalTokenCount"]) {
                Some(total) => total.saturating_sub(input).max(parts),
                None => parts,
            };
            self.usage.input_tokens = input;
            self.usage.output_tokens = output;
            // Counts that come with or after the finish are the total.
            self.progress.counted |= self.progress.finished;
        }
        self.progress.complete = self.progress.finished && self.progress.counted;
        self.model(&value["modelVersion"]);
    }

    fn model(&mut self, model: &Value) {
        if let Some(name) = model.as_str().filter(|n| !n.is_empty() && n.len() <= 200) {
            self.usage.model = Some(name.to_string());
        }
    }
}

fn count(value: &Value) -> Option<u64> {
    value.as_u64()
}

#[cfg(test)]
mod tests;
