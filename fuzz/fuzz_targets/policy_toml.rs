//! Arbitrary bytes as a policy file: loading never panics, every error has a
//! position inside the input, and a policy that loads can be audited.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use substrat_policy::{LoadOptions, load_str};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("fuzz.toml");
    match load_str(path, text, &LoadOptions::default()) {
        Ok(policy) => {
            let findings = substrat_policy::check::check_policy(&policy);
            let score = substrat_policy::check::exposure_score(&findings);
            assert!((0.0..=10.0).contains(&score));
        }
        Err(errors) => {
            assert!(!errors.0.is_empty());
            for err in &errors.0 {
                assert!(err.location.line >= 1 && err.location.column >= 1);
                if err.location.file == path {
                    assert!(err.location.line <= text.lines().count().max(1) + 1, "{err}");
                }
            }
        }
    }
});
