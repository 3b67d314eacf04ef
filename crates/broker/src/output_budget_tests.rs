//! The cut compared as whole results (their JSON), not by pieces.

use super::*;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};
use serde_json::{Value, json};

fn cut(mut result: CallToolResult, budget: usize) -> (Value, Cut) {
    let done = cut_to_budget(&mut result, budget);
    assert!(
        result_size(&result) <= budget,
        "over the budget: {result:?}"
    );
    let again = result.clone();
    assert!(cut_to_budget(&mut result, budget).is_empty(), "cut twice");
    assert_eq!(result, again);
    (serde_json::to_value(&result).unwrap_or_default(), done)
}

fn texts(texts: &[&str]) -> CallToolResult {
    CallToolResult::success(texts.iter().map(|t| ContentBlock::text(*t)).collect())
}

fn marker(removed: usize, total: usize) -> String {
    format!("\n[substrat: output truncated, {removed} of {total} bytes removed]")
}

#[test]
fn a_result_within_the_budget_is_left_as_it_is() {
    let result = texts(&["a\"b\\c\n", "é😀"]);
    let (out, done) = cut(result.clone(), 12);
    assert_eq!(out, serde_json::to_value(&result).unwrap_or_default());
    assert!(done.is_empty());
}

#[test]
fn text_is_cut_by_its_bytes_at_the_budget_with_a_marker() {
    // The marker for 300 bytes is 55 bytes: 45 of text fit in 100.
    let (out, done) = cut(texts(&[&"x".repeat(300)]), 100);
    let expected = format!("{}{}", "x".repeat(45), marker(255, 300));
    assert_eq!(expected.len(), 100);
    assert_eq!(
        out,
        json!({"content": [{"type": "text", "text": expected}], "isError": false, "resultType": "complete"})
    );
    assert_eq!(done.texts_cut, 1);
}

#[test]
fn quotes_backslashes_and_newlines_count_one_byte_each() {
    // 300 bytes that are 600 in JSON: cut at 45 of them, not 22.
    let text = "\"\\\n".repeat(100);
    let (out, _) = cut(texts(&[&text]), 100);
    let expected = format!("{}{}", "\"\\\n".repeat(15), marker(255, 300));
    assert_eq!(expected.len(), 100);
    assert_eq!(out["content"][0]["text"], expected);
}

#[test]
fn multi_byte_characters_are_never_split() {
    // é is 2 bytes, 😀 4: 45 bytes end inside an emoji, 44 do not.
    let text = "é😀".repeat(50);
    let (out, _) = cut(texts(&[&text]), 100);
    let expected = format!("{}é{}", "é😀".repeat(7), marker(256, 300));
    assert_eq!(expected.len(), 99);
    assert_eq!(out["content"][0]["text"], expected);
}

#[test]
fn an_image_over_the_limit_becomes_a_placeholder_and_the_rest_stays() {
    // 4,000 base64 characters: 3,000 bytes decoded, over a 1 KiB limit.
    let image = ContentBlock::image("A".repeat(4000), "image/png");
    let result = CallToolResult::success(vec![
        ContentBlock::text("before"),
        image,
        ContentBlock::text("after"),
    ]);
    let (out, done) = cut(result, 1024);
    assert_eq!(
        out,
        json!({"content": [
            {"type": "text", "text": "before"},
            {"type": "text", "text": "[substrat: image/png, 2.9 KiB: over this role's limit of 1 KiB, left out]"},
            {"type": "text", "text": "after"},
        ], "isError": false, "resultType": "complete"})
    );
    assert_eq!(done.blocks_left_out, 1);
}

#[test]
fn a_block_that_fits_alone_but_not_after_the_others_says_so() {
    let audio = ContentBlock::audio("A".repeat(800), "audio/wav"); // 600 bytes
    let result = CallToolResult::success(vec![ContentBlock::text("t".repeat(700)), audio]);
    let (out, _) = cut(result, 1024);
    assert_eq!(
        out,
        json!({"content": [
            {"type": "text", "text": "t".repeat(700)},
            {"type": "text", "text": "[substrat: audio/wav, 609 bytes: over what is left of this role's limit of 1 KiB, left out]"},
        ], "isError": false, "resultType": "complete"})
    );
}

