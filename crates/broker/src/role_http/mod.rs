//! The daemon's HTTP endpoints: the roles' (seed 004 §7), `GET /agents/list`
//! and `POST /agents/{name}/prompt`, and `GET /metrics`; off by default, on a loopback address or a
//! Unix socket, every request with the daemon's bearer token. Pure here:
//! routing, the token check, the request body and the answers; `serve`
//! runs them over hyper.

mod admit;
mod serve;

pub use serve::{Listen, serve};

use serde_json::{Value, json};

use crate::roles::{RoleArgs, RoleError, RoleInfo, RolePrompt};

/// The largest request body.
pub const MAX_BODY: usize = 64 << 10;

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    List,
    /// The daemon's metrics (`metrics`), OpenMetrics text.
    Metrics,
    Prompt {
        name: String,
    },
    /// A known path with another method.
    WrongMethod {
        allowed: &'static str,
    },
    NotFound,
}

/// The route of a method and a path (the query is ignored).
pub fn route(method: &str, path: &str) -> Route {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["metrics"] => match method {
            "GET" => Route::Metrics,
            _ => Route::WrongMethod { allowed: "GET" },
        },
        ["agents", "list"] => match method {
            "GET" => Route::List,
            _ => Route::WrongMethod { allowed: "GET" },
        },
        ["agents", name, "prompt"] if !name.is_empty() => match method {
            "POST" => match percent_decode(name) {
                Some(name) => Route::Prompt { name },
                None => Route::NotFound,
            },
            _ => Route::WrongMethod { allowed: "POST" },
        },
        _ => Route::NotFound,
    }
}

/// `%XX` decoded; None when the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|name| name.into_owned())
}

/// Whether `Authorization` is exactly `Bearer <token>`; compared in time
/// that depends neither on where they differ nor on the given length
/// (their SHA-256 digests are compared, every byte).
pub fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    use sha2::{Digest, Sha256};
    let Some(given) = header else {
        return false;
    };
    if token.is_empty() {
        return false;
    }
    let expected = Sha256::digest(format!("Bearer {token}").as_bytes());
    let given = Sha256::digest(given);
    given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// A prompt request's body: empty, or `{"arguments": {NAME: "value"}}`.
pub fn prompt_args(body: &[u8]) -> Result<RoleArgs, String> {
    if body.len() > MAX_BODY {
        return Err(format!("the body is over {MAX_BODY} bytes"));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(RoleArgs::new());
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Value::Object(mut top) = value else {
        return Err("the body must be an object".into());
    };
    let arguments = top.remove("arguments");
    if let Some(other) = top.keys().next() {
        return Err(format!("unknown field `{other}` (only `arguments`)"));
    }
    let mut args = RoleArgs::new();
    match arguments {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                let Value::String(text) = value else {
                    return Err(format!("argument `{name}` must be a string"));
                };
                args.insert(name, text);
            }
        }
        Some(_) => return Err("`arguments` must be an object of strings".into()),
    }
    Ok(args)
}

/// An answer: the status and its JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

pub fn error(status: u16, code: &str, message: impl Into<String>) -> Answer {
    Answer {
        status,
        body: json!({"error": {"code": code, "message": message.into()}}),
    }
}

pub fn list_answer(roles: &[RoleInfo]) -> Answer {
    Answer {
        status: 200,
        body: json!({"agents": roles}),
    }
}

/// §7.2's answer, or §7.3's error for what went wrong.
pub fn prompt_answer(outcome: Result<RolePrompt, RoleError>) -> Answer {
    match outcome {
        Ok(prompt) => Answer {
            status: 200,
            body: json!({"result": prompt}),
        },
        Err(e) => {
            let (status, code) = match &e {
                RoleError::MissingArgument { .. } | RoleError::UnknownArgument { .. } => {
                    (400, "bad_request")
                }
                RoleError::Timeout { .. } => (408, "timeout"),
                RoleError::Busy { .. } => (503, "busy"),
                RoleError::Stuck { .. } => (503, "stuck"),
                RoleError::Limited { .. } => (429, "rate_limited"),
                RoleError::Script { .. } | RoleError::Memory { .. } | RoleError::Invalid { .. } => {
                    (500, "agent_error")
                }
            };
            error(status, code, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        assert_eq!(route("GET", "/agents/list"), Route::List);
        assert_eq!(route("GET", "/metrics"), Route::Metrics);
        assert_eq!(
            route("POST", "/metrics"),
            Route::WrongMethod { allowed: "GET" }
        );
        assert_eq!(route("GET", "/agents/list?x=1"), Route::List);
        assert_eq!(
            route("POST", "/agents/list"),
            Route::WrongMethod { allowed: "GET" }
        );
        assert_eq!(
            route("POST", "/agents/incident-responder/prompt"),
            Route::Prompt {
                name: "incident-responder".into()
            }
        );
        assert_eq!(
            route("POST", "/agents/a%2Fb/prompt"),
            Route::Prompt { name: "a/b".into() }
        );
        assert_eq!(
            route("GET", "/agents/x/prompt"),
            Route::WrongMethod { allowed: "POST" }
        );
        for path in [
            "/",
            "/agents",
            "/agents//prompt",
            "/agents/x/prompt/y",
            "/agents/%ff/prompt",
        ] {
            assert_eq!(route("POST", path), Route::NotFound, "{path}");
        }
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        assert!(authorized(Some(b"Bearer s3cret"), "s3cret"));
        for given in [
            None,
            Some(&b"Bearer s3cre"[..]),
            Some(b"Bearer s3cretX"),
            Some(b"bearer s3cret"),
            Some(b"Basic s3cret"),
            Some(b""),
        ] {
            assert!(!authorized(given, "s3cret"), "{given:?}");
        }
        assert!(
            !authorized(Some(b"Bearer "), ""),
            "an empty token opens nothing"
        );
    }

    #[test]
    fn prompt_bodies() {
        assert_eq!(prompt_args(b""), Ok(RoleArgs::new()));
        assert_eq!(prompt_args(b"{}"), Ok(RoleArgs::new()));
        assert_eq!(
            prompt_args(br#"{"arguments": {"service": "db"}}"#),
            Ok([("service".to_string(), "db".to_string())].into())
        );
        for (body, wanted) in [
            (&br#"{"arguments": {"n": 1}}"#[..], "must be a string"),
            (br#"{"arguments": []}"#, "object of strings"),
            (br#"{"args": {}}"#, "unknown field `args`"),
            (b"[1]", "must be an object"),
            (b"{", "not JSON"),
        ] {
            let err = prompt_args(body).unwrap_err();
            assert!(err.contains(wanted), "{err}");
        }
        assert!(prompt_args(&vec![b' '; MAX_BODY + 1]).is_err());
    }

    #[test]
    fn errors_map_to_the_specs_statuses() {
        let role = || "r".to_string();
        let cases = [
            (
                RoleError::MissingArgument {
                    role: role(),
                    name: "x".into(),
                },
                400,
                "bad_request",
            ),
            (
                RoleError::Timeout {
                    role: role(),
                    ms: 5,
                },
                408,
                "timeout",
            ),
            (
                RoleError::Script {
                    role: role(),
                    message: "boom".into(),
                },
                500,
                "agent_error",
            ),
            (RoleError::Busy { role: role() }, 503, "busy"),
        ];
        for (e, status, code) in cases {
            let answer = prompt_answer(Err(e));
            assert_eq!(answer.status, status);
            assert_eq!(answer.body["error"]["code"], code);
        }
    }
}
