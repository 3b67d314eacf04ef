//! A role's model budget and the provider-side tools it allows (the
//! policy's `[model]`).

use serde::{Deserialize, Serialize};

/// What an agent of the role may spend on its model (through the model
/// gateway, which refuses the request that would go over); absent: no
/// limit but the team's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBudget {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_turn: Option<u64>,
    pub tokens_per_day: Option<u64>,
    /// The most output tokens one request may ask for (a request asking
    /// more is refused); a request that names no limit reserves this many.
    pub tokens_per_request: Option<u64>,
    /// The agent's model requests at once (default
    /// `DEFAULT_CONCURRENT_REQUESTS`); more are refused until one ends.
    pub concurrent_requests: Option<u32>,
    /// Tools the model's provider runs on its own side (web search,
    /// code execution, remote MCP servers...) that the agent's requests
    /// may name; none by default: the gateway refuses a request naming
    /// any other, and the CLIs' own such tools are switched off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosted_tools: Vec<HostedTool>,
    /// The models an agent of the role may use, as glob patterns (`*`
    /// any run of characters, `?` one, `[a-z]` a class; the whole name
    /// must match, case counts); absent: any model (`check`: SBX050).
    /// `spawn_agent` refuses a model outside them and the gateway every
    /// request naming one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The model an agent of the role gets when its spawn names none
    /// (within `models`); absent: its parent's, else its CLI's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// The longest model name taken (the APIs' are far shorter).
pub const MAX_MODEL_NAME: usize = 128;

impl ModelBudget {
    /// Whether the role lets its agents use `model`: within `models`
    /// when it is given.
    pub fn allows_model(&self, model: &str) -> bool {
        match &self.models {
            None => true,
            Some(patterns) => model_matches(patterns, model),
        }
    }
}

/// Whether `model` matches one of `patterns` (glob; a pattern that does
/// not parse matches nothing: validation reports it).
pub fn model_matches(patterns: &[String], model: &str) -> bool {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: false,
        require_literal_leading_dot: false,
    };
    patterns.iter().any(|p| {
        glob::Pattern::new(p)
            .map(|g| g.matches_with(model, options))
            .unwrap_or(false)
    })
}

/// Why `name` is not a model name an agent may ask for: 1 to
/// `MAX_MODEL_NAME` of ASCII letters, digits and `-._:/@`, not starting
/// with `-` (it goes on a CLI's command line).
pub fn model_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_MODEL_NAME {
        return Some(format!(
            "a model name is 1 to {MAX_MODEL_NAME} characters long"
        ));
    }
    if name.starts_with('-') {
        return Some("a model name does not start with `-`".into());
    }
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._:/@".contains(*c)));
    bad.map(|c| {
        format!(
            "a model name holds only ASCII letters, digits and `-._:/@`, not {:?}",
            c
        )
    })
}

/// An agent's model requests at once, when its role does not say.
pub const DEFAULT_CONCURRENT_REQUESTS: u32 = 4;

/// A tool a model's provider runs itself, on its side of the network: a
/// way out of the sandbox that neither its network policy nor the broker
/// sees. The model gateway refuses requests naming one the role does not
/// allow (`model.hosted_tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostedTool {
    /// Searching the web (Anthropic `web_search_*`, OpenAI `web_search`,
    /// Gemini `googleSearch`).
    WebSearch,
    /// Fetching a URL (Anthropic `web_fetch_*`, Gemini `urlContext`).
    WebFetch,
    /// Running code on the provider (`code_execution_*`,
    /// `code_interpreter`, `codeExecution`).
    CodeExecution,
    /// Searching files stored with the provider.
    FileSearch,
    ImageGeneration,
    /// MCP servers the provider connects to (Anthropic `mcp_servers`,
    /// OpenAI `mcp`): tools beside the broker's, out of its scope.
    RemoteMcp,
}

impl HostedTool {
    pub fn as_str(self) -> &'static str {
        match self {
            HostedTool::WebSearch => "web_search",
            HostedTool::WebFetch => "web_fetch",
            HostedTool::CodeExecution => "code_execution",
            HostedTool::FileSearch => "file_search",
            HostedTool::ImageGeneration => "image_generation",
            HostedTool::RemoteMcp => "remote_mcp",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roles_models_are_glob_patterns_and_its_default_within_them() {
        let load = |text: &str| {
            crate::load_str(
                std::path::Path::new("r.toml"),
                &format!("version = 1\nextends = \"worker\"\n[model]\n{text}"),
                &Default::default(),
            )
        };
        let loaded =
            load("models = [\"claude-sonnet-*\", \"gpt-5-mini\"]\ndefault = \"gpt-5-mini\"")
                .unwrap();
        let budget = &loaded.policy.model;
        assert!(budget.allows_model("claude-sonnet-4-6"));
        assert!(budget.allows_model("gpt-5-mini"));
        assert!(
            !budget.allows_model("gpt-5-mini-x"),
            "the whole name matches"
        );
        assert!(!budget.allows_model("Claude-sonnet-4"), "case counts");
        assert!(!budget.allows_model("claude-opus-5"));
        assert!(
            ModelBudget::default().allows_model("anything"),
            "absent: any"
        );
        for (text, key) in [
            ("models = []", "model.models"),
            ("models = [\"claude-[\"]", "model.models[0]"),
            ("models = [\"a b\"]", "model.models[0]"),
            (
                "models = [\"claude-*\"]\ndefault = \"gpt-5\"",
                "model.default",
            ),
            ("default = \"--help\"", "model.default"),
        ] {
            let errors = load(text).unwrap_err().to_string();
            assert!(errors.contains(key), "{text}: {errors}");
        }
        assert_eq!(model_name_problem("claude-sonnet-4@2026:x/y.z"), None);
        assert!(model_name_problem("-m").is_some());
        assert!(model_name_problem("a\u{1b}[31m").is_some());
        assert!(model_name_problem(&"m".repeat(MAX_MODEL_NAME + 1)).is_some());
    }
}
