//! The audit log: one JSON line per decision, appended to `audit.log` in
//! the state directory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Denied,
    Limited,
}

/// Why a call was not allowed: the one list the call path decides with,
/// the audit log writes (`reason`) and the metrics count
/// (`substrat_denials_total`'s `rule`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The agent's calls per minute (all, or this tool's) are spent.
    RateLimited,
    /// The turn's tool steps are spent.
    StepLimit,
    /// Not on the agent's menu: out of scope, over the cap, or no such
    /// tool (one answer for all three).
    OutOfScope,
    /// The state database could not be reached: the call may be made again.
    Unavailable,
    /// The upstream server failed the call (its words, redacted).
    Upstream(String),
    /// The tool answered with an error (its code; empty when it has none).
    ToolError(String),
}

impl Refusal {
    /// The audit line's `reason`.
    pub fn reason(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Refusal::RateLimited => "rate_limited".into(),
            Refusal::StepLimit => "step_limit".into(),
            Refusal::OutOfScope => "unknown_or_out_of_scope".into(),
            Refusal::Unavailable => "unavailable".into(),
            Refusal::Upstream(text) => format!("upstream: {text}").into(),
            Refusal::ToolError(code) => code.as_str().into(),
        }
    }

    /// The metrics' `rule` label: a fixed few values.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::RateLimited => "rate",
            Refusal::StepLimit => "steps",
            Refusal::OutOfScope => "scope",
            Refusal::Unavailable => "unavailable",
            Refusal::Upstream(_) => "upstream",
            Refusal::ToolError(_) => "other",
        }
    }
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

/// Refusals (denied or limited) written per agent in one second; past
/// it they are counted, and the count written as one line when the next
/// second's first refusal of that agent comes (an agent hammering a limit
/// must not fill the disk: a line is ~200 bytes).
pub const REFUSALS_PER_SECOND: u32 = 20;

/// One line of the audit log as read back (`recent`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Recorded {
    pub ts_ms: i64,
    pub agent_id: String,
    pub tool: String,
    pub decision: Decision,
    pub reason: String,
}

/// The last `n` decisions about `agent_id` in `tail`, the end of an audit
/// log (the live view reads its last bytes), oldest first. A first line
/// cut by where the tail starts, and any line that is not an entry, are
/// passed over.
pub fn recent(tail: &[u8], agent_id: &str, n: usize) -> Vec<Recorded> {
    let mut found: Vec<Recorded> = tail
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| serde_json::from_slice::<Recorded>(line).ok())
        .filter(|r| r.agent_id == agent_id)
        .take(n)
        .collect();
    found.reverse();
    found
}

#[derive(Debug)]
pub struct Audit {
    file: Mutex<File>,
    /// Per agent: the second being counted, refusals written in it, and
    /// refusals left unwritten since the last summary.
    refusals: Mutex<std::collections::HashMap<String, (i64, u32, u64)>>,
}

impl Audit {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
            refusals: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Whether a refusal of `agent_id` at `ts_ms` is written; the number
    /// left unwritten before it, to be written first.
    fn admit_refusal(&self, agent_id: &str, ts_ms: i64) -> (bool, u64) {
        let Ok(mut refusals) = self.refusals.lock() else {
            return (true, 0);
        };
        let second = ts_ms.div_euclid(1000);
        let (at, written, unwritten) = refusals.entry(agent_id.to_string()).or_default();
        if *at != second {
            *at = second;
            *written = 0;
        }
        if *written >= REFUSALS_PER_SECOND {
            *unwritten += 1;
            return (false, 0);
        }
        *written += 1;
        (true, std::mem::take(unwritten))
    }

    /// Appends one line. What an agent chose (a tool's name, a method, a
    /// reason quoting them) is cut to MAX_FIELD bytes: a 4 MiB tool name
    /// must not cost 4 MiB of disk a call.
    pub fn record(&self, entry: &Entry<'_>) {
        if entry.decision != Decision::Allowed {
            let (write, unwritten) = self.admit_refusal(entry.agent_id, entry.ts_ms);
            if unwritten > 0 {
                let reason = format!(
                    "{unwritten} refusals not written (over {REFUSALS_PER_SECOND} a second)"
                );
                self.write(&Entry {
                    tool: "(refusals)",
                    reason: &reason,
                    ..*entry
                });
            }
            if !write {
                return;
            }
        }
        self.write(entry);
    }

    fn write(&self, entry: &Entry<'_>) {
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

    #[test]
    fn refusals_past_a_rate_are_counted_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::open(&dir.path().join("audit.log")).unwrap();
        let entry = |ts_ms, agent_id, decision| Entry {
            ts_ms,
            agent_id,
            agent: "w",
            tool: "t",
            decision,
            reason: "r",
            latency_us: 0,
        };
        for n in 0..100 {
            audit.record(&entry(5_000 + n, "a", Decision::Limited));
            audit.record(&entry(5_000 + n, "a", Decision::Allowed));
        }
        audit.record(&entry(5_500, "b", Decision::Denied));
        audit.record(&entry(6_000, "a", Decision::Denied));
        let text = std::fs::read_to_string(dir.path().join("audit.log")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let of = |agent: &str, decision: &str| {
            lines
                .iter()
                .filter(|l| l["agent_id"] == agent && l["decision"] == decision)
                .count()
        };
        // Every allowed call; 20 refusals in the first second, then the
        // summary of the 80 left out, then the next second's refusal.
        assert_eq!(of("a", "allowed"), 100);
        assert_eq!(of("a", "limited"), 20);
        assert_eq!(of("b", "denied"), 1);
        let tail: Vec<&str> = lines[lines.len() - 2..]
            .iter()
            .map(|l| l["reason"].as_str().unwrap())
            .collect();
        assert_eq!(tail, ["80 refusals not written (over 20 a second)", "r"]);
    }

    #[test]
    fn the_recent_decisions_of_one_agent_are_read_from_a_cut_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let audit = Audit::open(&path).unwrap();
        for (n, agent_id) in ["a", "b", "a", "a", "b", "a"].into_iter().enumerate() {
            audit.record(&Entry {
                ts_ms: n as i64,
                agent_id,
                agent: "w",
                tool: &format!("t{n}"),
                decision: Decision::Allowed,
                reason: "",
                latency_us: 0,
            });
        }
        let text = std::fs::read(&path).unwrap();
        // The tail starts inside the first line, and holds a stray line.
        let mut tail = text[10..].to_vec();
        tail.extend_from_slice(b"not json\n");
        let tools =
            |n| -> Vec<String> { recent(&tail, "a", n).into_iter().map(|r| r.tool).collect() };
        assert_eq!(tools(2), ["t3", "t5"]);
        assert_eq!(tools(9), ["t2", "t3", "t5"]);
        assert!(recent(&tail, "c", 9).is_empty());
    }
}
