//! What the gateway reads of a request's body before forwarding it: the
//! model, the most output tokens the request asks for, and the tools it
//! names that the model's provider would run itself (web search, code
//! execution, remote MCP servers...), which a role must allow.
//!
//! The body is read once, as a stream, from its spool: nothing of it is
//! held but the nesting being read and short texts at the places read
//! (at most `MAX_TEXT` bytes each), so a large body costs no memory.
//! Only strict JSON is read; a body this reader refuses is not forwarded
//! (the upstream would refuse it too). Every occurrence of a key counts:
//! a key given twice, or spelled with escapes (`"ty\u0070e"`), is read
//! as the upstream's parser would read either copy.

use std::collections::BTreeSet;
use std::io::BufRead;

use substrat_policy::model::HostedTool;

use crate::api::Api;

use source::Source;

/// The deepest nesting read (the upstreams' parsers allow about as much).
pub const MAX_DEPTH: usize = 128;
/// The longest text kept from a place read (longer ones are cut).
const MAX_TEXT: usize = 256;
/// The most unknown tool kinds kept (for the refusal's message).
const MAX_UNKNOWN: usize = 8;
/// The most distinct models kept; a body naming more is unreadable.
pub const MAX_MODELS: usize = 8;

/// What a request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// The first `model` given (Anthropic, OpenAI; Gemini's is in the path).
    pub model: Option<String>,
    /// Every model the body names where an API reads one: the root's
    /// `model` (each copy, any case) and an OpenAI tool's `model`; at most
    /// `MAX_MODELS`.
    pub models: BTreeSet<String>,
    /// A place of a model holds what is not a model name read whole (not
    /// a string, longer than kept, not UTF-8, more than `MAX_MODELS`).
    pub unreadable_model: bool,
    /// The most output tokens asked for (the largest, if given twice).
    pub max_output_tokens: Option<u64>,
    /// Provider-side tools named.
    pub hosted: BTreeSet<HostedTool>,
    /// Tool kinds this gateway does not know (refused: a new kind may be
    /// provider-side), cut to `MAX_TEXT` bytes, at most `MAX_UNKNOWN`.
    pub unknown_tools: BTreeSet<String>,
    /// Fields that make the provider use more than the body says (stored
    /// conversations, files, prompts, caches, several candidates) or
    /// answer without the usage (`background`): refused.
    pub unbounded: BTreeSet<&'static str>,
    /// A count of output tokens was given that is not a count.
    pub unreadable_count: bool,
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub enum SkimError {
    #[error("the request body is not a JSON object (at byte {0})")]
    Syntax(u64),
    #[error("the request body nests deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("the request body cannot be read: {0}")]
    Io(#[from] std::io::Error),
}

/// Where a value is, as far as this reader cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The body itself.
    Root,
    /// The value of a key whose text is kept (`model`).
    Model,
    /// A value that is a count of output tokens.
    MaxTokens,
    /// Gemini's `generationConfig`.
    GenerationConfig,
    /// An array of tools, and one tool in it.
    Tools,
    Tool,
    /// A tool's `type` (Anthropic, OpenAI).
    ToolType,
    /// Anthropic's `mcp_servers` (the provider connects to them).
    McpServers,
    /// OpenAI's `input`, and one item of it (an `additional_tools` item
    /// offers tools too).
    Input,
    InputItem,
    /// A field refused when present (not null or false).
    Unbounded(&'static str),
    /// Anthropic's content `source` (a URL or a stored file is fetched
    /// by the provider), and its `type`.
    Source,
    SourceType,
    /// OpenAI's `image_url` (a URL the provider fetches, unless `data:`).
    ImageUrl,
    /// An OpenAI input item's `type`.
    InputItemType,
    /// Gemini's `candidateCount`.
    Candidates,
    /// Anywhere else: skipped.
    Other,
}

/// A key's text, decoded, or none when it is longer than any key read.
type Key = Option<String>;

/// Reads `body` (the whole request body) for `api`.
pub fn skim(api: Api, body: impl BufRead) -> Result<RequestFacts, SkimError> {
    let mut reader = Skimmer {
        api,
        src: Source {
            inner: body,
            pos: 0,
        },
        facts: RequestFacts::default(),
    };
    reader.src.whitespace()?;
    if reader.src.peek()? != Some(b'{') {
        return Err(SkimError::Syntax(reader.src.pos));
    }
    reader.value(Place::Root, 0)?;
    reader.src.whitespace()?;
    match reader.src.peek()? {
        None => Ok(reader.facts),
        Some(_) => Err(SkimError::Syntax(reader.src.pos)),
    }
}

struct Skimmer<R> {
    api: Api,
    src: Source<R>,
    facts: RequestFacts,
}

impl<R: BufRead> Skimmer<R> {
    fn value(&mut self, place: Place, depth: usize) -> Result<(), SkimError> {
        if depth > MAX_DEPTH {
            return Err(SkimError::TooDeep);
        }
        self.src.whitespace()?;
        let next = self.src.peek()?;
        match (place, next) {
            (Place::Model, Some(b'"')) => {}
            (Place::Model, _) => self.facts.unreadable_model = true,
            (Place::Unbounded(_), Some(b'n' | b'f')) => {}
            (Place::Unbounded(name), _) => {
                self.facts.unbounded.insert(name);
            }
            (Place::ImageUrl, Some(b'{' | b'[')) => {
                self.facts.hosted.insert(HostedTool::WebFetch);
            }
            _ => {}
        }
        match next {
            Some(b'{') => self.object(place, depth),
            Some(b'[') => self.array(place, depth),
            Some(b'"') => {
                let text = self.src.string(MAX_TEXT)?;
                self.scalar(place, Scalar::Text(text));
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => {
                let number = self.src.number()?;
                self.scalar(place, Scalar::Number(number));
                Ok(())
            }
            Some(b't') => self.src.literal(b"true"),
            Some(b'f') => self.src.literal(b"false"),
            Some(b'n') => self.src.literal(b"null"),
            _ => Err(SkimError::Syntax(self.src.pos)),
        }
    }

    fn object(&mut self, place: Place, depth: usize) -> Result<(), SkimError> {
        self.src.expect(b'{')?;
        self.src.whitespace()?;
        if self.src.peek()? == Some(b'}') {
            self.src.bump();
            return Ok(());
        }
        loop {
            self.src.whitespace()?;
            if self.src.peek()? != Some(b'"') {
                return Err(SkimError::Syntax(self.src.pos));
            }
            let key = self
                .src
                .string(MAX_TEXT)?
                .filter(|k| !k.cut)
                .map(|k| k.text);
            self.src.whitespace()?;
            self.src.expect(b':')?;
            let inner = self.member(place, &key);
            self.value(inner, depth + 1)?;
            self.src.whitespace()?;
            match self.src.next()? {
                Some(b',') => continue,
                Some(b'}') => return Ok(()),
                _ => return Err(SkimError::Syntax(self.src.pos)),
            }
        }
    }

    fn array(&mut self, place: Place, depth: usize) -> Result<(), SkimError> {
        self.src.expect(b'[')?;
        self.src.whitespace()?;
        if self.src.peek()? == Some(b']') {
            self.src.bump();
            return Ok(());
        }
        let item = match place {
            Place::Tools => Place::Tool,
            Place::Input => Place::InputItem,
            _ => Place::Other,
        };
        if place == Place::McpServers {
            self.facts.hosted.insert(HostedTool::RemoteMcp);
        }
        loop {
            self.value(item, depth + 1)?;
            self.src.whitespace()?;
            match self.src.next()? {
                Some(b',') => continue,
                Some(b']') => return Ok(()),
                _ => return Err(SkimError::Syntax(self.src.pos)),
            }
        }
    }

    /// Where the value of `key` in an object at `place` is.
    fn member(&mut self, place: Place, key: &Key) -> Place {
        let Some(key) = key.as_deref() else {
            // Too long or not UTF-8: no key read is, but a Gemini tool's
            // key is its kind, and a kind not known is refused.
            if (self.api, place) == (Api::Gemini, Place::Tool) {
                self.tool_kind(ToolKind::Unknown, "(a key not read)");
            }
            return Place::Other;
        };
        if let Some(found) = self.anywhere(place, key) {
            return found;
        }
        // A model named twice, or as `Model`, is read as any parser might
        // read it: each copy must be allowed.
        let model_place = place == Place::Root || (self.api, place) == (Api::OpenAi, Place::Tool);
        if model_place && is_model_key(key) {
            return Place::Model;
        }
        match (self.api, place) {
            (_, Place::Root) if key == "tools" => Place::Tools,
            (Api::Anthropic | Api::OpenAi, Place::Root) => match key {
                "max_tokens" if self.api == Api::Anthropic => Place::MaxTokens,
                "max_output_tokens" if self.api == Api::OpenAi => Place::MaxTokens,
                "mcp_servers" if self.api == Api::Anthropic => Place::McpServers,
                "input" if self.api == Api::OpenAi => Place::Input,
                _ => Place::Other,
            },
            (Api::Gemini, Place::Root) => match key {
                "generationConfig" | "generation_config" => Place::GenerationConfig,
                _ => Place::Other,
            },
            (Api::OpenAi, Place::InputItem) if key == "tools" => Place::Tools,
            (Api::OpenAi, Place::InputItem) if key == "type" => Place::InputItemType,
            (Api::Gemini, Place::GenerationConfig) => match key {
                "maxOutputTokens" | "max_output_tokens" => Place::MaxTokens,
                "candidateCount" | "candidate_count" => Place::Candidates,
                _ => Place::Other,
            },
            (Api::Anthropic, Place::Source) if key == "type" => Place::SourceType,
            (Api::Anthropic | Api::OpenAi, Place::Tool) => match key {
                "type" => Place::ToolType,
                // OpenAI's hosted shell: a container on the provider's side
                // (only a client's own shell has no environment).
                "environment" if self.api == Api::OpenAi => {
                    self.facts.hosted.insert(HostedTool::CodeExecution);
                    Place::Other
                }
                // OpenAI's namespaces hold tools of their own.
                "tools" => Place::Tools,
                _ => Place::Other,
            },
            // A Gemini tool is an object whose keys are its kinds.
            (Api::Gemini, Place::Tool) => {
                self.tool_kind(gemini_tool(key), key);
                Place::Other
            }
            _ => Place::Other,
        }
    }

    /// Keys that matter wherever they are: content the provider fetches
    /// or keeps (URLs, stored files, conversations, caches), and the
    /// root's switches that change what an answer says of its usage.
    fn anywhere(&mut self, place: Place, key: &str) -> Option<Place> {
        let root = place == Place::Root;
        let found = match (self.api, key) {
            (Api::Anthropic, "source") => Place::Source,
            (Api::Anthropic, "url") if place == Place::Source => {
                self.facts.hosted.insert(HostedTool::WebFetch);
                Place::Other
            }
            (Api::Anthropic | Api::OpenAi, "file_id") => Place::Unbounded("file_id"),
            (Api::OpenAi, "file_url") => {
                self.facts.hosted.insert(HostedTool::WebFetch);
                Place::Other
            }
            (Api::OpenAi, "image_url") => Place::ImageUrl,
            (Api::OpenAi, "background") if root => Place::Unbounded("background"),
            (Api::OpenAi, "previous_response_id") if root => {
                Place::Unbounded("previous_response_id")
            }
            (Api::OpenAi, "conversation") if root => Place::Unbounded("conversation"),
            (Api::OpenAi, "prompt") if root => Place::Unbounded("prompt"),
            (Api::Gemini, "fileData" | "file_data") => {
                self.facts.hosted.insert(HostedTool::WebFetch);
                Place::Other
            }
            (Api::Gemini, "cachedContent" | "cached_content") if root => {
                Place::Unbounded("cachedContent")
            }
            _ => return None,
        };
        Some(found)
    }

    fn scalar(&mut self, place: Place, value: Scalar) {
        match (place, value) {
            (Place::SourceType, Scalar::Text(Some(Text { text, .. }))) => match text.as_str() {
                "url" => {
                    self.facts.hosted.insert(HostedTool::WebFetch);
                }
                "file" => {
                    self.facts.unbounded.insert("a file source");
                }
                _ => {}
            },
            (Place::ImageUrl, Scalar::Text(text)) => {
                let inline = text.is_some_and(|t| t.text.starts_with("data:"));
                if !inline {
                    self.facts.hosted.insert(HostedTool::WebFetch);
                }
            }
            (Place::InputItemType, Scalar::Text(Some(Text { text, .. })))
                if text == "item_reference" =>
            {
                self.facts.unbounded.insert("item_reference");
            }
            (Place::Candidates, Scalar::Number(number)) if count_of(&number) == Some(1) => {}
            (Place::Candidates, _) => {
                self.facts.unbounded.insert("candidateCount");
            }
            (Place::Model, Scalar::Text(Some(Text { text, cut: false }))) => {
                if self.facts.model.is_none() {
                    self.facts.model = Some(text.clone());
                }
                let models = &mut self.facts.models;
                if models.len() < MAX_MODELS || models.contains(&text) {
                    models.insert(text);
                } else {
                    self.facts.unreadable_model = true;
                }
            }
            (Place::Model, _) => self.facts.unreadable_model = true,
            (Place::MaxTokens, Scalar::Number(number)) => self.max_tokens(count_of(&number)),
            // Proto JSON (Gemini) takes integers written as strings.
            (Place::MaxTokens, Scalar::Text(text)) => {
                let count = text.filter(|t| !t.cut).and_then(|t| count_of(&t.text));
                self.max_tokens(count);
            }
            (Place::ToolType, Scalar::Text(Some(Text { text, cut: false }))) => {
                let kind = match self.api {
                    Api::Anthropic => anthropic_tool(&text),
                    _ => openai_tool(&text),
                };
                self.tool_kind(kind, &text);
            }
            (Place::ToolType, Scalar::Text(_)) => {
                self.tool_kind(ToolKind::Unknown, "(a type not read)");
            }
            (Place::ToolType, Scalar::Number(_)) => self.tool_kind(ToolKind::Unknown, "a number"),
            _ => {}
        }
    }

    /// A count of output tokens asked for; none: not a count (refused).
    fn max_tokens(&mut self, count: Option<u64>) {
        let Some(count) = count else {
            self.facts.unreadable_count = true;
            return;
        };
        let asked = &mut self.facts.max_output_tokens;
        *asked = Some(asked.map_or(count, |was| was.max(count)));
    }

    fn tool_kind(&mut self, kind: ToolKind, text: &str) {
        match kind {
            ToolKind::Client => {}
            ToolKind::Hosted(tool) => {
                self.facts.hosted.insert(tool);
            }
            ToolKind::Unknown if self.facts.unknown_tools.len() < MAX_UNKNOWN => {
                self.facts.unknown_tools.insert(text.to_string());
            }
            ToolKind::Unknown => {}
        }
    }
}

/// A count as the request writes it (`1024`, `1e3`, `"1024"`); none for
/// anything else (negative, fractional, too large to be one).
fn count_of(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(count) = text.parse::<u64>() {
        return Some(count);
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19 => Some(v as u64),
        _ => None,
    }
}

/// What a tool declaration is: run by the client (the CLI, in the
/// sandbox), run by the provider, or a kind this gateway does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolKind {
    Client,
    Hosted(HostedTool),
    Unknown,
}

/// Anthropic's tool `type`s: none or `custom` for a client's own tool;
/// its versioned client tools (bash, text editor, computer, memory); the
/// rest are server tools (`web_search_20250305`, `code_execution_...`).
fn anthropic_tool(kind: &str) -> ToolKind {
    let client = ["bash_", "text_editor_", "computer_", "memory_"];
    match kind {
        "" | "custom" => ToolKind::Client,
        k if client.iter().any(|p| k.starts_with(p)) => ToolKind::Client,
        k if k.starts_with("web_search_") => ToolKind::Hosted(HostedTool::WebSearch),
        k if k.starts_with("web_fetch_") => ToolKind::Hosted(HostedTool::WebFetch),
        k if k.starts_with("code_execution_") => ToolKind::Hosted(HostedTool::CodeExecution),
        k if k.starts_with("mcp_toolset") => ToolKind::Hosted(HostedTool::RemoteMcp),
        _ => ToolKind::Unknown,
    }
}

/// OpenAI Responses' tool `type`s.
fn openai_tool(kind: &str) -> ToolKind {
    match kind {
        "function"
        | "custom"
        | "namespace"
        | "local_shell"
        | "shell"
        | "apply_patch"
        | "computer_use_preview"
        | "computer_use" => ToolKind::Client,
        k if k.starts_with("web_search") => ToolKind::Hosted(HostedTool::WebSearch),
        "file_search" => ToolKind::Hosted(HostedTool::FileSearch),
        "code_interpreter" => ToolKind::Hosted(HostedTool::CodeExecution),
        "image_generation" => ToolKind::Hosted(HostedTool::ImageGeneration),
        "mcp" => ToolKind::Hosted(HostedTool::RemoteMcp),
        _ => ToolKind::Unknown,
    }
}

/// A Gemini tool's key (proto JSON: camelCase or snake_case).
fn gemini_tool(key: &str) -> ToolKind {
    let name: String = key
        .chars()
        .filter(|&c| c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    match name.as_str() {
        "functiondeclarations" | "computeruse" => ToolKind::Client,
        "googlesearch" | "googlesearchretrieval" | "enterprisewebsearch" => {
            ToolKind::Hosted(HostedTool::WebSearch)
        }
        "urlcontext" => ToolKind::Hosted(HostedTool::WebFetch),
        "codeexecution" => ToolKind::Hosted(HostedTool::CodeExecution),
        "filesearch" | "retrieval" => ToolKind::Hosted(HostedTool::FileSearch),
        "mcpservers" => ToolKind::Hosted(HostedTool::RemoteMcp),
        _ => ToolKind::Unknown,
    }
}

/// A text read, decoded; `cut` when it was longer than kept.
#[derive(Debug)]
struct Text {
    text: String,
    cut: bool,
}

enum Scalar {
    /// None: not valid UTF-8 once decoded.
    Text(Option<Text>),
    Number(String),
}

mod source;

/// A key some parser may read as `model`: equal to it in any case once
/// cut at a NUL (as C strings are) and stripped of control, blank and
/// invisible characters.
fn is_model_key(key: &str) -> bool {
    let cut = key.split('\0').next().unwrap_or_default();
    let mut seen = cut
        .chars()
        .filter(|c| !(c.is_control() || c.is_whitespace() || is_invisible(*c)));
    "model"
        .chars()
        .all(|m| seen.next().is_some_and(|c| c.eq_ignore_ascii_case(&m)))
        && seen.next().is_none()
}

/// Characters that show as nothing (zero-width, joiners, the BOM).
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}' | '\u{ad}')
}

#[cfg(test)]
mod tests;
