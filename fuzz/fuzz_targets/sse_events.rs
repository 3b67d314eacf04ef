//! Arbitrary bytes as the event stream of a remote upstream on the older
//! HTTP+SSE transport (substrat_broker::upstream::sse_events). The first
//! byte picks where the stream is split in two chunks. Invariants: parsing
//! never panics; no event is larger than the bound; an event's type holds
//! no line end and its data no CR; and the split changes nothing: the same
//! events, or the same error, as in one chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::upstream::sse_events::{Event, EventParser, SseError};

const MAX: usize = 256;

fn parse(chunks: &[&[u8]]) -> Result<Vec<Event>, SseError> {
    let mut parser = EventParser::new(MAX);
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.feed(chunk)?);
    }
    Ok(events)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else { return };
    let at = usize::from(split).min(stream.len());
    let whole = parse(&[stream]);
    let (a, b) = stream.split_at(at);
    assert_eq!(parse(&[a, b]), whole);
    for event in whole.iter().flatten() {
        assert!(event.data.len() <= MAX && event.kind.len() <= MAX);
        assert!(!event.kind.contains(['\r', '\n']));
        assert!(!event.data.contains('\r'));
    }
});
