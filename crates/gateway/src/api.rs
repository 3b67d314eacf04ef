//! The model APIs the gateway speaks for, told apart by the request's path;
//! where each carries its key; how a request is rewritten for the real
//! upstream; and the error body each CLI understands.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Anthropic Messages (Claude Code).
    Anthropic,
    /// OpenAI Responses (Codex).
    #[serde(rename = "openai")]
    OpenAi,
    /// Gemini generateContent (Gemini CLI).
    Gemini,
}

impl Api {
    pub const ALL: [Api; 3] = [Api::Anthropic, Api::OpenAi, Api::Gemini];

    pub fn as_str(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::OpenAi => "openai",
            Api::Gemini => "gemini",
        }
    }

    /// The header the real key goes in, and its value for `key`.
    pub fn credential(self, key: &str) -> (&'static str, String) {
        match self {
            Api::Anthropic => ("x-api-key", key.to_string()),
            Api::OpenAi => ("authorization", format!("Bearer {key}")),
            Api::Gemini => ("x-goog-api-key", key.to_string()),
        }
    }

    /// The error body the API's clients read (`status`: the HTTP status
    /// sent with it).
    pub fn error_body(self, status: u16, message: &str) -> Value {
        match self {
            Api::Anthropic => json!({"type": "error", "error": {
                "type": anthropic_error_type(status), "message": message}}),
            Api::OpenAi => json!({"error": {"message": message, "type": "gateway_error",
                "code": status}}),
            Api::Gemini => json!({"error": {"code": status, "message": message,
                "status": gemini_status(status)}}),
        }
    }
}

fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

fn gemini_status(status: u16) -> &'static str {
    match status {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        400..=499 => "INVALID_ARGUMENT",
        _ => "UNAVAILABLE",
    }
}

/// What a request path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub api: Api,
    /// The model named in the path (Gemini), else none (it is in the body).
    pub model: Option<String>,
}

/// The longest path accepted (a model name and a method fit well within).
const MAX_PATH: usize = 512;

/// The API a request path belongs to. Only the calls the CLIs make are
/// forwarded: Anthropic's `/v1/messages` (and `/count_tokens`), OpenAI's
/// `/v1/responses`, Gemini's `/v1beta/models/MODEL:METHOD` for the
/// generate and count methods. Anything else is refused (none).
pub fn route(path: &str) -> Option<Route> {
    if path.len() > MAX_PATH || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    match path {
        "/v1/messages" | "/v1/messages/count_tokens" => {
            return Some(Route {
                api: Api::Anthropic,
                model: None,
            });
        }
        "/v1/responses" => {
            return Some(Route {
                api: Api::OpenAi,
                model: None,
            });
        }
        _ => {}
    }
    let rest = path.strip_prefix("/v1beta/models/")?;
    let (model, method) = rest.split_once(':')?;
    let model_ok = !model.is_empty()
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    let method_ok = matches!(
        method,
        "generateContent" | "streamGenerateContent" | "countTokens"
    );
    (model_ok && method_ok).then(|| Route {
        api: Api::Gemini,
        model: Some(model.to_string()),
    })
}

/// Headers never forwarded: hop-by-hop ones, the client's idea of the
/// host and length (the client library sets them for the upstream), and
/// every header that can carry a credential (the real one is added).
pub fn is_dropped_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | "authorization"
            | "x-api-key"
            | "x-goog-api-key"
            | "cookie"
    ) || name.starts_with("proxy-")
}

/// The credentials a request presents: each header that can carry one and
/// a `key` query parameter (Gemini's other way). The gateway requires
/// exactly one distinct value, the agent's placeholder.
pub fn presented_keys<'a>(
    headers: impl Iterator<Item = (&'a str, &'a str)>,
    query: Option<&'a str>,
) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for (name, value) in headers {
        let key = match name.to_ascii_lowercase().as_str() {
            "x-api-key" | "x-goog-api-key" => value.trim(),
            "authorization" => match value.trim().split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                _ => value.trim(),
            },
            _ => continue,
        };
        keys.push(key.to_string());
    }
    for pair in query.unwrap_or("").split('&') {
        if let Some(value) = pair.strip_prefix("key=") {
            keys.push(value.to_string());
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The query without any `key` parameter (it never goes upstream).
pub fn query_without_key(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("key="))
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_their_api_and_nothing_else_does() {
        let api = |p: &str| route(p).map(|r| (r.api, r.model));
        assert_eq!(api("/v1/messages"), Some((Api::Anthropic, None)));
        assert_eq!(api("/v1/responses"), Some((Api::OpenAi, None)));
        assert_eq!(
            api("/v1beta/models/gemini-3.8-flash:streamGenerateContent"),
            Some((Api::Gemini, Some("gemini-3.8-flash".into())))
        );
        for refused in [
            "/",
            "/v1/messages/../../admin",
            "/v1/files",
            "/v1beta/models/x:deleteEverything",
            "/v1beta/models/../x:generateContent",
            "/v1beta/models/:generateContent",
            "/v1/messages\n",
        ] {
            assert_eq!(route(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn every_way_of_presenting_a_key_is_seen_and_none_goes_upstream() {
        let headers = [
            ("Authorization", "Bearer ph-1"),
            ("x-api-key", "ph-1"),
            ("X-Goog-Api-Key", "ph-2"),
            ("accept", "text/event-stream"),
        ];
        let keys = presented_keys(headers.iter().copied(), Some("alt=sse&key=ph-3"));
        assert_eq!(keys, ["ph-1", "ph-2", "ph-3"]);
        assert_eq!(
            query_without_key(Some("alt=sse&key=ph-3")).as_deref(),
            Some("alt=sse")
        );
        assert_eq!(query_without_key(Some("key=x")), None);
        for name in [
            "Authorization",
            "X-API-KEY",
            "x-goog-api-key",
            "Proxy-Authorization",
            "Host",
        ] {
            assert!(is_dropped_header(name), "{name}");
        }
        assert!(!is_dropped_header("anthropic-version"));
    }

    #[test]
    fn errors_have_each_apis_shape() {
        assert_eq!(
            Api::Anthropic.error_body(429, "slow down")["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            Api::Gemini.error_body(401, "no")["error"]["status"],
            "UNAUTHENTICATED"
        );
        assert_eq!(Api::OpenAi.error_body(403, "no")["error"]["message"], "no");
    }
}
