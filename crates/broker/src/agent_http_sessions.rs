//! rmcp's local sessions with the agent's event log (`agent_http_events`):
//! every event of a session's streams is held with an id of the log's, each
//! stream is claimed by the session whose client reads it, and a resumption
//! replays only the asking session's events, then follows its stream until
//! the answer. Everything else is rmcp's `LocalSessionManager`.

use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, ServerSseMessage, SessionId, SessionManager,
};

use crate::agent_http_events::{EventLog, NotResumable};

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error(transparent)]
    NotResumable(#[from] NotResumable),
}

/// One rmcp server's sessions, their events in the agent's log.
#[derive(Debug)]
pub struct Sessions {
    pub local: LocalSessionManager,
    log: Arc<EventLog>,
}

impl Sessions {
    pub fn new(local: LocalSessionManager, log: Arc<EventLog>) -> Self {
        let local = local.with_event_store(log.clone());
        Self { local, log }
    }

    pub async fn holds(&self, session: &str) -> bool {
        self.local.sessions.read().await.contains_key(session)
    }

    /// `events`, each claiming its stream for `session` as its client reads it.
    fn claimed(
        &self,
        session: &SessionId,
        events: impl Stream<Item = ServerSseMessage> + Send + Sync + 'static,
    ) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static {
        let (log, session) = (self.log.clone(), Arc::<str>::from(session.as_ref()));
        events.inspect(move |event| {
            if let Some(id) = &event.event_id {
                log.claim(id, &session);
            }
        })
    }
}

impl SessionManager for Sessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        Ok(self.local.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.local.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.local.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.local.close_session(id).await;
        self.log.end_session(id);
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let events = self.local.create_stream(id, message).await?;
        Ok(self.claimed(id, events))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.local.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let events = self.local.create_standalone_stream(id).await?;
        Ok(self.claimed(id, events))
    }

    /// Only the session's own events (rmcp's resume with an event store
    /// would replay any session's, by id alone).
    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if !self.local.has_session(id).await? {
            return Err(LocalSessionManagerError::SessionNotFound(id.clone()).into());
        }
        Ok(self.log.follow(id, &last_event_id, Instant::now())?)
    }

    /// The log, so that rmcp gives the standalone stream's priming event no
    /// id (there is nothing to resume there yet). Its sessionless replay
    /// refuses; the door refuses such requests before.
    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        Some(self.log.clone())
    }
}
