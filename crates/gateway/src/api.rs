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
    pub call: Call,
}

/// What a forwarded call does with the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Generates: uses tokens, counted against the budgets.
    Generate,
    /// Counts a request's tokens: uses none.
    CountTokens,
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
    let fixed = |api, call| {
        Some(Route {
            api,
            model: None,
            call,
        })
    };
    match path {
        "/v1/messages" => return fixed(Api::Anthropic, Call::Generate),
        "/v1/messages/count_tokens" => return fixed(Api::Anthropic, Call::CountTokens),
        "/v1/responses" => return fixed(Api::OpenAi, Call::Generate),
        _ => {}
    }
    let rest = path.strip_prefix("/v1beta/models/")?;
    let (model, method) = rest.split_once(':')?;
    let model_ok = !model.is_empty()
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    let call = match method {
        "generateContent" | "streamGenerateContent" => Call::Generate,
        "countTokens" => Call::CountTokens,
        _ => return None,
    };
    model_ok.then(|| Route {
        api: Api::Gemini,
        model: Some(model.to_string()),
        call,
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

/// Headers of an agent's request never forwarded, beyond those above:
/// each could change what the upstream does or answers from what the
/// gateway read and counts.
pub fn is_dropped_request_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    is_dropped_header(name)
        || matches!(
            lower.as_str(),
            // The answer comes uncompressed, so its usage can be read.
            "accept-encoding"
            // A field mask can leave the usage out of the answer.
            | "x-goog-fieldmask"
            // Another project of the key's organisation (its stored
            // responses, files and prompts).
            | "openai-organization"
            | "openai-project"
            // The body is JSON, as read; the gateway says so itself.
            | "content-type"
            // The body goes as read: unencoded (an encoding is refused).
            | "content-encoding"
            // Another method than the one routed.
            | "x-http-method-override"
            | "x-http-method"
            | "x-method-override"
        )
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

/// The query sent upstream: the parameters the API's CLIs use, without
/// any `key` (it never goes upstream). Any other parameter is refused
/// (given back, cut to 64 bytes): one could change the answer's form
/// (`alt=proto`, `fields=`) and with it what can be read of its usage.
pub fn forwarded_query(api: Api, query: Option<&str>) -> Result<Option<String>, String> {
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.unwrap_or("").split('&') {
        let allowed = match api {
            Api::Anthropic => pair == "beta=true",
            Api::OpenAi => false,
            Api::Gemini => matches!(pair, "alt=sse" | "alt=json"),
        };
        if allowed {
            kept.push(pair);
        } else if !pair.is_empty() && !pair.starts_with("key=") {
            let mut end = pair.len().min(64);
            while !pair.is_char_boundary(end) {
                end -= 1;
            }
            return Err(pair[..end].to_string());
        }
    }
    Ok((!kept.is_empty()).then(|| kept.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_their_api_and_nothing_else_does() {
        let api = |p: &str| route(p).map(|r| (r.api, r.model));
        assert_eq!(api("/v1/messages"), Some((Api::Anthropic, None)));
        assert_eq!(
            route("/v1/messages/count_tokens").map(|r| r.call),
            Some(Call::CountTokens)
        );
        assert_eq!(
            route("/v1beta/models/g:countTokens").map(|r| r.call),
            Some(Call::CountTokens)
        );
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
            forwarded_query(Api::Gemini, Some("alt=sse&key=ph-3")),
            Ok(Some("alt=sse".into()))
        );
        assert_eq!(forwarded_query(Api::Gemini, Some("key=x")), Ok(None));
        assert_eq!(
            forwarded_query(Api::Anthropic, Some("beta=true")),
            Ok(Some("beta=true".into()))
        );
        for (api, refused) in [
            (Api::Gemini, "alt=proto"),
            (Api::Gemini, "%61lt=proto"),
            (Api::Gemini, "$fields=candidates"),
            (Api::Anthropic, "alt=sse"),
            (Api::OpenAi, "beta=true"),
        ] {
            assert_eq!(
                forwarded_query(api, Some(&format!("key=k&{refused}"))),
                Err(refused.to_string())
            );
        }
        for name in [
            "Authorization",
            "X-API-KEY",
            "x-goog-api-key",
            "Proxy-Authorization",
            "Host",
        ] {
            assert!(is_dropped_header(name), "{name}");
        }
        for name in [
            "Accept-Encoding",
            "X-Goog-FieldMask",
            "X-HTTP-Method-Override",
            "OpenAI-Project",
            "Content-Type",
            "x-api-key",
        ] {
            assert!(is_dropped_request_header(name), "{name}");
        }
        assert!(!is_dropped_request_header("anthropic-version"));
        assert!(!is_dropped_header("content-type"), "answers keep theirs");
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
