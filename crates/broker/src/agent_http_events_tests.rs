use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::model::{JsonRpcMessage, NumberOrString};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;

use super::{EventLog, MAX_EVENT_BYTES, MAX_EVENTS};

const WINDOW: Duration = Duration::from_secs(10);

fn priming() -> ServerSseMessage {
    ServerSseMessage::retry(Duration::from_secs(3))
}

fn answer(id: i64) -> ServerSseMessage {
    let response = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}});
    ServerSseMessage::from_message(serde_json::from_value(response).expect("a response"))
}

fn session(name: &str) -> Arc<str> {
    Arc::from(name)
}

async fn collect(
    log: &Arc<EventLog>,
    session: &str,
    id: &str,
    now: Instant,
) -> Option<Vec<ServerSseMessage>> {
    let events = log.follow(session, id, now).ok()?;
    Some(events.collect().await)
}

#[tokio::test]
async fn a_session_resumes_its_own_stream_and_gets_the_answer_it_missed() {
    let log = Arc::new(EventLog::new(WINDOW));
    let now = Instant::now();
    let first = log.hold("stream-a", &priming(), now);
    log.claim(&first, &session("s1"));
    // The client was cut here; the answer comes after.
    let last = log.hold("stream-a", &answer(7), now);
    assert_ne!(first, last);
    assert_eq!(first.len(), 32, "128 random bits, in hex");
    let replayed = collect(&log, "s1", &first, now).await.expect("resumable");
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].event_id.as_deref(), Some(last.as_str()));
    assert!(matches!(
        replayed[0].message.as_deref(),
        Some(JsonRpcMessage::Response(r)) if r.id == NumberOrString::Number(7)
    ));
    // After the answer, nothing more: a resumption from it ends at once.
    assert_eq!(
        collect(&log, "s1", &last, now).await.map(|e| e.len()),
        Some(0)
    );
}

#[tokio::test]
async fn another_sessions_forged_or_unclaimed_ids_replay_nothing() {
    let log = Arc::new(EventLog::new(WINDOW));
    let now = Instant::now();
    let first = log.hold("stream-a", &priming(), now);
    log.hold("stream-a", &answer(1), now);
    // Not read by any client yet: nobody's.
    assert!(!log.owns("s1", &first, now));
    assert!(log.follow("s1", &first, now).is_err());
    log.claim(&first, &session("s1"));
    // A second claim does not move it.
    log.claim(&first, &session("s2"));
    assert!(log.owns("s1", &first, now));
    assert!(!log.owns("s2", &first, now));
    assert!(log.follow("s2", &first, now).is_err());
    for forged in ["0", "0/0", "", "00000000000000000000000000000000"] {
        assert!(!log.owns("s1", forged, now), "{forged:?}");
        assert!(log.follow("s1", forged, now).is_err(), "{forged:?}");
    }
    // The trait's replay by id alone (rmcp's sessionless path) refuses.
    use rmcp::transport::streamable_http_server::session::EventStore;
    assert!(log.replay_events_after(&first).await.is_err());
}

#[tokio::test]
async fn a_follower_waits_for_the_answer_that_comes_later() {
    let log = Arc::new(EventLog::new(WINDOW));
    let now = Instant::now();
    let first = log.hold("stream-a", &priming(), now);
    log.claim(&first, &session("s1"));
    let mut events = log.follow("s1", &first, now).expect("resumable");
    let later = {
        let log = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            log.hold("stream-a", &answer(2), Instant::now())
        })
    };
    let got = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the answer arrives")
        .expect("an event");
    let id = later.await.expect("task");
    assert_eq!(got.event_id.as_deref(), Some(id.as_str()));
    assert!(
        events.next().await.is_none(),
        "the stream ends with its answer"
    );
}

