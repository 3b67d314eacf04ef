//! What the broker says about itself to every upstream server, local or
//! remote: its name, the one protocol version it offers, and the
//! capabilities it declares (none: no sampling, no roots, no elicitation,
//! as nothing behind the broker could answer them), and the check of the
//! version the server answers.

use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationCreateRequestMethod, Implementation, ProtocolVersion,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};

/// The version the broker offers in `initialize`: the newest with an
/// `initialize` handshake (rmcp's default, 2026-07-28, has none and
/// servers of today refuse it or answer an older one anyway).
pub const OFFERED_PROTOCOL: ProtocolVersion = ProtocolVersion::LATEST_WITH_INITIALIZE;

/// The broker's `initialize` parameters.
pub fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("substrat-sandbox", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(OFFERED_PROTOCOL)
}

/// An elicitation request, which a server may not send as the broker did
/// not declare the capability: refused as an unknown method (rmcp's
/// default answer, `decline`, would tell the server a person declined).
pub(super) fn refuse_elicitation() -> ErrorData {
    ErrorData::method_not_found::<ElicitationCreateRequestMethod>()
}

/// The version the server answered, when the broker speaks it: one that
/// rmcp knows, no newer than the one offered (a server answers the
/// offered version or an older one it prefers).
pub(super) fn negotiated(peer: &Peer<RoleClient>) -> Result<ProtocolVersion, String> {
    let Some(info) = peer.peer_info() else {
        return Err("the server's initialize answer was not kept".into());
    };
    let answered = info.protocol_version.clone();
    if ProtocolVersion::known_up_to(&OFFERED_PROTOCOL).contains(&answered) {
        Ok(answered)
    } else {
        Err(format!(
            "the server answered protocol version {answered}; the broker offered {OFFERED_PROTOCOL} \
             and speaks {}",
            known()
        ))
    }
}

fn known() -> String {
    ProtocolVersion::known_up_to(&OFFERED_PROTOCOL)
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A client of one server with no daemon behind it (`tools
/// conformance-client`): the daemon's identity and refusals, no list
/// refresh (nothing to publish to).
#[derive(Debug, Clone, Default)]
pub struct BareClient;

impl ClientHandler for BareClient {
    fn get_info(&self) -> ClientConfig {
        client_info()
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Err(refuse_elicitation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offered_version_has_a_handshake_and_nothing_is_declared() {
        let info = client_info();
        assert_eq!(info.protocol_version.as_str(), "2025-11-25");
        assert!(info.protocol_version.has_initialize());
        let declared = serde_json::to_value(&info.capabilities).unwrap_or_default();
        assert_eq!(declared, serde_json::json!({}));
        assert_eq!(
            known(),
            "2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25",
            "what the broker accepts in answer"
        );
    }
}
