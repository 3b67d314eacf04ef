//! Arbitrary bytes as a request to the roles' HTTP endpoints
//! (substrat_broker::role_http): a method, a path, an Authorization header
//! and a body, split at NUL bytes. Invariants: nothing panics; a prompt
//! route names a non-empty role; only the exact `Bearer <token>` header is
//! authorized; accepted arguments came from a body within the limit, and
//! a body with them serialized again parses to the same arguments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::role_http::{MAX_BODY, Route, authorized, prompt_args, route};

const TOKEN: &str = "fuzz-token-0123456789";

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |b| *b == 0);
    let method = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let header = parts.next();
    let body = parts.next().unwrap_or_default();
    match route(&method, &path) {
        Route::Prompt { name } => assert!(!name.is_empty() && method == "POST"),
        Route::List | Route::Metrics => assert_eq!(method, "GET"),
        Route::WrongMethod { .. } | Route::NotFound => {}
    }
    let expected = format!("Bearer {TOKEN}");
    assert_eq!(authorized(header, TOKEN), header == Some(expected.as_bytes()));
    if let Ok(args) = prompt_args(body) {
        assert!(body.len() <= MAX_BODY);
        let again = serde_json::to_vec(&serde_json::json!({"arguments": args})).expect("serializes");
        assert_eq!(prompt_args(&again), Ok(args));
    }
});
