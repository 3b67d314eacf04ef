//! Arbitrary bytes as an agent CLI's stdout, line by line through its
//! parser and the turn transcript, as the broker reads a turn. The first
//! byte picks the CLI: cursor-agent, Claude Code, Codex or Gemini CLI.
//! Invariants: every non-blank line is events or a malformed report (never
//! lost); malformed excerpts and tool outputs stay within their bound;
//! notes and reported tool calls are bounded but counted exactly, each
//! call's arguments and output within its excerpt; the CLI's errors and
//! retries kept (the last `KEEP_PROBLEMS`, each within its excerpt) and
//! counted exactly, the last events bounded; the turn's end follows the
//! last result event, or is unreadable only when a line could not be read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_provider::events::{Line, MALFORMED_KEEP, StreamEvent};
use substrat_provider::transcript::{
    KEEP_CALLS, KEEP_EXCERPT, KEEP_LAST_EVENTS, KEEP_NOTES, KEEP_PROBLEMS, Transcript, TurnEnd,
};
use substrat_provider::{claude, codex, events, gemini};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, data)) = data.split_first() else { return };
    let parse: fn(&str) -> Line = match selector % 4 {
        0 => events::parse_line,
        1 => claude::parse_line,
        2 => codex::parse_line,
        _ => gemini::parse_line,
    };
    let text = String::from_utf8_lossy(data);
    let mut transcript = Transcript::default();
    let (mut count, mut malformed, mut last_result) = (0usize, 0usize, None);
    let (mut started, mut problems) = (0usize, 0usize);
    // The other CLIs' adapters make tool events of their own, the output
    // cut; cursor-agent's events are its lines as they are (the transcript
    // cuts what it keeps: checked below).
    let adapted = selector % 4 != 0;
    let seen = |event: &StreamEvent, last: &mut Option<(bool, String)>| {
        if let StreamEvent::Result { is_error, result, .. } = event {
            *last = Some((*is_error, result.clone()));
        }
        if let StreamEvent::ToolCall { extra, .. } = event
            && let Some(output) = extra.get("output").and_then(|o| o.as_str())
        {
            assert!(!adapted || output.len() <= MALFORMED_KEEP);
        }
    };
    let is_problem = |event: &StreamEvent| usize::from(matches!(event, StreamEvent::Problem { .. }));
    let starts = |event: &StreamEvent| {
        usize::from(matches!(event, StreamEvent::ToolCall { subtype, .. } if subtype == "started"))
    };
    for line in text.split('\n') {
        let parsed = parse(line);
        match &parsed {
            Line::Blank => assert!(line.trim().is_empty()),
            Line::Malformed { excerpt, .. } => {
                assert!(excerpt.len() <= MALFORMED_KEEP);
                malformed += 1;
            }
            Line::Event(event) => {
                count += 1;
                started += starts(event);
                problems += is_problem(event);
                seen(event, &mut last_result);
            }
            Line::Events(list) => {
                count += list.len();
                started += list.iter().map(starts).sum::<usize>();
                problems += list.iter().map(is_problem).sum::<usize>();
                list.iter().for_each(|e| seen(e, &mut last_result));
            }
        }
        transcript.push(parsed);
    }
    assert_eq!(transcript.events, count);
    assert!(transcript.notes_total >= malformed, "every malformed line is noted");
    assert!(transcript.notes.len() <= KEEP_NOTES);
    assert_eq!(transcript.notes.len(), transcript.notes_total.min(KEEP_NOTES));
    assert_eq!(transcript.tool_calls_total, started);
    assert_eq!(transcript.tool_calls.len(), started.min(KEEP_CALLS));
    for call in &transcript.tool_calls {
        assert!(call.arguments.len() <= KEEP_EXCERPT);
        assert!(call.output.as_ref().is_none_or(|o| o.len() <= KEEP_EXCERPT));
        assert_eq!(call.output.is_some(), call.is_error.is_some());
    }
    assert_eq!(transcript.unreadable, malformed);
    assert_eq!(transcript.problems_total, problems);
    assert_eq!(transcript.problems.len(), problems.min(KEEP_PROBLEMS));
    assert!(transcript.problems.iter().all(|p| p.message.len() <= KEEP_EXCERPT));
    assert!(transcript.last_events.len() <= KEEP_LAST_EVENTS);
    assert!(transcript.last_events.iter().all(|e| e.len() <= 120));
    match (transcript.end(), last_result) {
        (TurnEnd::Unreadable, None) => assert!(transcript.ended_unreadable),
        (TurnEnd::Unreadable, Some((false, result))) => {
            assert!(result.is_empty() && transcript.unreadable > 0)
        }
        (TurnEnd::NoResult, None) => {}
        (TurnEnd::Error { message }, Some((true, text))) => assert_eq!(message, text),
        (TurnEnd::Success { text }, Some((false, result))) => {
            assert!(result.is_empty() || text == result)
        }
        (end, last) => panic!("end {end:?} after last result {last:?}"),
    }
});
