//! Host patterns of the `proxy` network mode: `example.com` (that name),
//! `*.example.com` (names below it, not itself), `*` (any name), each with
//! an optional `:port`. Without a port a pattern allows 80 and 443.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.suffix`: stored with its leading dot (`.example.com`).
    Below(String),
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    pub host: HostMatch,
    pub port: Option<u16>,
}

/// Ports a pattern without `:port` allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A DNS name as the proxy accepts it: lowercase labels of letters, digits
/// and `-`, dot-separated, at most 253 characters, the last label with a
/// letter and no `0x` (`2130706433`, `0x7f.1`, `127.1` are addresses to a
/// resolver, not names).
pub fn valid_hostname(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or("");
    let named_tld = last.chars().any(|c| c.is_ascii_lowercase()) && !last.starts_with("0x");
    named_tld
        && !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<Self, HostPatternError> {
        let bad = |why| HostPatternError {
            pattern: text.to_string(),
            why,
        };
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad(HostPatternFault::Port))?;
                (host, Some(port))
            }
            None => (text, None),
        };
        let host = if host == "*" {
            HostMatch::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !valid_hostname(suffix) {
                return Err(bad(HostPatternFault::Suffix(suffix.to_string())));
            }
            HostMatch::Below(format!(".{suffix}"))
        } else if valid_hostname(host) {
            HostMatch::Exact(host.to_string())
        } else {
            return Err(bad(HostPatternFault::Shape));
        };
        Ok(Self { host, port })
    }

    /// Whether `host` (lowercase) on `port` matches, as an allow rule: a
    /// pattern without a port allows 80 and 443.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok && self.matches_host(host)
    }

    /// Whether `host` on `port` matches, as a deny rule: a pattern without
    /// a port denies every port.
    pub fn denies(&self, host: &str, port: u16) -> bool {
        self.port.is_none_or(|p| p == port) && self.matches_host(host)
    }

    fn matches_host(&self, host: &str) -> bool {
        match &self.host {
            HostMatch::Exact(name) => name == host,
            HostMatch::Below(suffix) => {
                host.len() > suffix.len() && host.ends_with(suffix.as_str())
            }
            HostMatch::Any => true,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Exact(name) => f.write_str(name)?,
            HostMatch::Below(suffix) => write!(f, "*{suffix}")?,
            HostMatch::Any => f.write_str("*")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_match() {
        let exact = HostPattern::parse("api2.cursor.sh").unwrap();
        assert!(exact.matches("api2.cursor.sh", 443) && exact.matches("api2.cursor.sh", 80));
        assert!(!exact.matches("api2.cursor.sh", 22) && !exact.matches("x.api2.cursor.sh", 443));
        let below = HostPattern::parse("*.cursor.sh:443").unwrap();
        assert!(below.matches("api2.cursor.sh", 443) && below.matches("a.b.cursor.sh", 443));
        assert!(
            !below.matches("cursor.sh", 443),
            "the suffix itself is not below itself"
        );
        assert!(!below.matches("evilcursor.sh", 443) && !below.matches("api2.cursor.sh", 80));
        assert!(
            HostPattern::parse("*")
                .unwrap()
                .matches("anything.example", 80)
        );
        assert_eq!(below.to_string(), "*.cursor.sh:443");
        let deny = HostPattern::parse("evil.example").unwrap();
        assert!(deny.denies("evil.example", 8443) && deny.denies("evil.example", 443));
        assert!(
            !HostPattern::parse("evil.example:443")
                .unwrap()
                .denies("evil.example", 8443)
        );
        for bad in [
            "",
            "Upper.example",
            "a b",
            "*.",
            "x:0",
            "x:99999",
            "[::1]:443",
            "-x.example",
            "*x.example",
            "2130706433",
            "127.1",
            "0x7f.0x1",
            "a.0x1f",
            "10.0.0.1",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }
}

/// A host pattern that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{pattern}`: {why}")]
pub struct HostPatternError {
    pub pattern: String,
    pub why: HostPatternFault,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternFault {
    #[error("the port must be 1-65535")]
    Port,
    #[error("`{0}` is not a lowercase DNS name")]
    Suffix(String),
    #[error("expected `name`, `*.name` or `*` (lowercase DNS names, optional `:port`)")]
    Shape,
}
