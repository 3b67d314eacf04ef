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
    #[error(
        "upstream server `{0}` is not authorized: an operator must run `substrat-sandbox tools login {0}`"
    )]
    NotAuthorized(String),
    #[error("upstream server `{server}` {}", service_sentence(source))]
    Service {
        server: String,
        #[source]
        source: ServiceError,
    },
    #[error("upstream server `{0}` answered something else")]
    UnexpectedAnswer(String),
    #[error("upstream server `{0}`: the call was cancelled by the agent; the server was told")]
    Cancelled(String),
    #[error("upstream server `{server}` timed out after {ms} ms; the call was cancelled upstream")]
    TimedOut { server: String, ms: u128 },
}

/// What went wrong with a request to a server, as the end of a sentence
/// that starts with the server (rmcp's own messages name its types, e.g.
/// `Transport [rmcp::transport::worker::WorkerTransport<...>] error`).
pub fn service_sentence(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(e) => format!(
            "refused the request: {} (JSON-RPC error {})",
            e.message.trim_end_matches('.'),
            e.code.0
        ),
        ServiceError::TransportSend(e) => format!("could not be reached: {}", e.error),
        ServiceError::TransportClosed => "closed the connection before answering".to_string(),
        ServiceError::UnexpectedResponse => {
            "answered with something other than what was asked for".to_string()
        }
        ServiceError::Cancelled { reason: Some(why) } => format!("cancelled the request: {why}"),
        ServiceError::Cancelled { reason: None } => "cancelled the request".to_string(),
        ServiceError::Timeout { timeout } => {
            format!("did not answer within {} ms", timeout.as_millis())
        }
        other => format!("failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::ErrorData;

    #[test]
    fn failed_requests_read_as_sentences_without_type_names() {
        let said = |source| {
            UpstreamError::Service {
                server: "fs".into(),
                source,
            }
            .to_string()
        };
        let closed = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let transport = rmcp::transport::DynamicTransportError::from_parts(
            "rmcp::transport::worker::WorkerTransport<X>",
            std::any::TypeId::of::<()>(),
            Box::new(closed),
        );
        assert_eq!(
            [
                said(ServiceError::McpError(ErrorData::invalid_params(
                    "Unknown tool: nope",
                    None
                ))),
                said(ServiceError::TransportSend(transport)),
                said(ServiceError::TransportClosed),
                said(ServiceError::Cancelled { reason: None }),
                said(ServiceError::Timeout {
                    timeout: std::time::Duration::from_millis(1500)
                }),
            ],
            [
                "upstream server `fs` refused the request: Unknown tool: nope (JSON-RPC error -32602)",
                "upstream server `fs` could not be reached: broken pipe",
                "upstream server `fs` closed the connection before answering",
                "upstream server `fs` cancelled the request",
                "upstream server `fs` did not answer within 1500 ms",
            ]
        );
    }
}
