//! What a Unix socket as a bind's source means, and the launcher's own
//! sockets inside (the command may connect to these).

use serde::Serialize;

use super::{GATEWAY_SOCKET_INSIDE, PROXY_SOCKET_INSIDE};

/// Where the daemon binds an agent's broker socket.
pub const BROKER_SOCKET_INSIDE: &str = "/run/substrat/broker.sock";
/// The launcher's sockets inside: the command may connect to these.
pub const LAUNCHER_SOCKETS: [&str; 3] = [
    BROKER_SOCKET_INSIDE,
    PROXY_SOCKET_INSIDE,
    GATEWAY_SOCKET_INSIDE,
];

/// What a bind whose source is a Unix socket means (`MountStep::Bind`).
/// Landlock before ABI 9 has no right for connect(2) to a pathname socket:
/// one in the view is reachable, so only a policy may put one there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketUse {
    /// A policy's bind not marked `socket = true`: refused at launch when
    /// its source, as the launch resolves it, is a socket.
    Refuse,
    /// A socket the command may connect to: a policy's bind marked
    /// `socket = true`, or the launcher's broker, proxy or gateway socket.
    /// With Landlock ABI 9 these are the only places it may connect.
    Connect,
    /// Not judged: the launcher's other binds, an engine's volumes
    /// (`substrat-oci` notes the sockets in them).
    Unjudged,
}

impl SocketUse {
    pub fn is_unjudged(&self) -> bool {
        *self == Self::Unjudged
    }
}
