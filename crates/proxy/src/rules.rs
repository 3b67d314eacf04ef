//! The proxy's decisions, pure: may this agent reach `host:port`, and are
//! the addresses it resolves to ones an agent may reach? Deny wins over
//! allow; every address must be public (no loopback, private ranges,
//! link-local and cloud metadata, the host's own addresses, IPv4-mapped or
//! NAT64 disguises of those).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use substrat_policy::hosts::HostPattern;
use substrat_policy::model::ProxyPolicy;

use crate::destinations::Destination;

/// The rules of one sandbox's proxy, as the launcher hands them over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Test only (`TestSwitches`, never a policy): private and loopback
    /// addresses pass.
    pub allow_private: bool,
    /// Test only, like `allow_private`: fixed answers instead of DNS.
    pub hosts: BTreeMap<String, IpAddr>,
    /// The host's own addresses, refused like private ones.
    pub own_addresses: Vec<IpAddr>,
    /// The operator's private endpoints (`--destinations FILE`): a name
    /// of one may resolve to the non-public addresses it names.
    #[serde(default)]
    pub destinations: Vec<Destination>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("`{0}` is not a host name the proxy accepts")]
    BadHost(String),
    #[error("{0}:{1} is not in the allowlist")]
    NotAllowed(String, u16),
    #[error("{0}:{1} is denied by `{2}`")]
    Denied(String, u16, String),
    #[error("{0} resolves to {1}, which is not a public address ({2})")]
    NotPublic(String, IpAddr, &'static str),
    #[error("{0} does not resolve")]
    NoAddress(String),
}

/// The proxy's switches for tests: from the launcher's own command line
/// (the operator's), never from a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestSwitches {
    /// Private and loopback addresses pass.
    pub allow_private: bool,
    /// Fixed answers instead of DNS.
    pub hosts: BTreeMap<String, IpAddr>,
}

/// A policy that sets a switch for tests: no launch takes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: a switch for tests, never taken from a policy (remove it; `substrat-sandbox check` reports it as SBX039)",
    .0.join(", ")
)]
pub struct PolicyTestSwitches(pub Vec<&'static str>);

impl ProxyRules {
    /// The rules of `policy`, refused when it sets a switch for tests;
    /// those come from `switches` only.
    pub fn from_policy(
        policy: &ProxyPolicy,
        own_addresses: Vec<IpAddr>,
        destinations: Vec<Destination>,
        switches: TestSwitches,
    ) -> Result<Self, PolicyTestSwitches> {
        let set = policy.test_switches();
        if !set.is_empty() {
            return Err(PolicyTestSwitches(set));
        }
        Ok(Self {
            allow: policy.allow.clone(),
            deny: policy.deny.clone(),
            allow_private: switches.allow_private,
            hosts: switches.hosts,
            own_addresses,
            destinations,
        })
    }

    /// Every pattern must parse: a rule the proxy could not read would be
    /// skipped, and a skipped deny fails open.
    pub fn validate(&self) -> Result<(), substrat_policy::hosts::HostPatternError> {
        for pattern in self.allow.iter().chain(&self.deny) {
            HostPattern::parse(pattern)?;
        }
        Ok(())
    }

    /// May `host:port` be asked for at all? (Before any resolution.)
    pub fn check_name(&self, host: &str, port: u16) -> Result<(), Refusal> {
        if !substrat_policy::hosts::valid_hostname(host) || host.parse::<IpAddr>().is_ok() {
            // IP literals and odd names never match a name pattern.
            return Err(Refusal::BadHost(host.to_string()));
        }
        let parse = |p: &String| HostPattern::parse(p).ok();
        if let Some(rule) = self
            .deny
            .iter()
            .find(|p| parse(p).is_some_and(|p| p.denies(host, port)))
        {
            return Err(Refusal::Denied(host.to_string(), port, rule.clone()));
        }
        if self
            .allow
            .iter()
            .any(|p| parse(p).is_some_and(|p| p.matches(host, port)))
        {
            Ok(())
        } else {
            Err(Refusal::NotAllowed(host.to_string(), port))
        }
    }

    /// Every address must be reachable for an agent: public, or on the
    /// networks of an operator's destination for `host:port` (its name
    /// returned, for the audit line). The proxy then connects to exactly
    /// these (no second resolution).
    pub fn check_addresses(
        &self,
        host: &str,
        port: u16,
        addresses: &[IpAddr],
    ) -> Result<Option<&str>, Refusal> {
        if addresses.is_empty() {
            return Err(Refusal::NoAddress(host.to_string()));
        }
        if self.allow_private {
            return Ok(None);
        }
        let mut by = None;
        for ip in addresses {
            let why = not_public(ip).or_else(|| {
                self.own_addresses
                    .contains(ip)
                    .then_some("this host's own address")
            });
            let Some(why) = why else { continue };
            match self.destinations.iter().find(|d| d.admits(host, port, ip)) {
                Some(destination) => by = Some(destination.name.as_str()),
                None => return Err(Refusal::NotPublic(host.to_string(), *ip, why)),
            }
        }
        Ok(by)
    }
}

/// Why an address is not public, if it is not.
pub fn not_public(ip: &IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => not_public_v4(v4),
        IpAddr::V6(v6) => not_public_v6(v6),
    }
}

