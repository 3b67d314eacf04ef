//! Colour only where a person reads it: on a terminal, and never with
//! `NO_COLOR` set to a non-empty value (no-color.org). Log files and
//! pipes get plain text.

/// Whether output to a stream that `is_terminal` may carry colour codes.
pub fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// An error chain (`{e:#}`) for stderr: errors carry paths and words an
/// agent chose (file names in its layer, its results), so every control
/// character but newline and tab is shown escaped (issue 40).
pub fn error_text(e: &anyhow::Error) -> String {
    substrat_policy::text::escape_lines(&format!("{e:#}")).into_owned()
}

/// The daemon log's fields: the values are agents' names, reasons,
/// stream kinds and errors with their paths. tracing-subscriber escapes
/// only ESC, BEL, BS, FF, DEL and C1 in them; every other control (a CR
/// or newline that forges a log line, SO/SI), the bidi controls and the
/// invisible characters go through the one escaper too (issue 40).
pub fn log_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static
{
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let shown = format!("{value:?}");
        let shown = substrat_policy::text::escape_text(&shown);
        if field.name() == "message" {
            write!(w, "{shown}")
        } else {
            write!(w, "{field}={shown}")
        }
    })
    .delimited(" ")
}

/// How the daemon logs (`daemon --log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people, agents' words escaped (`log_fields`).
    #[default]
    Text,
    /// One JSON object per line, with the fields of the turn it happened
    /// in (`span`: agent, agent_id, turn), for log collectors.
    Json,
}

/// Installs the daemon's log subscriber on stderr: `SUBSTRAT_LOG` filters
/// (default `info,rmcp=error`).
pub fn init_log(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SUBSTRAT_LOG")
        .unwrap_or_else(|_| "info,rmcp=error".into());
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .fmt_fields(log_fields())
            .with_writer(|| crate::progress::AroundLine(std::io::stderr()))
            .with_ansi(colour(std::io::IsTerminal::is_terminal(&std::io::stderr())))
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(|| JsonSafe(std::io::stderr()))
            .init(),
    }
}

/// A JSON log line with every character that could act on a terminal or
/// hide text (bidi controls, invisible ones) written as `\uXXXX`, which
/// JSON reads back the same: serde escapes only the C0 controls.
#[derive(Debug)]
pub struct JsonSafe<W>(pub W);

impl<W: std::io::Write> std::io::Write for JsonSafe<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        // The subscriber writes an event's whole line at once.
        let text = String::from_utf8_lossy(bytes).into_owned();
        self.0
            .write_all(substrat_policy::text::json_safe(text).as_bytes())?;
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    const BAD: &str = "a\u{1b}]0;t\u{7}\r\nINFO forged\u{202e}\u{9b}2J\u{200b}";
    const SHOWN: &str = "a\\x1b]0;t\\x07\\r\\nINFO forged\\u{202e}\\u{9b}2J\\u{200b}";

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn log_lines_show_agent_words_escaped() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(super::log_fields())
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(agent = %BAD, reason = BAD, "turn failed: {BAD}");
        });
        let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(
            log.contains(&format!("turn failed: {SHOWN} agent={SHOWN}")),
            "{log}"
        );
        assert!(
            !log.trim_end().chars().any(substrat_policy::text::is_unsafe),
            "{log:?}"
        );
    }

    #[test]
    fn an_error_chain_keeps_its_lines_only() {
        let e = anyhow::anyhow!("cannot read {BAD}\nsecond line").context("apply");
        let shown = super::error_text(&e);
        // A newline of the chain stays (errors may have several lines);
        // the CR before it and every other control is spelled out.
        let lines = SHOWN.replace("\\r\\n", "\\r\n");
        assert_eq!(shown, format!("apply: cannot read {lines}\nsecond line"));
    }
}
