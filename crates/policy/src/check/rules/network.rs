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
    if proxy.test_allow_private {
        e.at(
            "proxy.test_allow_private",
            "loopback and private addresses are reachable through the proxy",
        );
    }
    if !proxy.test_hosts.is_empty() {
        e.at(
            "proxy.test_hosts",
            "names are resolved from the policy, not DNS",
        );
    }
}
