//! What can go wrong with an upstream server: starting it in its sandbox,
//! listing its tools, calling one. Each text is what the operator (status,
//! logs) or the calling agent (an `upstream` error result) reads.

use std::path::PathBuf;

use rmcp::service::ServiceError;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("policy `{0}` is not a known role")]
    UnknownPolicy(String),
    #[error("cannot {action} {path}: {source}")]
    Workspace {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start: {0}")]
    Start(#[source] std::io::Error),
    #[error("initialize failed: {0}")]
    Initialize(#[source] Box<rmcp::service::ClientInitializeError>),
    #[error("tools/list failed: {0}")]
    ListTools(#[source] ServiceError),
    #[error("cannot check pins: {0}")]
    Pins(#[source] crate::broker::BrokerError),
    #[error("no upstream server `{0}`")]
    UnknownServer(String),
    #[error("upstream server `{0}` is not running (restarting); try again later")]
    NotRunning(String),
    #[error("upstream server `{server}`: {source}")]
    Service {
        server: String,
        #[source]
        source: ServiceError,
    },
    #[error("upstream server `{0}` answered something else")]
    UnexpectedAnswer(String),
    #[error("timed out after {0} ms; the call was cancelled upstream")]
    TimedOut(u128),
}