#[test]
fn resources_and_links_are_named_in_their_placeholders() {
    let blob = ResourceContents::blob("A".repeat(2000), "file:///big.bin")
        .with_mime_type("application/octet-stream");
    let text = ResourceContents::text("r".repeat(2000), "file:///notes.txt");
    let link = Resource::new("demo://x", "x").with_description("d".repeat(2000));
    let result = CallToolResult::success(vec![
        ContentBlock::resource(blob),
        ContentBlock::resource(text),
        ContentBlock::resource_link(link),
    ]);
    let (out, done) = cut(result, 1024);
    assert_eq!(
        out["content"],
        json!([
            {"type": "text", "text": "[substrat: resource (application/octet-stream) file:///big.bin, 1.5 KiB: over this role's limit of 1 KiB, left out]"},
            {"type": "text", "text": "[substrat: resource (text/plain) file:///notes.txt, 2 KiB: over this role's limit of 1 KiB, left out]"},
            {"type": "text", "text": "[substrat: resource link demo://x, 2 KiB: over this role's limit of 1 KiB, left out]"},
        ])
    );
    assert_eq!(done.blocks_left_out, 3);
}

#[test]
fn structured_content_over_what_is_left_goes_with_a_note_and_the_text_stays() {
    let data = json!({"rows": "v".repeat(1000)});
    let mut result = CallToolResult::success(vec![ContentBlock::text("s".repeat(100))]);
    result.structured_content = Some(data);
    let (out, done) = cut(result, 1024);
    assert_eq!(
        out,
        json!({"content": [
            {"type": "text", "text": "s".repeat(100)},
            {"type": "text", "text": "[substrat: structuredContent, 1011 bytes: over what is left of this role's limit of 1 KiB, left out]"},
        ], "isError": false, "resultType": "complete"})
    );
    assert_eq!(done.fields_left_out, 1);
}

#[test]
fn a_long_text_leaves_room_for_the_placeholders_after_it() {
    let result = CallToolResult::success(vec![
        ContentBlock::text("x".repeat(5000)),
        ContentBlock::image("A".repeat(4000), "image/png"),
    ]);
    let (out, _) = cut(result, 1024);
    let placeholder =
        "[substrat: image/png, 2.9 KiB: over what is left of this role's limit of 1 KiB, left out]";
    let placeholder = placeholder.replace("over what is left of", "over");
    let keep = 1024 - placeholder.len() - marker(5000, 5000).len();
    assert_eq!(
        out["content"],
        json!([
            {"type": "text", "text": format!("{}{}", "x".repeat(keep), marker(5000 - keep, 5000))},
            {"type": "text", "text": placeholder},
        ])
    );
}

#[test]
fn annotations_and_meta_count_and_stay_when_there_is_room() {
    let annotated: ContentBlock = serde_json::from_value(json!({
        "type": "text", "text": "y".repeat(2000),
        "annotations": {"audience": ["user"], "priority": 0.5}
    }))
    .unwrap_or_else(|_| ContentBlock::text(""));
    let (out, _) = cut(CallToolResult::success(vec![annotated]), 1024);
    let fields = r#"{"audience":["user"],"priority":0.5}"#.len();
    let keep = 1024 - fields - marker(2000, 2000).len();
    assert_eq!(
        out["content"],
        json!([{"type": "text", "text": format!("{}{}", "y".repeat(keep), marker(2000 - keep, 2000)),
                "annotations": {"audience": ["user"], "priority": 0.5}}])
    );
}

#[test]
fn a_tiny_budget_still_holds() {
    let result = CallToolResult::success(vec![
        ContentBlock::text("x".repeat(100)),
        ContentBlock::image("AAAA", "image/png"),
    ]);
    let (out, _) = cut(result, 10);
    assert_eq!(out["content"][0]["text"], "");
    assert_eq!(out["content"][1]["text"], "[substrat:");
}

#[test]
fn sizes_are_decoded_and_said_for_people() {
    assert_eq!(decoded_len("QUJD"), 3);
    assert_eq!(decoded_len("QUI="), 2);
    assert_eq!(decoded_len("QQ=="), 1);
    assert_eq!(decoded_len("QUJDRA\n=="), 4);
    assert_eq!(decoded_len("QUJDRA"), 4);
    assert_eq!(human(512), "512 bytes");
    assert_eq!(human(1024), "1 KiB");
    assert_eq!(human(2_411_725), "2.3 MiB");
    assert_eq!(human(3 << 30), "3 GiB");
}
