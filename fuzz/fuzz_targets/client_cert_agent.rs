//! Arbitrary bytes as a relay's client certificate (DER), as the TLS
//! listener reads the agent it names (`tls::agent_named`, its URI SAN
//! `urn:substrat:agent:ID`). Invariants, not only "no panic":
//! - an agent named is one the bytes spell out after the URN prefix;
//! - the same bytes name the same agent again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::tls::agent_named;

fuzz_target!(|data: &[u8]| {
    let named = agent_named(data);
    if let Some(agent) = &named {
        let spelled = format!("urn:substrat:agent:{agent}");
        assert!(data.windows(spelled.len()).any(|w| w == spelled.as_bytes()));
    }
    assert_eq!(agent_named(data), named);
});
