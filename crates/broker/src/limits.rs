//! Rate limits (token buckets) and the list limit (the output limit is
//! crate::output_budget's).

use std::time::Instant;

/// A token bucket: `burst` tokens, refilled at `per_minute` a minute.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    per_second: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(per_minute: u32, burst: u32) -> Self {
        let capacity = f64::from(burst.max(1));
        Self {
            capacity,
            tokens: capacity,
            per_second: f64::from(per_minute.max(1)) / 60.0,
            last: Instant::now(),
        }
    }

    /// Takes one token, or says in how many milliseconds one will be there.
    pub fn take(&mut self, now: Instant) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / self.per_second * 1000.0).ceil() as u64)
        }
    }
}

/// Cuts the lists of a JSON value to `max` entries: the value itself when
/// it is an array, and the arrays held directly by an object (a tool's
/// `{"items": [...]}`). Each cut list says so: an array gets a last entry
/// saying how many were dropped, an object a `substrat_note`. Returns how
/// many entries were dropped in all.
pub fn cut_json_lists(value: &mut serde_json::Value, max: usize) -> usize {
    use serde_json::Value;
    let note = |dropped: usize| {
        format!("[substrat: {dropped} more entries dropped (mcp.max_list_entries = {max})]")
    };
    match value {
        Value::Array(items) if items.len() > max => {
            let dropped = items.len() - max;
            items.truncate(max);
            items.push(Value::String(note(dropped)));
            dropped
        }
        Value::Object(map) => {
            let mut notes = Vec::new();
            let mut total = 0;
            for (key, item) in map.iter_mut() {
                if let Value::Array(items) = item
                    && items.len() > max
                {
                    let dropped = items.len() - max;
                    items.truncate(max);
                    notes.push(format!("`{key}`: {dropped} more entries dropped"));
                    total += dropped;
                }
            }
            if total > 0 {
                map.insert(
                    "substrat_note".into(),
                    Value::String(format!(
                        "{} (mcp.max_list_entries = {max})",
                        notes.join("; ")
                    )),
                );
            }
            total
        }
        _ => 0,
    }
}

/// Cuts the lists of an upstream tool's result to `max` entries: its
/// content blocks, and the lists of each text block that is JSON and of
/// its structured content (`cut_json_lists`). Returns how many entries
/// were dropped in all.
pub fn cut_result_lists(result: &mut rmcp::model::CallToolResult, max: usize) -> usize {
    let mut dropped = 0;
    if result.content.len() > max {
        let extra = result.content.len() - max;
        result.content.truncate(max);
        result.content.push(rmcp::model::ContentBlock::text(format!(
            "[substrat: {extra} more content blocks dropped (mcp.max_list_entries = {max})]"
        )));
        dropped += extra;
    }
    for block in result.content.iter_mut() {
        let Some(text) = block.as_text() else {
            continue;
        };
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&text.text) else {
            continue;
        };
        let cut = cut_json_lists(&mut value, max);
        if cut > 0 {
            *block = rmcp::model::ContentBlock::text(value.to_string());
            dropped += cut;
        }
    }
    if let Some(structured) = result.structured_content.as_mut() {
        dropped += cut_json_lists(structured, max);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lists_are_cut_at_the_limit_and_say_so() {
        use serde_json::json;
        // At the limit: nothing cut.
        let mut at = json!([1, 2, 3]);
        assert_eq!(cut_json_lists(&mut at, 3), 0);
        assert_eq!(at, json!([1, 2, 3]));
        // One past: cut, and a last entry says how many went.
        let mut past = json!([1, 2, 3, 4]);
        assert_eq!(cut_json_lists(&mut past, 3), 1);
        assert_eq!(
            past,
            json!([
                1,
                2,
                3,
                "[substrat: 1 more entries dropped (mcp.max_list_entries = 3)]"
            ])
        );
        let mut object = json!({"items": [1, 2, 3, 4, 5], "total": 5, "few": [1]});
        assert_eq!(cut_json_lists(&mut object, 3), 2);
        assert_eq!(
            object,
            json!({"items": [1, 2, 3], "total": 5, "few": [1],
                   "substrat_note": "`items`: 2 more entries dropped (mcp.max_list_entries = 3)"})
        );
        // A result's blocks, and a block that is a JSON list.
        let blocks: Vec<_> = (0..4)
            .map(|i| rmcp::model::ContentBlock::text(format!("{i}")))
            .collect();
        let mut result = rmcp::model::CallToolResult::success(blocks);
        assert_eq!(cut_result_lists(&mut result, 4), 0);
        assert_eq!(cut_result_lists(&mut result, 3), 1);
        assert_eq!(result.content.len(), 4);
        let last = result.content[3].as_text().map(|t| t.text.clone());
        assert_eq!(
            last.as_deref(),
            Some("[substrat: 1 more content blocks dropped (mcp.max_list_entries = 3)]")
        );
        let mut listing =
            rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(
                json!(["a", "b", "c"]).to_string(),
            )]);
        assert_eq!(cut_result_lists(&mut listing, 2), 1);
        let text = listing.content[0].as_text().map(|t| t.text.clone());
        assert_eq!(
            text.as_deref(),
            Some(r#"["a","b","[substrat: 1 more entries dropped (mcp.max_list_entries = 2)]"]"#)
        );
    }

    #[test]
    fn bucket_allows_burst_then_refills() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(60, 3);
        for _ in 0..3 {
            assert!(bucket.take(start).is_ok());
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((990..=1000).contains(&wait), "{wait}");
        assert!(bucket.take(start + Duration::from_millis(1000)).is_ok());
    }
}
