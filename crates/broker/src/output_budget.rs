//! A role's output limit (`mcp.max_output_bytes`) applied to a tool's
//! result, measured in what the agent reads, never in its JSON encoding:
//! a text block by its UTF-8 bytes, an image, audio or embedded blob by
//! its decoded size, an embedded text resource by its text, anything else
//! (a resource link, `structuredContent`, the result's `_meta`, each
//! block's annotations and `_meta`) by its serialized size.
//!
//! Over the budget, blocks are taken in order, each from what is left once
//! the later ones' smallest forms (a placeholder, a marker) are set aside:
//! a text block is cut on a char boundary and ends with a marker saying
//! how much went; any other block that does not fit whole becomes a text
//! placeholder saying what it was and how big; `structuredContent` and
//! then the result's `_meta` come last and are left out with a note (a
//! text block) when they do not fit. The same blocks stay in the same
//! order; the whole is never over the budget; a result within the budget
//! is left as it is (so cutting twice is cutting once).

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde::Serialize;

/// What the cut did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    /// Text blocks cut with a marker.
    pub texts_cut: usize,
    /// Blocks replaced by a placeholder.
    pub blocks_left_out: usize,
    /// `structuredContent` or `_meta` left out with a note.
    pub fields_left_out: usize,
}

impl Cut {
    pub fn is_empty(&self) -> bool {
        *self == Cut::default()
    }
}

/// Cuts `result` to at most `budget` bytes as measured by `result_size`.
pub fn cut_to_budget(result: &mut CallToolResult, budget: usize) -> Cut {
    let mut cut = Cut::default();
    if result_size(result) <= budget {
        return cut;
    }
    let sizes: Vec<usize> = result.content.iter().map(block_size).collect();
    let floors: Vec<usize> = result
        .content
        .iter()
        .zip(&sizes)
        .map(|(block, &size)| size.min(smallest_form(block, size, budget)))
        .collect();
    let structured = result.structured_content.as_ref().map(json_len);
    let meta = result.meta.as_ref().map(json_len);
    let tail_floor = |name: &str, size: Option<usize>| {
        size.map_or(0, |size| size.min(note(name, size, budget).len()))
    };
    let structured_floor = tail_floor(STRUCTURED, structured);
    let meta_floor = tail_floor(META, meta);
    let mut reserve = floors
        .iter()
        .fold(structured_floor.saturating_add(meta_floor), |a, b| {
            a.saturating_add(*b)
        });
    let mut left = budget;
    for ((block, &size), &floor) in result.content.iter_mut().zip(&sizes).zip(&floors) {
        reserve = reserve.saturating_sub(floor);
        let room = left.saturating_sub(reserve);
        left = left.saturating_sub(fit_block(block, size, room, budget, &mut cut));
    }
    reserve = reserve.saturating_sub(structured_floor);
    if let Some(size) = structured {
        let room = left.saturating_sub(reserve);
        if size <= room {
            left -= size;
        } else {
            result.structured_content = None;
            left = left.saturating_sub(push_note(result, STRUCTURED, size, room, budget));
            cut.fields_left_out += 1;
        }
    }
    if let Some(size) = meta
        && size > left
    {
        result.meta = None;
        push_note(result, META, size, left, budget);
        cut.fields_left_out += 1;
    }
    cut
}

const STRUCTURED: &str = "structuredContent";
const META: &str = "the result's _meta";

/// What a result weighs against the budget (see the module's doc).
pub fn result_size(result: &CallToolResult) -> usize {
    let blocks = result
        .content
        .iter()
        .fold(0usize, |a, b| a.saturating_add(block_size(b)));
    blocks
        .saturating_add(result.structured_content.as_ref().map_or(0, json_len))
        .saturating_add(result.meta.as_ref().map_or(0, json_len))
}

/// What one block weighs: its payload (text bytes, decoded binary bytes)
/// and its other fields' serialized size.
pub fn block_size(block: &ContentBlock) -> usize {
    let fields = |meta: usize, annotations: usize| meta.saturating_add(annotations);
    match block {
        ContentBlock::Text(t) => t
            .text
            .len()
            .saturating_add(fields(opt_len(&t.meta), opt_len(&t.annotations))),
        ContentBlock::Image(i) => decoded_len(&i.data)
            .saturating_add(i.mime_type.len())
            .saturating_add(fields(opt_len(&i.meta), opt_len(&i.annotations))),
        ContentBlock::Audio(a) => decoded_len(&a.data)
            .saturating_add(a.mime_type.len())
            .saturating_add(fields(opt_len(&a.meta), opt_len(&a.annotations))),
        ContentBlock::Resource(r) => resource_size(&r.resource)
            .saturating_add(fields(opt_len(&r.meta), opt_len(&r.annotations))),
        other => json_len(other),
    }
}

fn resource_size(resource: &ResourceContents) -> usize {
    let named = |uri: &str, mime: &Option<String>, meta: usize| {
        uri.len()
            .saturating_add(mime.as_ref().map_or(0, String::len))
            .saturating_add(meta)
    };
    match resource {
        ResourceContents::TextResourceContents {
            uri,
            mime_type,
            text,
            meta,
        } => named(uri, mime_type, opt_len(meta)).saturating_add(text.len()),
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            meta,
        } => named(uri, mime_type, opt_len(meta)).saturating_add(decoded_len(blob)),
        other => json_len(other),
    }
}

