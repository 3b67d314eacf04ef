//! The audit log: one JSON line per decision, appended to `audit.log` in
//! the state directory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Denied,
    Limited,
}

/// The longest text field of an audit line, in bytes.
pub const MAX_FIELD: usize = 256;

/// `text` cut to MAX_FIELD bytes on a character boundary.
fn cut(text: &str) -> &str {
    if text.len() <= MAX_FIELD {
        return text;
    }
    let mut end = MAX_FIELD;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Entry<'a> {
    pub ts_ms: i64,
    pub agent_id: &'a str,
    pub agent: &'a str,
    pub tool: &'a str,
    pub decision: Decision,
    pub reason: &'a str,
    pub latency_us: u64,
}

#[derive(Debug)]
pub struct Audit {
    file: Mutex<File>,
}

impl Audit {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Appends one line. What an agent chose (a tool's name, a method, a
    /// reason quoting them) is cut to MAX_FIELD bytes: a 4 MiB tool name
    /// must not cost 4 MiB of disk a call.
    pub fn record(&self, entry: &Entry<'_>) {
        let entry = Entry {
            tool: cut(entry.tool),
            reason: cut(entry.reason),
            agent: cut(entry.agent),
            ..*entry
        };
        if let Ok(mut line) = serde_json::to_vec(&entry) {
            line.push(b'\n');
            if let Ok(mut file) = self.file.lock()
                && let Err(e) = file.write_all(&line)
            {
                tracing::error!(error = %e, "cannot write the audit log");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_agent_chose_is_cut_to_a_bounded_line() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::open(&dir.path().join("audit.log")).unwrap();
        let huge = "é".repeat(3 << 20);
        audit.record(&Entry {
            ts_ms: 1,
            agent_id: "a",
            agent: "w1",
            tool: &huge,
            decision: Decision::Denied,
            reason: &huge,
            latency_us: 0,
        });
        let line = std::fs::read_to_string(dir.path().join("audit.log")).unwrap();
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(entry["tool"].as_str().unwrap(), "é".repeat(128));
        assert_eq!(entry["reason"].as_str().unwrap().len(), 256);
        assert!(line.len() < 1024, "{}", line.len());
    }
}
