//! Rate limits (token buckets) and output truncation.

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

/// Cuts `text` to at most `limit` bytes on a UTF-8 boundary and says how
/// much was cut, so an agent never mistakes a truncated result for a whole.
pub fn truncate_output(text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let marker_room = 64;
    let mut cut = limit.saturating_sub(marker_room);
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let removed = text.len() - cut;
    format!(
        "{}\n[substrat: output truncated, {removed} of {} bytes removed]",
        &text[..cut],
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    #[test]
    fn truncation_keeps_utf8_and_says_so() {
        let text = "é".repeat(100); // 200 bytes
        let cut = truncate_output(text.clone(), 101);
        assert!(cut.len() <= 101 + 80);
        assert!(cut.contains("[substrat: output truncated,"));
        assert!(cut.starts_with(&"é".repeat(18)));
        assert_eq!(truncate_output("short".into(), 100), "short");
    }
}