/// The bytes base64 `data` decodes to (whitespace ignored, padding
/// counted off), without decoding it.
pub fn decoded_len(data: &str) -> usize {
    let mut chars = 0usize;
    let mut padding = 0usize;
    for byte in data.bytes().filter(|b| !b.is_ascii_whitespace()) {
        chars += 1;
        padding = if byte == b'=' { padding + 1 } else { 0 };
    }
    (chars / 4 * 3 + (chars % 4 * 3) / 4).saturating_sub(padding.min(2))
}

/// Fits one block into `room`: as it is, cut (text) or a placeholder.
/// Returns its size now.
fn fit_block(
    block: &mut ContentBlock,
    size: usize,
    room: usize,
    budget: usize,
    cut: &mut Cut,
) -> usize {
    if size <= room {
        return size;
    }
    if let ContentBlock::Text(t) = block {
        let fields = size - t.text.len();
        // Its annotations and _meta stay when they leave room for the marker.
        let text_room = if fields.saturating_add(marker(t.text.len(), t.text.len()).len()) <= room {
            room - fields
        } else {
            t.meta = None;
            t.annotations = None;
            room
        };
        t.text = cut_text(&t.text, text_room);
        cut.texts_cut += 1;
    } else {
        let why = placeholder(block, size, budget);
        *block = ContentBlock::text(floor_str(&why, room));
        cut.blocks_left_out += 1;
    }
    block_size(block)
}

/// The smallest a block can be made: a text's marker, another block's
/// placeholder.
fn smallest_form(block: &ContentBlock, size: usize, budget: usize) -> usize {
    match block {
        ContentBlock::Text(t) => marker(t.text.len(), t.text.len()).len(),
        other => placeholder(other, size, budget).len(),
    }
}

/// `text` cut to at most `room` bytes on a char boundary, ending with a
/// marker saying how much was removed (itself cut when even it does not fit).
pub fn cut_text(text: &str, room: usize) -> String {
    let total = text.len();
    if total <= room {
        return text.to_string();
    }
    let longest = marker(total, total);
    if longest.len() > room {
        return floor_str(&longest, room).to_string();
    }
    let mut keep = floor_boundary(text, room - longest.len());
    // A shorter count may leave a few more bytes of the text.
    let shorter = marker(total - keep, total).len();
    let more = floor_boundary(text, room - shorter);
    if more > keep && more + marker(total - more, total).len() <= room {
        keep = more;
    }
    format!("{}{}", &text[..keep], marker(total - keep, total))
}

fn marker(removed: usize, total: usize) -> String {
    format!("\n[substrat: output truncated, {removed} of {total} bytes removed]")
}

/// What a left-out block was, how big, and why it went.
fn placeholder(block: &ContentBlock, size: usize, budget: usize) -> String {
    let kind = |kind: &str, mime: &str| {
        let mime = floor_str(mime, 100);
        if mime.starts_with(&format!("{kind}/")) {
            mime.to_string()
        } else if mime.is_empty() {
            kind.to_string()
        } else {
            format!("{kind} ({mime})")
        }
    };
    let what = match block {
        ContentBlock::Image(i) => kind("image", &i.mime_type),
        ContentBlock::Audio(a) => kind("audio", &a.mime_type),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents { uri, mime_type, .. }
            | ResourceContents::BlobResourceContents { uri, mime_type, .. } => {
                let mime = mime_type.as_deref().unwrap_or_default();
                format!("{} {}", kind("resource", mime), floor_str(uri, 100))
            }
            _ => "resource".to_string(),
        },
        ContentBlock::ResourceLink(l) => format!("resource link {}", floor_str(&l.uri, 100)),
        ContentBlock::Text(_) => "text".to_string(),
        _ => "content block".to_string(),
    };
    note(&what, size, budget)
}

/// Says what went, how big, and whether it alone is over the limit or
/// only over what the blocks before it left.
fn note(what: &str, size: usize, budget: usize) -> String {
    let over = if size <= budget {
        "over what is left of this role's limit of"
    } else {
        "over this role's limit of"
    };
    format!(
        "[substrat: {what}, {}: {over} {}, left out]",
        human(size),
        human(budget)
    )
}

/// Appends the note for a left-out field, within `room`; returns its size.
fn push_note(
    result: &mut CallToolResult,
    what: &str,
    size: usize,
    room: usize,
    budget: usize,
) -> usize {
    let text = note(what, size, budget);
    let text = floor_str(&text, room);
    if text.is_empty() {
        return 0;
    }
    result.content.push(ContentBlock::text(text));
    text.len()
}

/// 512 bytes, 3 KiB, 2.3 MiB.
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    let value = (value * 10.0).round() / 10.0;
    if value.fract() == 0.0 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

/// The longest prefix of `text` of at most `room` bytes ending on a char
/// boundary.
fn floor_str(text: &str, room: usize) -> &str {
    &text[..floor_boundary(text, room)]
}

fn floor_boundary(text: &str, room: usize) -> usize {
    let mut at = room.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn opt_len<T: Serialize>(value: &Option<T>) -> usize {
    value.as_ref().map_or(0, json_len)
}

/// The length of `value` serialized, counted without building it.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Model types and JSON values always serialize; a failure counts as
    // what was written before it.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
#[path = "output_budget_tests.rs"]
mod tests;
