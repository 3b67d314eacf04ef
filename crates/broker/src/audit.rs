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

#[derive(Debug, Serialize)]
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

    pub fn record(&self, entry: &Entry<'_>) {
        if let Ok(mut line) = serde_json::to_vec(entry) {
            line.push(b'\n');
            if let Ok(mut file) = self.file.lock()
                && let Err(e) = file.write_all(&line)
            {
                tracing::error!(error = %e, "cannot write the audit log");
            }
        }
    }
}
