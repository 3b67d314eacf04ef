//! The command's environment: nothing of the host's but what the policy
//! allows, the policy's own values, the proxy's variables.

use substrat_policy::LoadedPolicy;
use substrat_policy::paths::ExpandContext;

use super::{AgentContext, BridgePlan};

/// An empty environment plus the allowed host variables, then the policy's
/// fixed values (which win). Sorted, so plans compare stably.
pub(super) fn environment(
    policy: &LoadedPolicy,
    ctx: &AgentContext,
    expand: &ExpandContext,
    proxy: Option<&BridgePlan>,
) -> Vec<(String, String)> {
    let env = &policy.policy.env;
    let allowed = |name: &str| {
        ctx.pass_env.iter().any(|n| n == name)
            || env
                .allow
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name == pattern,
                })
    };
    let mut out: std::collections::BTreeMap<String, String> = ctx
        .host_env
        .iter()
        .filter(|(name, _)| allowed(name))
        .cloned()
        .collect();
    for (name, value) in &env.set {
        out.insert(name.clone(), expand_value(value, expand));
    }
    // The proxy's variables last: the only way out is through it.
    if let Some(proxy) = proxy {
        let url = format!("http://127.0.0.1:{}", proxy.port);
        for name in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "ALL_PROXY",
            "https_proxy",
            "http_proxy",
            "all_proxy",
        ] {
            out.insert(name.to_string(), url.clone());
        }
        for name in ["NO_PROXY", "no_proxy"] {
            out.insert(name.to_string(), "localhost,127.0.0.1,::1".to_string());
        }
    }
    out.into_iter().collect()
}

/// `${HOME}`, `${WORKSPACE}` and `${AGENT_ID}` in an environment value.
fn expand_value(value: &str, ctx: &ExpandContext) -> String {
    value
        .replace("${HOME}", &ctx.home.to_string_lossy())
        .replace("${WORKSPACE}", &ctx.workspace.to_string_lossy())
        .replace("${AGENT_ID}", &ctx.agent_id)
}
