//! A progress line for a long wait a person sits through (`check --prove`
//! over many policies), on stderr and only when stderr is a terminal: a
//! pipe, a log file or a test comparing outputs sees nothing of it. One
//! line, redrawn in place (`\r`, erase line), erased when done. A line
//! shared with the daemon's text log (`Progress::under_log`) is erased
//! before each log line and drawn again after it (`AroundLine`).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The line a log line must step around, while one is drawn.
static HELD: Mutex<Option<String>> = Mutex::new(None);

/// Erases the line.
const ERASE: &str = "\r\x1b[2K";

/// The line is redrawn at most this often (a step can be one file).
const REDRAW: Duration = Duration::from_millis(100);

/// The line, or nothing when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    label: &'static str,
    total: usize,
    done: usize,
    shown: bool,
    drawn: Option<Instant>,
    /// Log lines share stderr: they go around it (`AroundLine`).
    under_log: bool,
}

impl Progress {
    /// A line for `total` steps, drawn when stderr is a terminal and
    /// `TERM` is not `dumb`.
    pub fn new(label: &'static str, total: usize) -> Self {
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        Self::on_terminal(label, total, std::io::stderr().is_terminal() && !dumb)
    }

    /// The same, told whether to draw.
    pub fn on_terminal(label: &'static str, total: usize, shown: bool) -> Self {
        Self {
            label,
            total,
            done: 0,
            shown,
            drawn: None,
            under_log: false,
        }
    }

    /// A line sharing stderr with a log written through `AroundLine`.
    pub fn under_log(label: &'static str, total: usize, shown: bool) -> Self {
        Self {
            under_log: true,
            ..Self::on_terminal(label, total, shown)
        }
    }

    /// The step `item` begins (its name escaped: policy names are files').
    pub fn step(&mut self, item: &str) {
        self.done += 1;
        // A line under a log has few steps, each worth seeing.
        let due = self.under_log || self.drawn.is_none_or(|at| at.elapsed() >= REDRAW);
        if due {
            self.draw(item);
        }
    }

    /// Draws the line as it stands, `item` last.
    pub fn draw(&mut self, item: &str) {
        if !self.shown {
            return;
        }
        self.drawn = Some(Instant::now());
        let line = self.line(item);
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{ERASE}{line}");
        let _ = err.flush();
        if self.under_log {
            *held = Some(line);
        }
    }

    /// What the line says at the current step.
    pub fn line(&self, item: &str) -> String {
        let item = substrat_policy::text::escape_text(item);
        let item: String = item.chars().take(60).collect();
        format!(
            "{} [{}/{}] {item}",
            self.label,
            self.done.min(self.total),
            self.total
        )
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.drawn.is_some() {
            let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{ERASE}");
            let _ = err.flush();
            *held = None;
        }
    }
}

/// A log's writer: the held line, if one is drawn, erased before each
/// log line and drawn again after it, so neither garbles the other.
#[derive(Debug)]
pub struct AroundLine<W>(pub W);

impl<W: Write> Write for AroundLine<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let Some(line) = held.as_deref() else {
            return self.0.write(bytes);
        };
        self.0.write_all(ERASE.as_bytes())?;
        self.0.write_all(bytes)?;
        if bytes.ends_with(b"\n") {
            self.0.write_all(line.as_bytes())?;
        }
        self.0.flush()?;
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_and_escapes_its_item() {
        let mut p = Progress::on_terminal("proving", 3, false);
        p.step("worker");
        assert_eq!(p.line("worker"), "proving [1/3] worker");
        p.step("a\u{1b}[31mred");
        assert_eq!(p.line("a\u{1b}[31mred"), "proving [2/3] a\\x1b[31mred");
    }

    #[test]
    fn a_log_line_steps_around_the_held_line() {
        *HELD.lock().unwrap() = Some("starting upstreams [1/2] time".into());
        let mut out = AroundLine(Vec::new());
        out.write_all(b"a log line\n").unwrap();
        *HELD.lock().unwrap() = None;
        assert_eq!(
            out.0,
            b"\r\x1b[2Ka log line\nstarting upstreams [1/2] time".to_vec()
        );
        let mut out = AroundLine(Vec::new());
        out.write_all(b"no line held\n").unwrap();
        assert_eq!(out.0, b"no line held\n".to_vec());
    }
}
