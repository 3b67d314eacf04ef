#![forbid(unsafe_code)]
//! The egress proxy of `network = "proxy"`: the only way out of a sandbox
//! that has a network namespace with loopback alone. Run by the launcher
//! as a separate process (`substrat-sandbox __proxy`), reached inside the
//! sandbox through a bound Unix socket bridged to a loopback port.

pub mod destinations;
pub mod request;
pub mod rules;
pub mod server;

pub use destinations::{Destination, DestinationsError};
pub use request::{RequestError, Target, parse_request};
pub use rules::{PolicyTestSwitches, ProxyRules, Refusal, TestSwitches, not_public};
pub use server::{Audit, serve};

/// The host's own addresses (refused like private ones). An error when
/// they cannot be listed: the proxy does not start without them.
pub fn own_addresses() -> nix::Result<Vec<std::net::IpAddr>> {
    let addresses = nix::ifaddrs::getifaddrs()?;
    Ok(addresses
        .filter_map(|a| {
            let address = a.address?;
            if let Some(v4) = address.as_sockaddr_in() {
                return Some(std::net::IpAddr::V4(v4.ip()));
            }
            address
                .as_sockaddr_in6()
                .map(|v6| std::net::IpAddr::V6(v6.ip()))
        })
        .collect())
}
