//! Arbitrary bytes as an upstream tool's result, cut to a role's output
//! limit (substrat_broker::output_budget). The first two bytes are the
//! budget; the rest is the result's JSON or, when it is not one, blocks
//! made from the bytes (text, image, audio, embedded text, split at 0xFF,
//! the first byte of each picking its kind). Invariants: the cut never
//! panics; the result is never over the budget and writes as JSON that
//! reads back the same; the same blocks stay in order (each kept, a text
//! cut from its start, or a placeholder for a non-text block), then at
//! most two notes; cutting again changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use substrat_broker::output_budget::{cut_to_budget, result_size};

fn blocks(bytes: &[u8]) -> CallToolResult {
    let mut content = Vec::new();
    for chunk in bytes.split(|b| *b == 0xFF) {
        let Some((&kind, rest)) = chunk.split_first() else { continue };
        let text = String::from_utf8_lossy(rest).into_owned();
        content.push(match kind % 4 {
            0 => ContentBlock::text(text),
            1 => ContentBlock::image(text, "image/png"),
            2 => ContentBlock::audio(text, "audio/wav"),
            _ => ContentBlock::resource(ResourceContents::text(text, "demo://r")),
        });
    }
    let mut result = CallToolResult::success(content);
    if bytes.len() % 3 == 0 {
        result.structured_content = Some(serde_json::json!({"bytes": bytes.len()}));
    }
    result
}

fuzz_target!(|data: &[u8]| {
    let Some((budget, rest)) = data.split_first_chunk::<2>() else { return };
    let budget = usize::from(u16::from_le_bytes(*budget));
    let before = serde_json::from_slice::<CallToolResult>(rest).unwrap_or_else(|_| blocks(rest));
    let mut after = before.clone();
    cut_to_budget(&mut after, budget);
    assert!(result_size(&after) <= budget, "{} > {budget}", result_size(&after));
    let json = serde_json::to_string(&after).expect("a result writes as JSON");
    let back: CallToolResult = serde_json::from_str(&json).expect("and reads back");
    assert_eq!(back.content.len(), after.content.len());
    assert!(after.content.len() <= before.content.len() + 2);
    for (i, block) in after.content.iter().enumerate() {
        match (before.content.get(i), block) {
            (Some(was), now) if was == now => {}
            (Some(ContentBlock::Text(was)), ContentBlock::Text(now)) => {
                // What is kept of the text, then the marker (itself cut
                // when the budget is smaller than it).
                let marker = "\n[substrat: output truncated,";
                let kept = now.text.split(marker).next().unwrap_or("");
                let ok = was.text.starts_with(kept) || marker.starts_with(&now.text);
                assert!(ok, "a cut text starts as the text did: {:?}", now.text);
            }
            (Some(_), ContentBlock::Text(now)) | (None, ContentBlock::Text(now)) => {
                let said = "[substrat: ";
                assert!(now.text.starts_with(said) || said.starts_with(&now.text), "{:?}", now.text);
            }
            (_, other) => panic!("block {i} is now {other:?}"),
        }
    }
    let mut again = after.clone();
    assert!(cut_to_budget(&mut again, budget).is_empty());
    assert_eq!(again, after);
});
