//! The events of an agent's SSE streams, kept so that a client whose
//! stream broke can resume it (GET with `Last-Event-ID`, issue 41): rmcp's
//! own cache forgets a request's events once its answer is sent, so a
//! client cut before the answer could never get it.
//!
//! rmcp's `EventStore` contract replays by event id alone, and its
//! `handle_get` may replay with no session at all; so here an event id is
//! 128 random bits, a stream belongs to the session whose client first
//! read one of its events (`claim`, from `agent_http_sessions`), and a
//! replay names its session (`follow`): another session's id, a forged
//! one, an evicted one, all get nothing. The trait's sessionless
//! `replay_events_after` always refuses.
//!
//! Bounded per agent (one log for both of its rmcp servers): at most
//! `MAX_EVENTS` events and `MAX_EVENT_BYTES` bytes (oldest first out); a
//! stream's events go `window` after its answer, or with its session. A
//! client that never reads makes the log hold nothing more: what is held
//! is what was sent, within the bounds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::model::JsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use tokio::sync::Notify;

use crate::locks::LockAnyway;

/// Events an agent's streams may hold at once, all sessions together.
pub const MAX_EVENTS: usize = 4096;
/// Bytes (serialized messages) an agent's streams may hold at once.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// A resumption refused: the id names no event of the asking session
/// (unknown, forged, evicted, or another session's: told apart to nobody).
#[derive(Debug, thiserror::Error)]
#[error("no event of this session has this id (unknown, expired, or another session's)")]
pub struct NotResumable;