fn in_v4(ip: &Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    (u32::from(*ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn not_public_v4(ip: &Ipv4Addr) -> Option<&'static str> {
    let ranges: [([u8; 4], u32, &'static str); 16] = [
        ([0, 0, 0, 0], 8, "\"this\" network"),
        ([168, 63, 129, 16], 32, "cloud platform endpoint (Azure)"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "carrier-grade NAT"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local, cloud metadata"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4 relay"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved, broadcast"),
    ];
    ranges
        .iter()
        .find(|(net, bits, _)| in_v4(ip, *net, *bits))
        .map(|(_, _, why)| *why)
}

fn not_public_v6(ip: &Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // ::ffff:a.b.c.d and the deprecated ::a.b.c.d: an IPv4 address in
    // disguise; a resolver has no business returning one.
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return Some("IPv4-mapped or -compatible");
    }
    // NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48): judge the IPv4
    // address inside.
    if s[0] == 0x64 && s[1] == 0xff9b {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        if s[2] == 1 {
            return Some("local-use NAT64");
        }
        return not_public_v4(&v4).map(|_| "NAT64 form of a non-public IPv4 address");
    }
    let first: [(u16, u16, &'static str); 5] = [
        (0xfc00, 0xfe00, "unique local"),
        (0xfe80, 0xffc0, "link-local"),
        (0xfec0, 0xffc0, "site-local"),
        (0xff00, 0xff00, "multicast"),
        (0x2002, 0xffff, "6to4"),
    ];
    if let Some((_, _, why)) = first.iter().find(|(net, mask, _)| s[0] & mask == *net) {
        return Some(why);
    }
    // Inside 2001::/16 only these are special; the rest is public space.
    if s[0] != 0x2001 {
        return None;
    }
    match (s[1], s[2]) {
        (0x0000, _) => Some("Teredo"),
        (0x0db8, _) => Some("documentation"),
        (0x0002, 0x0000) => Some("benchmarking"),
        (x, _) if x & 0xfff0 == 0x0010 => Some("ORCHID"),
        (x, _) if x & 0xfff0 == 0x0020 => Some("ORCHIDv2"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> ProxyRules {
        ProxyRules {
            allow: vec!["api2.cursor.sh".into(), "*.example.com:443".into()],
            deny: vec!["evil.example.com".into()],
            ..ProxyRules::default()
        }
    }

    #[test]
    fn names_allowed_denied_and_refused() {
        let r = rules();
        assert_eq!(r.check_name("api2.cursor.sh", 443), Ok(()));
        assert_eq!(r.check_name("a.example.com", 443), Ok(()));
        assert_eq!(
            r.check_name("a.example.com", 80),
            Err(Refusal::NotAllowed("a.example.com".into(), 80))
        );
        assert_eq!(
            r.check_name("evil.example.com", 443),
            Err(Refusal::Denied(
                "evil.example.com".into(),
                443,
                "evil.example.com".into()
            )),
            "deny wins"
        );
        assert_eq!(
            r.check_name("127.0.0.1", 443),
            Err(Refusal::BadHost("127.0.0.1".into()))
        );
        assert!(
            r.check_name("API2.cursor.sh", 443).is_err(),
            "callers lowercase first"
        );
        for numeric in ["2130706433", "127.1", "0x7f.0x1"] {
            assert_eq!(
                r.check_name(numeric, 443),
                Err(Refusal::BadHost(numeric.into()))
            );
        }
        let any_port = ProxyRules {
            allow: vec!["*:8443".into()],
            deny: vec!["evil.example.com".into()],
            ..ProxyRules::default()
        };
        assert!(
            any_port.check_name("evil.example.com", 8443).is_err(),
            "a deny without a port covers every port"
        );
        assert!(any_port.validate().is_ok());
        let broken = ProxyRules {
            deny: vec!["not a pattern".into()],
            ..ProxyRules::default()
        };
        assert!(broken.validate().is_err());
    }

    #[test]
    fn only_public_addresses_pass() {
        let r = rules();
        let refused = [
            "127.0.0.1",
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:8.8.8.8",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "2002:c0a8:101::1",
            "2001::1",
            "2001:2::1",
            "2001:10::1",
            "168.63.129.16",
        ];
        for ip in refused {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(
                matches!(
                    r.check_addresses("x.example.com", 443, &[ip]),
                    Err(Refusal::NotPublic(..))
                ),
                "{ip}"
            );
        }
        let public: Vec<IpAddr> = [
            "93.184.215.14",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2001:4860:4860::8888",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(r.check_addresses("x.example.com", 443, &public), Ok(None));
        // One bad address among good ones refuses the lot.
        let mixed = [public[0], "10.0.0.1".parse().unwrap()];
        assert!(r.check_addresses("x.example.com", 443, &mixed).is_err());
        assert_eq!(
            r.check_addresses("x.example.com", 443, &[]),
            Err(Refusal::NoAddress("x.example.com".into()))
        );
        let own = ProxyRules {
            own_addresses: vec![public[0]],
            ..rules()
        };
        assert!(
            own.check_addresses("x.example.com", 443, &public[..1])
                .is_err(),
            "the host itself"
        );
        let test = ProxyRules {
            allow_private: true,
            ..rules()
        };
        assert_eq!(
            test.check_addresses("x", 443, &["127.0.0.1".parse().unwrap()]),
            Ok(None)
        );
    }

    #[test]
    fn an_operator_destination_admits_its_networks_for_its_host_only() {
        let mirror = Destination {
            name: "mirror".into(),
            host: "mirror.corp.test".into(),
            networks: vec!["10.20.0.0/16".parse().unwrap()],
        };
        let r = ProxyRules {
            destinations: vec![mirror],
            own_addresses: vec!["10.20.0.9".parse().unwrap()],
            ..rules()
        };
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(
            r.check_addresses("mirror.corp.test", 443, &[ip("10.20.0.5")]),
            Ok(Some("mirror"))
        );
        // The operator named the network: its own address on it too.
        assert_eq!(
            r.check_addresses("mirror.corp.test", 443, &[ip("10.20.0.9")]),
            Ok(Some("mirror"))
        );
        // Public addresses need no destination.
        assert_eq!(
            r.check_addresses("mirror.corp.test", 443, &[ip("93.184.215.14")]),
            Ok(None)
        );
        // Outside its networks, another name, another port: refused.
        for (host, port, address) in [
            ("mirror.corp.test", 443, "10.21.0.5"),
            ("mirror.corp.test", 443, "127.0.0.1"),
            ("mirror.corp.test", 443, "169.254.169.254"),
            ("other.corp.test", 443, "10.20.0.5"),
            ("mirror.corp.test", 22, "10.20.0.5"),
        ] {
            assert!(
                matches!(
                    r.check_addresses(host, port, &[ip(address)]),
                    Err(Refusal::NotPublic(..))
                ),
                "{host}:{port} -> {address}"
            );
        }
        // One address off its networks refuses the lot.
        assert!(
            r.check_addresses("mirror.corp.test", 443, &[ip("10.20.0.5"), ip("10.0.0.1")])
                .is_err()
        );
    }
}
