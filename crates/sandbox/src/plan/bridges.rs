//! The loopback ports inside a sandbox that reach Unix sockets bound in
//! from outside: the egress proxy's, the model gateway's and the broker's
//! (MCP streamable HTTP). Each needs a network namespace of the sandbox's
//! own: with the host's, a port on 127.0.0.1 would be the host's.

use std::path::{Path, PathBuf};

use serde::Serialize;
use substrat_policy::model::NetworkMode;

use super::{AgentContext, BROKER_SOCKET_INSIDE, PlanError};

/// A loopback port inside the sandbox that reaches a Unix socket bound in
/// from outside (the egress proxy's, the model gateway's, the broker's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
// Deserialized only by the bwrap helper: an unknown field means a helper
// from another build, refused rather than half understood.
#[serde(deny_unknown_fields)]
pub struct BridgePlan {
    /// 127.0.0.1:PORT inside, served by the bridge.
    pub port: u16,
    /// The Unix socket inside it reaches (an agent bind from the launcher).
    pub socket: PathBuf,
}

/// The loopback port the proxy is reached on inside the sandbox.
pub const PROXY_PORT: u16 = 3128;
/// Where the launcher binds the proxy's socket.
pub const PROXY_SOCKET_INSIDE: &str = "/run/substrat/proxy.sock";
/// The loopback port the model gateway is reached on inside the sandbox.
pub const GATEWAY_PORT: u16 = 3129;
/// Where the daemon binds an agent's gateway socket.
pub const GATEWAY_SOCKET_INSIDE: &str = "/run/substrat/gateway.sock";
/// The loopback port the broker's MCP streamable HTTP endpoint is reached
/// on inside the sandbox (the agent's broker socket, bridged).
pub const MCP_PORT: u16 = 3130;
/// The path of the broker's MCP endpoint (any path is served; this is the
/// one the agent CLIs are given).
pub const MCP_PATH: &str = "/mcp";

/// The URL an agent CLI is given for the broker's MCP endpoint, when a
/// sandbox of `network` bridges it (`mcp_plan`): none on the host's
/// network, where the stdio relay stays.
pub fn mcp_url(network: NetworkMode) -> Option<String> {
    (network != NetworkMode::Host).then(|| format!("http://127.0.0.1:{MCP_PORT}{MCP_PATH}"))
}

fn bound(ctx: &AgentContext, inside: &str) -> bool {
    ctx.agent_binds
        .iter()
        .any(|b| b.target == Path::new(inside))
}

/// The gateway's bridge when the launcher bound its socket in (a turn of
/// an agent CLI that talks to a model); refused without a network
/// namespace of the sandbox's own.
pub(super) fn gateway_plan(
    network: NetworkMode,
    ctx: &AgentContext,
) -> Result<Option<BridgePlan>, PlanError> {
    match (bound(ctx, GATEWAY_SOCKET_INSIDE), network) {
        (false, _) => Ok(None),
        (true, NetworkMode::Host) => Err(PlanError::GatewayOnHostNetwork),
        (true, _) => Ok(Some(BridgePlan {
            port: GATEWAY_PORT,
            socket: GATEWAY_SOCKET_INSIDE.into(),
        })),
    }
}

/// The broker's MCP endpoint, bridged when the launcher bound the agent's
/// broker socket in and the sandbox has a loopback of its own (with the
/// host's network the agent keeps the stdio relay: `mcp_url` is none).
pub(super) fn mcp_plan(network: NetworkMode, ctx: &AgentContext) -> Option<BridgePlan> {
    (bound(ctx, BROKER_SOCKET_INSIDE) && mcp_url(network).is_some()).then(|| BridgePlan {
        port: MCP_PORT,
        socket: BROKER_SOCKET_INSIDE.into(),
    })
}

/// `network = "proxy"`: the bridge's port, and the proxy's socket, which
/// the launcher must have bound in.
pub(super) fn proxy_plan(
    network: NetworkMode,
    ctx: &AgentContext,
) -> Result<Option<BridgePlan>, PlanError> {
    if network != NetworkMode::Proxy {
        return Ok(None);
    }
    if !bound(ctx, PROXY_SOCKET_INSIDE) {
        return Err(PlanError::ProxySocketMissing);
    }
    Ok(Some(BridgePlan {
        port: PROXY_PORT,
        socket: PROXY_SOCKET_INSIDE.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::{Access, AgentBind, build_plan};
    use super::*;
    use substrat_policy::{LoadOptions, load_str};

    fn plan_for(network: &str, binds: &[&str]) -> Result<super::super::LaunchPlan, PlanError> {
        let text = format!(
            "version = 1\nextends = \"worker\"\nnetwork = \"{network}\"\n{}",
            if network == "proxy" {
                "[proxy]\nallow = [\"a.test\"]\n"
            } else {
                ""
            }
        );
        let policy = load_str(Path::new("p.toml"), &text, &LoadOptions::default()).unwrap();
        let ctx = AgentContext {
            agent_binds: binds
                .iter()
                .map(|inside| AgentBind {
                    source: Path::new("/st/a1").join(Path::new(inside).file_name().unwrap()),
                    target: inside.into(),
                    access: Access::Ro,
                })
                .collect(),
            ..super::super::tests::context()
        };
        build_plan(&policy, &ctx)
    }

    fn ports(plan: &super::super::LaunchPlan) -> Vec<(u16, &Path)> {
        plan.bridges()
            .map(|b| (b.port, b.socket.as_path()))
            .collect()
    }

    #[test]
    fn the_broker_socket_is_bridged_on_a_loopback_of_the_sandboxs_own_only() {
        let all = [
            BROKER_SOCKET_INSIDE,
            GATEWAY_SOCKET_INSIDE,
            PROXY_SOCKET_INSIDE,
        ];
        let plan = plan_for("proxy", &all).unwrap();
        assert_eq!(
            ports(&plan),
            [
                (3128, Path::new("/run/substrat/proxy.sock")),
                (3129, Path::new("/run/substrat/gateway.sock")),
                (3130, Path::new("/run/substrat/broker.sock")),
            ]
        );
        let plan = plan_for("none", &[BROKER_SOCKET_INSIDE]).unwrap();
        assert_eq!(
            ports(&plan),
            [(3130, Path::new("/run/substrat/broker.sock"))]
        );
        assert_eq!(
            mcp_url(NetworkMode::None).as_deref(),
            Some("http://127.0.0.1:3130/mcp")
        );
        // The host's network: no bridge, no URL (the stdio relay stays),
        // and no error: the broker's socket is still bound for the relay.
        let plan = plan_for("host", &[BROKER_SOCKET_INSIDE]).unwrap();
        assert_eq!(ports(&plan), []);
        assert_eq!(mcp_url(NetworkMode::Host), None);
        // No broker socket bound (`substrat-sandbox run`): no bridge.
        let plan = plan_for("none", &[]).unwrap();
        assert_eq!(ports(&plan), []);
    }
}
