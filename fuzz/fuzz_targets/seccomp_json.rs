//! Arbitrary bytes as a seccomp profile: parsing never panics, errors carry
//! a position, and a parsed profile can be analysed.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use substrat_policy::seccomp::SeccompProfile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match SeccompProfile::parse(Path::new("fuzz.json"), text) {
        Ok(profile) => {
            let _ = profile.dangerous_allowed();
        }
        Err(err) => assert!(err.location.line >= 1),
    }
});