/// One agent's log of SSE events.
#[derive(Debug)]
pub struct EventLog {
    log: Mutex<Log>,
    /// Wakes followers: an event arrived, or streams went.
    grown: Notify,
    window: Duration,
    max_events: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Log {
    /// Every held event's stream and sequence number.
    ids: HashMap<Arc<str>, (Arc<str>, u64)>,
    streams: HashMap<Arc<str>, Stream>,
    /// Event ids in arrival order (some already gone), to evict the oldest.
    order: VecDeque<Arc<str>>,
    /// Random bytes from the OS for ids, drawn ahead (one call per
    /// `RANDOM_AHEAD` ids: a call each was a tenth of `hold`).
    random: Vec<u8>,
    /// Streams answered, in the order they were.
    answered: VecDeque<(Instant, Arc<str>)>,
    events: usize,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Stream {
    /// The session whose client read it first.
    session: Option<Arc<str>>,
    /// The sequence number of `events.front()`.
    first: u64,
    events: VecDeque<Held>,
    /// When its answer came (a request's stream; the standalone one never).
    answered: Option<Instant>,
}

#[derive(Debug)]
struct Held {
    id: Arc<str>,
    message: ServerSseMessage,
    bytes: usize,
}

impl EventLog {
    pub fn new(window: Duration) -> Self {
        Self::with_bounds(window, MAX_EVENTS, MAX_EVENT_BYTES)
    }

    pub fn with_bounds(window: Duration, max_events: usize, max_bytes: usize) -> Self {
        Self {
            log: Mutex::new(Log::default()),
            grown: Notify::new(),
            window,
            max_events,
            max_bytes,
        }
    }

    /// Events and bytes held now.
    pub fn held(&self) -> (usize, usize) {
        let log = self.log.lock_anyway();
        (log.events, log.bytes)
    }

    /// Holds `event` of `stream`; its new id.
    pub fn hold(&self, stream: &str, event: &ServerSseMessage, now: Instant) -> String {
        let bytes = ID_LEN + event.message.as_deref().map_or(0, serialized_len) + 32;
        // An answer ends a request's stream (a stray one on the standalone
        // stream, after a cancellation, does not end it).
        let answer = !stream.ends_with(":common")
            && matches!(
                event.message.as_deref(),
                Some(JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_))
            );
        let mut log = self.log.lock_anyway();
        log.expire(now, self.window);
        let id = log.new_id();
        let key = match log.streams.get_key_value(stream) {
            Some((key, _)) => key.clone(),
            None => Arc::from(stream),
        };
        let entry = log.streams.entry(key.clone()).or_default();
        let seq = entry.first + entry.events.len() as u64;
        let mut held = event.clone();
        held.event_id = Some(id.to_string());
        entry.events.push_back(Held {
            id: id.clone(),
            message: held,
            bytes,
        });
        if answer && entry.answered.is_none() {
            entry.answered = Some(now);
            log.answered.push_back((now, key.clone()));
        }
        log.ids.insert(id.clone(), (key, seq));
        log.order.push_back(id.clone());
        log.events += 1;
        log.bytes += bytes;
        log.evict_over(self.max_events, self.max_bytes);
        drop(log);
        self.grown.notify_waiters();
        id.to_string()
    }

    /// The stream of event `id` is `session`'s, unless another's already.
    pub fn claim(&self, id: &str, session: &Arc<str>) {
        let mut log = self.log.lock_anyway();
        let Some((stream, _)) = log.ids.get(id) else {
            return;
        };
        let stream = stream.clone();
        if let Some(entry) = log.streams.get_mut(&stream)
            && entry.session.is_none()
        {
            entry.session = Some(session.clone());
        }
    }

    /// Whether `id` names a held event of a stream of `session`.
    pub fn owns(&self, session: &str, id: &str, now: Instant) -> bool {
        let mut log = self.log.lock_anyway();
        log.expire(now, self.window);
        log.position(session, id).is_some()
    }

    /// The events of `session`'s stream after event `id`, then those that
    /// come, until its answer (or the stream goes).
    pub fn follow(
        self: &Arc<Self>,
        session: &str,
        id: &str,
        now: Instant,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + use<>, NotResumable>
    {
        let (stream, next) = {
            let mut log = self.log.lock_anyway();
            log.expire(now, self.window);
            let (stream, seq) = log.position(session, id).ok_or(NotResumable)?;
            (stream, seq + 1)
        };
        let follower = Follower {
            log: self.clone(),
            stream,
            next,
            done: false,
        };
        let events = futures::stream::unfold(follower, |mut follower| async move {
            let event = follower.next_event().await?;
            Some((event, follower))
        });
        Ok(SyncStream(Mutex::new(events.boxed())))
    }

    /// Forgets the streams of a session that ended.
    pub fn end_session(&self, session: &str) {
        let mut log = self.log.lock_anyway();
        let ended: Vec<Arc<str>> = log
            .streams
            .iter()
            .filter(|(_, s)| s.session.as_deref() == Some(session))
            .map(|(key, _)| key.clone())
            .collect();
        for stream in ended {
            log.remove(&stream);
        }
        log.compact();
        drop(log);
        self.grown.notify_waiters();
    }
}

/// An event id: 128 random bits, in hex.
const ID_LEN: usize = 32;
const RANDOM_AHEAD: usize = 256;

impl Log {
    /// A new event id, from the OS's random bytes (uuid's source when
    /// they cannot be had).
    fn new_id(&mut self) -> Arc<str> {
        if self.random.len() < ID_LEN / 2 {
            let mut ahead = vec![0u8; RANDOM_AHEAD * ID_LEN / 2];
            if getrandom::fill(&mut ahead).is_err() {
                ahead = uuid::Uuid::new_v4().as_bytes().to_vec();
            }
            self.random = ahead;
        }
        let bytes = self.random.split_off(self.random.len() - ID_LEN / 2);
        let mut id = String::with_capacity(ID_LEN);
        for byte in bytes {
            for nibble in [byte >> 4, byte & 0xf] {
                id.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
            }
        }
        Arc::from(id)
    }

    /// The stream and sequence number of `session`'s event `id`.
    fn position(&self, session: &str, id: &str) -> Option<(Arc<str>, u64)> {
        let (stream, seq) = self.ids.get(id)?;
        let owner = self.streams.get(stream)?.session.as_deref()?;
        (owner == session).then(|| (stream.clone(), *seq))
    }

    /// Forgets the streams answered more than `window` ago.
    fn expire(&mut self, now: Instant, window: Duration) {
        while let Some((at, _)) = self.answered.front()
            && now.saturating_duration_since(*at) >= window
        {
            if let Some((at, stream)) = self.answered.pop_front()
                && self.streams.get(&stream).and_then(|s| s.answered) == Some(at)
            {
                self.remove(&stream);
            }
        }
        self.compact();
    }

    /// Drops the oldest events while over either bound.
    fn evict_over(&mut self, max_events: usize, max_bytes: usize) {
        while self.events > max_events || self.bytes > max_bytes {
            let Some(id) = self.order.pop_front() else {
                return;
            };
            let Some((stream, _)) = self.ids.remove(&id) else {
                continue; // its stream went already
            };
            let Some(entry) = self.streams.get_mut(&stream) else {
                continue;
            };
            // A stream's events arrive in order, so its oldest is the
            // oldest of all it holds.
            if let Some(held) = entry.events.pop_front() {
                debug_assert_eq!(held.id, id);
                entry.first += 1;
                self.events -= 1;
                self.bytes -= held.bytes;
            }
            if entry.events.is_empty() {
                self.streams.remove(&stream);
            }
        }
    }

    fn remove(&mut self, stream: &Arc<str>) {
        let Some(entry) = self.streams.remove(stream) else {
            return;
        };
        for held in entry.events {
            self.ids.remove(&held.id);
            self.events -= 1;
            self.bytes -= held.bytes;
        }
    }

    /// Keeps `order` within twice the events held (ids of streams that
    /// went stay in it until they reach its front, or until this).
    fn compact(&mut self) {
        if self.order.len() > 2 * self.events + 64 {
            let ids = &self.ids;
            self.order.retain(|id| ids.contains_key(id));
        }
    }
}

/// A replay in progress: the next sequence number it yields.
struct Follower {
    log: Arc<EventLog>,
    stream: Arc<str>,
    next: u64,
    done: bool,
}

impl Follower {
    async fn next_event(&mut self) -> Option<ServerSseMessage> {
        if self.done {
            return None;
        }
        loop {
            let notified = self.log.grown.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let log = self.log.log.lock_anyway();
                // The stream went (its session ended, evicted, expired).
                let entry = log.streams.get(&self.stream)?;
                // Events it would have yielded were evicted: the client
                // cannot have them all, so it gets none more.
                let index = self.next.checked_sub(entry.first)?;
                if let Some(held) = entry.events.get(usize::try_from(index).ok()?) {
                    self.next += 1;
                    let last = entry.answered.is_some()
                        && self.next == entry.first + entry.events.len() as u64;
                    self.done = last;
                    return Some(held.message.clone());
                }
                if entry.answered.is_some() {
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// A stream that is `Sync` (as rmcp's SSE bodies must be) by holding its
/// inner one in a mutex it never locks: polling has `&mut` already.
struct SyncStream<S>(Mutex<S>);

impl<S: futures::Stream + Unpin> futures::Stream for SyncStream<S> {
    type Item = S::Item;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let inner = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.poll_next_unpin(cx)
    }
}

/// The length of a message as JSON, without keeping it.
fn serialized_len<T: serde::Serialize>(message: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, message);
    count.0
}

#[async_trait::async_trait]
impl EventStore for EventLog {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        Ok(self.hold(stream_id, event, Instant::now()))
    }

    /// Never: a replay must name its session (`follow`).
    async fn replay_events_after(&self, _last: &str) -> Result<EventStream, EventStoreError> {
        Err(Box::new(NotResumable))
    }
}

#[cfg(test)]
#[path = "agent_http_events_tests.rs"]
mod tests;
