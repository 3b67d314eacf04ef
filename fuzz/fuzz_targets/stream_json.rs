//! Arbitrary bytes as a provider's stdout (cursor-agent stream-json), line
//! by line through the parser and the turn transcript, as the broker reads
//! a turn. Invariants: every non-blank line is an event or a malformed
//! report (never lost); malformed excerpts stay within their bound; notes
//! are bounded but counted exactly; the turn's end follows the last result
//! event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_provider::events::{Line, MALFORMED_KEEP, StreamEvent, parse_line};
use substrat_provider::transcript::{KEEP_NOTES, Transcript, TurnEnd};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut transcript = Transcript::default();
    let (mut events, mut malformed, mut last_result) = (0usize, 0usize, None);
    for line in text.split('\n') {
        let parsed = parse_line(line);
        match &parsed {
            Line::Blank => assert!(line.trim().is_empty()),
            Line::Malformed { excerpt, .. } => {
                assert!(excerpt.len() <= MALFORMED_KEEP);
                malformed += 1;
            }
            Line::Event(event) => {
                events += 1;
                if let StreamEvent::Result { is_error, result, .. } = event {
                    last_result = Some((*is_error, result.clone()));
                }
            }
        }
        transcript.push(parsed);
    }
    assert_eq!(transcript.events, events);
    assert!(transcript.notes_total >= malformed, "every malformed line is noted");
    assert!(transcript.notes.len() <= KEEP_NOTES);
    assert_eq!(transcript.notes.len(), transcript.notes_total.min(KEEP_NOTES));
    match (transcript.end(), last_result) {
        (TurnEnd::NoResult, None) => {}
        (TurnEnd::Error { message }, Some((true, text))) => assert_eq!(message, text),
        (TurnEnd::Success { text }, Some((false, result))) => {
            assert!(result.is_empty() || text == result)
        }
        (end, last) => panic!("end {end:?} after last result {last:?}"),
    }
});
