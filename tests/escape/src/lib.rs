#![forbid(unsafe_code)]
//! The escape suite lives in `tests/escape.rs`; the attacks themselves are
//! performed by the `substrat-probe` binary inside real sandboxes.
