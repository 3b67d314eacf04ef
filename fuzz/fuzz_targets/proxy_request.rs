//! Arbitrary bytes as what an agent sends the egress proxy (a request
//! head), then the decision on the host and port it names. Invariants:
//! parsing never panics; a target names a lowercase host and a non-zero
//! port; a forwarded head is one request ending in a blank line with no
//! `Proxy-` header left; a name the rules allow is never an IP literal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_proxy::ProxyRules;
use substrat_proxy::request::{Target, parse_request};

fuzz_target!(|data: &[u8]| {
    let Ok(head) = std::str::from_utf8(data) else { return };
    let Ok(target) = parse_request(head) else { return };
    let (host, port) = match &target {
        Target::Connect { host, port } => (host, *port),
        Target::Forward { host, port, head, .. } => {
            assert!(head.ends_with("\r\n\r\n"), "{head:?}");
            let lower = head.to_ascii_lowercase();
            assert!(!lower.contains("\r\nproxy-"), "{head:?}");
            // One request: the blank line only at the end, no bare LF.
            assert_eq!(head.matches("\r\n\r\n").count(), 1, "{head:?}");
            assert_eq!(head.matches('\n').count(), head.matches("\r\n").count(), "{head:?}");
            // Host comes from the URL, once.
            assert_eq!(lower.matches("\r\nhost:").count(), 1, "{head:?}");
            (host, *port)
        }
    };
    assert!(port > 0);
    assert_eq!(host, &host.to_ascii_lowercase());
    let rules = ProxyRules {
        allow: vec!["*".into()],
        ..ProxyRules::default()
    };
    if rules.check_name(host, port).is_ok() {
        assert!(host.parse::<std::net::IpAddr>().is_err(), "{host}");
        assert!(substrat_policy::hosts::valid_hostname(host), "{host}");
    }
});
