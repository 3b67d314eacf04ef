//! Colour only where a person reads it: on a terminal, and never with
//! `NO_COLOR` set to a non-empty value (no-color.org). Log files and
//! pipes get plain text.

/// Whether output to a stream that `is_terminal` may carry colour codes.
pub fn colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
