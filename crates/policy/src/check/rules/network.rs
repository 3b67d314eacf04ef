//! Rules on the network: host networking, the egress proxy's allowlist.

use super::Emit;
use crate::load::LoadedPolicy;
use crate::model::NetworkMode;

pub(super) fn network_host(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.network == NetworkMode::Host {
        e.at(
            "network",
            "`network = \"host\"`: the agent shares the host's network stack",
        );
    }
}

pub(super) fn proxy_patterns(p: &LoadedPolicy) -> Option<&crate::model::ProxyPolicy> {
    (p.policy.network == NetworkMode::Proxy).then_some(p.policy.proxy.as_ref())?
}

pub(super) fn proxy_allows_any(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let Some(proxy) = proxy_patterns(p) else {
        return;
    };
    for pattern in &proxy.allow {
        if let Ok(parsed) = crate::hosts::HostPattern::parse(pattern)
            && parsed.host == crate::hosts::HostMatch::Any
        {
            e.at("proxy.allow", format!("`{pattern}` allows every host"));
        }
    }
}

pub(super) fn proxy_allows_nothing(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.network == NetworkMode::Proxy
        && proxy_patterns(p).is_none_or(|x| x.allow.is_empty())
    {
        e.at(
            "network",
            "`network = \"proxy\"` with no host in `proxy.allow`",
        );
    }
}

pub(super) fn proxy_test_settings(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let Some(proxy) = &p.policy.proxy else {
        return;
    };
    for key in proxy.test_switches() {
        e.at(key, "a switch for tests: every launch refuses this policy");
    }
}

/// Names that lead to the host or a private network by convention (RFC
/// 6761 `localhost`, 6762 `.local`, 8375 `home.arpa`; `.internal`, which
/// clouds use for metadata and private DNS; common private suffixes).
const PRIVATE_NAMES: [&str; 8] = [
    "localhost",
    "local",
    "internal",
    "lan",
    "home.arpa",
    "intranet",
    "corp",
    "private",
];

fn names_private_endpoint(host: &crate::hosts::HostMatch) -> bool {
    use crate::hosts::HostMatch;
    let name = match host {
        HostMatch::Exact(name) => name.as_str(),
        // Stored with its leading dot.
        HostMatch::Below(suffix) => suffix.trim_start_matches('.'),
        HostMatch::Any => return false,
    };
    PRIVATE_NAMES
        .iter()
        .any(|private| name == *private || name.ends_with(&format!(".{private}")))
}

pub(super) fn proxy_allows_private_name(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let Some(proxy) = proxy_patterns(p) else {
        return;
    };
    for pattern in &proxy.allow {
        if let Ok(parsed) = crate::hosts::HostPattern::parse(pattern)
            && names_private_endpoint(&parsed.host)
        {
            e.at(
                "proxy.allow",
                format!("`{pattern}` names a private endpoint (only the operator can allow one)"),
            );
        }
    }
}
