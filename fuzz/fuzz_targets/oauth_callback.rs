//! Arbitrary bytes as the head of a request to `tools login`'s loopback
//! listener (substrat_broker::upstream_supervisor::oauth::login), where
//! anything on the host can connect. Invariants: never panics; a target
//! taken is a GET of exactly the callback path, printable ASCII without
//! spaces, and a prefix of the first line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::upstream_supervisor::oauth::login::{CALLBACK_PATH, callback_target};

fuzz_target!(|data: &[u8]| {
    if let Some(target) = callback_target(data) {
        assert!(data.starts_with(b"GET "));
        assert!(target.bytes().all(|b| b.is_ascii_graphic()));
        assert_eq!(target.split('?').next(), Some(CALLBACK_PATH));
        let line = data.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or(&[]);
        assert!(line.windows(target.len()).any(|w| w == target.as_bytes()));
    }
});