#[tokio::test]
async fn an_answered_stream_goes_after_the_window_and_a_session_with_its_end() {
    let log = Arc::new(EventLog::new(WINDOW));
    let start = Instant::now();
    let first = log.hold("stream-a", &priming(), start);
    log.claim(&first, &session("s1"));
    log.hold("stream-a", &answer(1), start);
    let open = log.hold("stream-b", &priming(), start);
    log.claim(&open, &session("s1"));
    assert!(log.owns("s1", &first, start + WINDOW - Duration::from_millis(1)));
    assert!(!log.owns("s1", &first, start + WINDOW));
    // A stream still waiting for its answer stays...
    assert!(log.owns("s1", &open, start + 10 * WINDOW));
    assert_eq!(log.held().0, 1);
    // ...until its session ends.
    log.end_session("s1");
    assert!(!log.owns("s1", &open, start + 10 * WINDOW));
    assert_eq!(log.held(), (0, 0));
}

#[tokio::test]
async fn an_agent_cannot_make_the_log_hold_more_than_its_bounds() {
    let now = Instant::now();
    // Events: streams opened and never read nor answered.
    let log = Arc::new(EventLog::new(WINDOW));
    let mut ids = Vec::new();
    for n in 0..(3 * MAX_EVENTS) {
        ids.push(log.hold(&format!("stream-{n}"), &priming(), now));
        assert!(log.held().0 <= MAX_EVENTS);
    }
    assert_eq!(log.held().0, MAX_EVENTS);
    // The oldest went first; the newest are there.
    log.claim(&ids[0], &session("s1"));
    assert!(!log.owns("s1", &ids[0], now));
    let newest = ids.last().expect("ids");
    log.claim(newest, &session("s1"));
    assert!(log.owns("s1", newest, now));
    {
        let inner = log.log.lock().expect("lock");
        assert!(inner.order.len() <= 2 * MAX_EVENTS + 64);
        assert_eq!(inner.ids.len(), MAX_EVENTS);
    }
    // Bytes: large answers on one open stream.
    let log = Arc::new(EventLog::new(WINDOW));
    let big = "x".repeat(1 << 20);
    let large = || {
        let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": big}});
        ServerSseMessage::from_message(serde_json::from_value(note).expect("a notification"))
    };
    let first = log.hold("stream-a", &large(), now);
    log.claim(&first, &session("s1"));
    for _ in 0..40 {
        log.hold("stream-a", &large(), now);
        assert!(log.held().1 <= MAX_EVENT_BYTES, "{:?}", log.held());
    }
    assert!(log.held().1 > MAX_EVENT_BYTES - (2 << 20));
    // Its oldest events went: a resumption from them is refused, and one
    // that began before them ends (it cannot have them all).
    assert!(!log.owns("s1", &first, now));
}

#[tokio::test]
async fn a_follower_whose_next_events_were_evicted_ends() {
    let log = Arc::new(EventLog::with_bounds(WINDOW, 3, usize::MAX));
    let now = Instant::now();
    let first = log.hold("stream-a", &priming(), now);
    log.claim(&first, &session("s1"));
    let second = log.hold("stream-a", &priming(), now);
    let mut events = log.follow("s1", &first, now).expect("resumable");
    // Three more push out `first` and `second`: the follower's next is gone.
    for _ in 0..3 {
        log.hold("stream-a", &priming(), now);
    }
    assert!(!log.owns("s1", &second, now));
    let next = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("ends, not waits");
    assert!(next.is_none());
}

#[test]
fn ids_are_128_random_bits_never_repeated() {
    let log = EventLog::new(WINDOW);
    let now = Instant::now();
    // More than one draw of random bytes ahead.
    let ids: std::collections::HashSet<String> = (0..2000)
        .map(|n| log.hold(&format!("stream-{n}"), &priming(), now))
        .collect();
    assert_eq!(ids.len(), 2000);
    for id in &ids {
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{id}"
        );
    }
    // Not a counter: the ids of consecutive events share no long prefix.
    let a = log.hold("stream-x", &priming(), now);
    let b = log.hold("stream-x", &priming(), now);
    assert_ne!(a[..8], b[..8]);
}
