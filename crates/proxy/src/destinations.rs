//! Destinations only an operator can allow: private endpoints (a package
//! mirror, a model server on the company network) that agents' proxies
//! may reach although their names resolve to private addresses. They come
//! from a file the operator hands the daemon or `run` (`--destinations
//! FILE`), never from a policy: roles' policies are what an agent's team
//! can widen.
//!
//! ```toml
//! [[destination]]
//! name = "pypi-mirror"
//! host = "pypi.corp.example"     # a name or *.name, optional :port (80 and 443 without)
//! networks = ["10.20.0.0/16"]    # the private addresses it may resolve to
//! ```
//!
//! A destination widens only where a name may lead: the sandbox's policy
//! must still allow the host in `proxy.allow`, and its denials still win.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use substrat_policy::hosts::{HostMatch, HostPattern};

/// One private endpoint the operator vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Named in the proxy's audit line of each connection it admits.
    pub name: String,
    /// A host pattern as in `proxy.allow`.
    pub host: String,
    /// The non-public addresses the host may resolve to.
    pub networks: Vec<IpNet>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationsFile {
    #[serde(default)]
    destination: Vec<Destination>,
}

#[derive(Debug, thiserror::Error)]
pub enum DestinationsError {
    #[error("cannot read the destinations file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: destination `{name}`: {fault}")]
    Invalid {
        path: PathBuf,
        name: String,
        fault: DestinationFault,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationFault {
    #[error("the name must be 1-64 characters of a-z, 0-9, `-`, `_` and `.`")]
    Name,
    #[error("the name is used twice")]
    Duplicate,
    #[error("{0}")]
    Host(substrat_policy::hosts::HostPatternError),
    #[error("`host = \"*\"` would let every name resolve to private addresses")]
    AnyHost,
    #[error("`networks` is empty")]
    NoNetworks,
    #[error("`{0}` is every address, not an endpoint's network")]
    Everything(IpNet),
}

/// The destinations in the file at `path` (every entry checked: one that
/// could not be read would be skipped, and an operator would not know).
pub fn load(path: &Path) -> Result<Vec<Destination>, DestinationsError> {
    let text = std::fs::read_to_string(path).map_err(|source| DestinationsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// The destinations in `text`, read from `path` (named in errors).
pub fn parse(text: &str, path: &Path) -> Result<Vec<Destination>, DestinationsError> {
    let file: DestinationsFile = toml::from_str(text).map_err(|e| DestinationsError::Syntax {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut names = BTreeSet::new();
    for destination in &file.destination {
        let invalid = |fault| DestinationsError::Invalid {
            path: path.to_path_buf(),
            name: destination.name.clone(),
            fault,
        };
        destination.validate().map_err(invalid)?;
        if !names.insert(destination.name.as_str()) {
            return Err(invalid(DestinationFault::Duplicate));
        }
    }
    Ok(file.destination)
}

impl Destination {
    fn validate(&self) -> Result<(), DestinationFault> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
            });
        if !name_ok {
            return Err(DestinationFault::Name);
        }
        let pattern = HostPattern::parse(&self.host).map_err(DestinationFault::Host)?;
        if pattern.host == HostMatch::Any {
            return Err(DestinationFault::AnyHost);
        }
        if self.networks.is_empty() {
            return Err(DestinationFault::NoNetworks);
        }
        if let Some(all) = self.networks.iter().find(|n| n.prefix_len() == 0) {
            return Err(DestinationFault::Everything(*all));
        }
        Ok(())
    }

    /// May `host:port` lead to `address` by this destination?
    pub fn admits(&self, host: &str, port: u16, address: &IpAddr) -> bool {
        HostPattern::parse(&self.host).is_ok_and(|p| p.matches(host, port))
            && self.networks.iter().any(|n| n.contains(address))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Vec<Destination>, String> {
        parse(text, Path::new("d.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_destination_admits_its_host_on_its_networks_only() {
        let list = parsed(
            "[[destination]]\nname = \"mirror\"\nhost = \"pypi.corp.test\"\nnetworks = [\"10.20.0.0/16\", \"fd00::/8\"]\n",
        )
        .unwrap();
        let mirror = &list[0];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(mirror.admits("pypi.corp.test", 443, &ip("10.20.1.2")));
        assert!(mirror.admits("pypi.corp.test", 80, &ip("fd12::1")));
        // Another network, another name, a port the pattern does not name.
        assert!(!mirror.admits("pypi.corp.test", 443, &ip("10.21.0.1")));
        assert!(!mirror.admits("pypi.corp.test", 443, &ip("127.0.0.1")));
        assert!(!mirror.admits("other.corp.test", 443, &ip("10.20.1.2")));
        assert!(!mirror.admits("pypi.corp.test", 8080, &ip("10.20.1.2")));
        // An IPv4-mapped disguise is not the IPv4 network.
        assert!(!mirror.admits("pypi.corp.test", 443, &ip("::ffff:10.20.1.2")));
    }

    #[test]
    fn every_fault_is_named_with_the_file_and_the_destination() {
        let one = |body: &str| parsed(&format!("[[destination]]\n{body}\n")).unwrap_err();
        assert_eq!(
            one("name = \"m\"\nhost = \"*\"\nnetworks = [\"10.0.0.0/8\"]"),
            "d.toml: destination `m`: `host = \"*\"` would let every name resolve to private addresses"
        );
        assert_eq!(
            one("name = \"m\"\nhost = \"a.test\"\nnetworks = [\"0.0.0.0/0\"]"),
            "d.toml: destination `m`: `0.0.0.0/0` is every address, not an endpoint's network"
        );
        assert_eq!(
            one("name = \"m\"\nhost = \"a.test\"\nnetworks = []"),
            "d.toml: destination `m`: `networks` is empty"
        );
        assert_eq!(
            one("name = \"M M\"\nhost = \"a.test\"\nnetworks = [\"10.0.0.0/8\"]"),
            "d.toml: destination `M M`: the name must be 1-64 characters of a-z, 0-9, `-`, `_` and `.`"
        );
        assert!(
            one("name = \"m\"\nhost = \"A.test\"\nnetworks = [\"10.0.0.0/8\"]")
                .starts_with("d.toml: destination `m`: ")
        );
        assert!(
            one("name = \"m\"\nhost = \"a.test\"\nnetworks = [\"10.0.0.0/33\"]")
                .starts_with("d.toml: ")
        );
        assert!(
            one("name = \"m\"\nhost = \"a.test\"\nnetworks = [\"10.0.0.0/8\"]\nport = 1")
                .contains("unknown field `port`")
        );
        let twice =
            "[[destination]]\nname = \"m\"\nhost = \"a.test\"\nnetworks = [\"10.0.0.0/8\"]\n";
        assert_eq!(
            parsed(&format!("{twice}{twice}")).unwrap_err(),
            "d.toml: destination `m`: the name is used twice"
        );
        assert_eq!(parsed("").unwrap(), Vec::new());
    }
}
