//! Tokens used, read from a model's response as it streams through: the
//! server-sent events of a streaming call (their `data:` lines, each a JSON
//! object) or the whole JSON body of a plain one. The bytes are the model
//! API's; a line or body too long to hold is skipped, never buffered
//! without bound, and nothing here can fail the response.

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

/// How the response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    EventStream,
    Json,
}

/// Fed the response body chunk by chunk; `finish` gives the usage seen.
#[derive(Debug)]
pub struct UsageTap {
    api: Api,
    framing: Framing,
    held: Vec<u8>,
    /// The current line or body outgrew `MAX_HELD`: skip to its end.
    skipping: bool,
    usage: Usage,
}

impl UsageTap {
    pub fn new(api: Api, framing: Framing) -> Self {
        Self {
            api,
            framing,
            held: Vec::new(),
            skipping: false,
            usage: Usage::default(),
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
        }
    }

    fn feed_lines(&mut self, mut chunk: &[u8]) {
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = chunk.split_at(end);
            if !self.skipping && self.held.len() + line.len() <= MAX_HELD {
                self.held.extend_from_slice(line);
                let whole = std::mem::take(&mut self.held);
                self.event_line(&whole);
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
        if let Ok(value) = serde_json::from_slice::<Value>(data) {
            self.apply(&value);
        }
    }

    /// The usage seen (a plain body is parsed now).
    pub fn finish(mut self) -> Usage {
        match self.framing {
            Framing::Json if !self.skipping => {
                if let Ok(value) = serde_json::from_slice::<Value>(&self.held) {
                    self.apply(&value);
                }
            }
            Framing::EventStream if !self.skipping && !self.held.is_empty() => {
                let last = std::mem::take(&mut self.held);
                self.event_line(&last);
            }
            _ => {}
        }
        self.usage
    }

    fn apply(&mut self, value: &Value) {
        match self.api {
            Api::Anthropic => self.anthropic(value),
            Api::OpenAi => self.openai(value),
            Api::Gemini => self.gemini(value),
        }
    }

    /// `message_start` carries the input (and a first output count),
    /// `message_delta` the output so far (cumulative); a plain body has
    /// `usage` at the top.
    fn anthropic(&mut self, value: &Value) {
        let (usage, model) = match value["type"].as_str() {
            Some("message_start") => (&value["message"]["usage"], &value["message"]["model"]),
            Some("message_delta") => (&value["usage"], &Value::Null),
            Some("message") => (&value["usage"], &value["model"]),
            _ => return,
        };
        if let Some(input) = count(&usage["input_tokens"]) {
            let cached = count(&usage["cache_read_input_tokens"]).unwrap_or(0)
                + count(&usage["cache_creation_input_tokens"]).unwrap_or(0);
            self.usage.input_tokens = input.saturating_add(cached);
        }
        if let Some(output) = count(&usage["output_tokens"]) {
            self.usage.output_tokens = output;
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
            _ if value["object"] == "response" => value,
            _ => return,
        };
        let usage = &response["usage"];
        if let Some(input) = count(&usage["input_tokens"]) {
            self.usage.input_tokens = input;
        }
        if let Some(output) = count(&usage["output_tokens"]) {
            self.usage.output_tokens = output;
        }
        self.model(&response["model"]);
    }

    /// Every chunk may carry `usageMetadata`; the last one is the total.
    fn gemini(&mut self, value: &Value) {
        let usage = &value["usageMetadata"];
        if let Some(input) = count(&usage["promptTokenCount"]) {
            self.usage.input_tokens = input;
        }
        let output = count(&usage["candidatesTokenCount"]).unwrap_or(0)
            + count(&usage["thoughtsTokenCount"]).unwrap_or(0);
        if usage.is_object() {
            self.usage.output_tokens = output;
        }
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
mod tests {
    use super::*;

    fn tap(api: Api, framing: Framing, chunks: &[&[u8]]) -> Usage {
        let mut tap = UsageTap::new(api, framing);
        for chunk in chunks {
            tap.feed(chunk);
        }
        tap.finish()
    }

    #[test]
    fn anthropic_stream_split_anywhere() {
        let body = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n",
            "event: message_delta\r\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\r\n\r\n",
        )
        .as_bytes();
        let want = Usage {
            input_tokens: 15,
            output_tokens: 7,
            model: Some("claude-x".into()),
        };
        for cut in 0..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(
                tap(Api::Anthropic, Framing::EventStream, &[a, b]),
                want,
                "{cut}"
            );
        }
    }

    #[test]
    fn openai_and_gemini_streams_and_plain_bodies() {
        let openai = b"data: {\"type\":\"response.created\"}\n\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}\n\n";
        assert_eq!(
            tap(Api::OpenAi, Framing::EventStream, &[openai]),
            Usage {
                input_tokens: 5,
                output_tokens: 2,
                model: Some("m".into())
            }
        );
        let gemini = b"data: {\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":1}}\n\ndata: {\"modelVersion\":\"g\",\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":9,\"thoughtsTokenCount\":2}}";
        assert_eq!(
            tap(Api::Gemini, Framing::EventStream, &[gemini]),
            Usage {
                input_tokens: 4,
                output_tokens: 11,
                model: Some("g".into())
            }
        );
        let plain =
            br#"{"type":"message","model":"c","usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(
            tap(Api::Anthropic, Framing::Json, &[&plain[..10], &plain[10..]]).total(),
            7
        );
    }

    #[test]
    fn an_overlong_line_is_skipped_and_the_next_one_read() {
        let long = vec![b'x'; MAX_HELD + 10];
        let next =
            b"\ndata: {\"usageMetadata\":{\"promptTokenCount\":1,\"candidatesTokenCount\":1}}\n";
        let usage = tap(Api::Gemini, Framing::EventStream, &[b"data: ", &long, next]);
        assert_eq!(usage.total(), 2);
        let big = vec![b' '; MAX_HELD + 1];
        assert_eq!(
            tap(Api::OpenAi, Framing::Json, &[&big, b"{}"]),
            Usage::default()
        );
    }
}
