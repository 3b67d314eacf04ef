//! Arbitrary bytes as what crosses the model gateway: the first bytes a
//! request path and query (with header values), the rest a model's answer
//! split into chunks at arbitrary points. Invariants: nothing panics; a
//! routed path is one of the forwarded calls; the query sent upstream never
//! carries a key; the usage read from an answer does not depend on how it
//! was chunked; a total is the sum of its parts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_gateway::Api;
use substrat_gateway::api::{presented_keys, query_without_key, route};
use substrat_gateway::usage::{Framing, UsageTap};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let split = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (head, answer) = rest.split_at(split);
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
        if let Some(q) = query_without_key(query) {
            assert!(!q.split('&').any(|p| p.starts_with("key=")), "{q:?}");
        }
        let headers = [("x-api-key", head), ("authorization", head)];
        let keys = presented_keys(headers.into_iter(), query);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
    let api = Api::ALL[usize::from(selector % 3)];
    let framing = if selector & 4 == 0 { Framing::EventStream } else { Framing::Json };
    let whole = {
        let mut tap = UsageTap::new(api, framing);
        tap.feed(answer);
        tap.finish()
    };
    let step = usize::from(selector >> 3).max(1);
    let mut tap = UsageTap::new(api, framing);
    for chunk in answer.chunks(step) {
        tap.feed(chunk);
    }
    let chunked = tap.finish();
    assert_eq!(whole, chunked, "chunking changed what was read");
    assert_eq!(whole.total(), whole.input_tokens.saturating_add(whole.output_tokens));
});
