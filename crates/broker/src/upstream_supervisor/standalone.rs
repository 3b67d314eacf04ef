//! One remote server connected as the daemon connects it, with no daemon
//! around it: `substrat-sandbox tools conformance-client` (the MCP
//! conformance suite's client scenarios) drives the broker's own client
//! through this. The connection, the offered protocol version and the
//! check of the answer, the tool list and `Upstreams::call` are the
//! daemon's; only pinning (a store) and restarts (a supervisor) are left out.

use rmcp::RoleClient;
use rmcp::service::RunningService;

use super::client::{self, BareClient};
use super::oauth::OAuthContext;
use super::{StartError, list_tools, remote};
use crate::upstream::config::ServerSource;
use crate::upstream::menu::PinState;
use crate::upstream::registry::{ServerStatus, Upstreams};

/// Why the server could not be connected (the text `tools list` would
/// show as its status).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ConnectError(#[from] StartError);

/// Connects `upstreams`' server `index` (a remote one), initializes, lists
/// its tools and publishes them and its client in its slot, so that
/// `upstreams.call` and `upstreams.report` work as in the daemon. Its tools
/// are taken as approved: there is no store to pin them in. The service
/// returned is the connection: dropping it closes the session.
pub async fn connect_remote(
    upstreams: &Upstreams,
    index: usize,
    oauth: &OAuthContext,
) -> Result<RunningService<RoleClient, BareClient>, ConnectError> {
    let slot = upstreams.slots.get(index).ok_or(StartError::NotRemote)?;
    let ServerSource::Remote(config) = &slot.config.source else {
        return Err(StartError::NotRemote.into());
    };
    slot.write().status = ServerStatus::Starting;
    // No supervisor acts on its health: a lost session fails the run.
    let (health, _signals) = super::health::Health::new();
    let service = remote::connect(config, oauth, BareClient, &health).await?;
    let peer = service.peer().clone();
    let protocol_version = client::negotiated(&peer).map_err(StartError::Version)?;
    let tools = list_tools(&peer).await?;
    let mut state = slot.write();
    state.tools = tools.into_iter().map(|t| (t, PinState::Approved)).collect();
    state.peer = Some(peer);
    state.status = ServerStatus::Up {
        pid: None,
        protocol_version: protocol_version.to_string(),
    };
    drop(state);
    upstreams.bump();
    Ok(service)
}
