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
