//! What can go wrong calling an upstream server's tool; the calling agent
//! reads the text (an `upstream` error result).

use rmcp::service::ServiceError;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no upstream server `{0}`")]
    UnknownServer(String),
    #[error(
        "upstream server `{0}` is a core server: always loaded, it cannot be disabled (seed 003)"
    )]
    Core(String),
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
    #[error("upstream server `{server}` timed out after {ms} ms; the call was cancelled upstream")]
    TimedOut { server: String, ms: u128 },
}
