//! A progress line for a long wait a person sits through (`check --prove`
//! over many policies), on stderr and only when stderr is a terminal: a
//! pipe, a log file or a test comparing outputs sees nothing of it. One
//! line, redrawn in place (`\r`, erase line), erased when done.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

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
        }
    }

    /// The step `item` begins (its name escaped: policy names are files').
    pub fn step(&mut self, item: &str) {
        self.done += 1;
        let due = self.drawn.is_none_or(|at| at.elapsed() >= REDRAW);
        if !self.shown || !due {
            return;
        }
        self.drawn = Some(Instant::now());
        let line = self.line(item);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
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
        if self.shown && self.done > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
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
}
