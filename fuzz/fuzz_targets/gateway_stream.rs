//! Arbitrary bytes as what crosses the model gateway: the first bytes a
//! request path and query (with header values), the rest a model's answer
//! split into chunks at arbitrary points, and also a request's body.
//! Invariants: nothing panics; a routed path is one of the forwarded calls;
//! the query sent upstream never carries a key and only the parameters the
//! API's CLIs use; the usage read from an answer does not depend on how it
//! was chunked; a body is read the same through any buffer size; a body
//! serde_json reads as an object is read too, with at least the output
//! tokens serde_json sees, every provider-side tool it names, and the
//! model it names (serde_json keeps a duplicate key's last copy: that one
//! is never unseen).
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use substrat_gateway::Api;
use substrat_gateway::api::{forwarded_query, presented_keys, route};
use substrat_gateway::request::{SkimError, skim};
use substrat_gateway::usage::{Framing, Reading, UsageTap};
use substrat_policy::model::HostedTool;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let split = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (head, answer) = rest.split_at(split);
    let api = Api::ALL[usize::from(selector % 3)];
    if let Ok(head) = std::str::from_utf8(head) {
        let (path, query) = match head.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (head, None),
        };
        if let Some(r) = route(path) {
            assert!(
                path == "/v1/messages"
                    || path == "/v1/messages/count_tokens"
                    || path == "/v1/responses"
                    || path.starts_with("/v1beta/models/"),
                "{path:?}"
            );
            assert_eq!(r.model.is_some(), r.api == Api::Gemini);
        }
        if let Ok(Some(q)) = forwarded_query(api, query) {
            for pair in q.split('&') {
                assert!(matches!(pair, "beta=true" | "alt=sse" | "alt=json"), "{q:?}");
            }
        }
        let headers = [("x-api-key", head), ("authorization", head)];
        let keys = presented_keys(headers.into_iter(), query);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
    let framing = match selector & 12 {
        0 => Framing::EventStream,
        4 => Framing::Json,
        _ => Framing::Encoded,
    };
    let whole = {
        let mut tap = UsageTap::new(api, framing);
        tap.feed(answer);
        tap.finish()
    };
    let step = usize::from(selector >> 4).max(1);
    let mut tap = UsageTap::new(api, framing);
    for chunk in answer.chunks(step) {
        tap.feed(chunk);
    }
    let chunked = tap.finish();
    assert_eq!(whole, chunked, "chunking changed what was read");
    if framing == Framing::Encoded {
        assert!(matches!(whole, Reading::Partial(_)), "an encoded answer is never read");
    }
    body(api, answer, step);
});

fn body(api: Api, bytes: &[u8], step: usize) {
    let read = skim(api, bytes);
    let small = skim(api, BufReader::with_capacity(step, bytes));
    match (&read, &small) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the buffer size changed what was read"),
        (Err(SkimError::Syntax(a)), Err(SkimError::Syntax(b))) => assert_eq!(a, b),
        (Err(SkimError::TooDeep), Err(SkimError::TooDeep)) => {}
        _ => panic!("{read:?} vs {small:?}"),
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return };
    if !value.is_object() {
        assert!(read.is_err(), "only objects are read");
        return;
    }
    let facts = match read {
        Ok(facts) => facts,
        Err(SkimError::TooDeep) => return,
        Err(e) => panic!("serde_json reads this body, the gateway does not: {e}"),
    };
    let max_key = match api {
        Api::Anthropic => &value["max_tokens"],
        Api::OpenAi => &value["max_output_tokens"],
        Api::Gemini => &value["generationConfig"]["maxOutputTokens"],
    };
    if let Some(asked) = max_key.as_u64() {
        assert!(facts.max_output_tokens.is_some_and(|m| m >= asked), "{asked} not seen");
    }
    match &value["model"] {
        serde_json::Value::Null => {}
        serde_json::Value::String(m) if m.len() <= 256 => assert!(
            facts.unreadable_model || facts.models.contains(m),
            "the model {m:?} went unseen"
        ),
        _ => assert!(facts.unreadable_model, "a model not read whole went unflagged"),
    }
    let Some(tools) = value["tools"].as_array() else { return };
    for tool in tools {
        let named = match api {
            Api::Gemini => tool
                .as_object()
                .is_some_and(|t| t.contains_key("googleSearch") || t.contains_key("codeExecution")),
            _ => tool["type"].as_str().is_some_and(|t| {
                t.starts_with("web_search") || t == "code_interpreter" || t.starts_with("code_execution_")
            }),
        };
        if named {
            let hosted = &facts.hosted;
            assert!(
                hosted.contains(&HostedTool::WebSearch) || hosted.contains(&HostedTool::CodeExecution),
                "a provider-side tool went unseen: {tool}"
            );
        }
    }
}
