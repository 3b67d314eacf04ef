//! Arbitrary bytes as the operator's destinations file, then the
//! addresses each parsed destination admits. Invariants: parsing never
//! panics; a destination that parses has a name, a host pattern that is
//! not `*` and parses, and networks none of which is every address; it
//! admits only addresses on its networks, for a name its pattern matches.
#![no_main]

use std::net::IpAddr;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use substrat_policy::hosts::{HostMatch, HostPattern};
use substrat_proxy::destinations::parse;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(list) = parse(text, Path::new("fuzz.toml")) else { return };
    let probes: [IpAddr; 5] = [
        IpAddr::from([10, 20, 0, 5]),
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from([169, 254, 169, 254]),
        IpAddr::from([93, 184, 215, 14]),
        IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]),
    ];
    for destination in &list {
        assert!(!destination.name.is_empty());
        let pattern = HostPattern::parse(&destination.host).expect("a parsed destination's host");
        assert_ne!(pattern.host, HostMatch::Any);
        assert!(!destination.networks.is_empty());
        assert!(destination.networks.iter().all(|n| n.prefix_len() > 0));
        let host = match &pattern.host {
            HostMatch::Exact(name) => name.clone(),
            HostMatch::Below(suffix) => format!("x{suffix}"),
            HostMatch::Any => unreachable!(),
        };
        let port = pattern.port.unwrap_or(443);
        for ip in &probes {
            let on_networks = destination.networks.iter().any(|n| n.contains(ip));
            assert_eq!(destination.admits(&host, port, ip), on_networks, "{destination:?} {ip}");
            // Never for a name its pattern does not match.
            assert!(!destination.admits("unrelated.invalid", port, ip) || pattern.matches("unrelated.invalid", port));
        }
    }
});
