//! Text an agent chose, made safe to show a person (issue 40): every
//! character that could drive a terminal or hide what is written is
//! spelled out visibly instead, as git's quoting and `ls -b` do.
//!
//! Escaped, everywhere: C0 controls (`\t`, `\n`, `\r`, otherwise `\xNN`;
//! ESC as `\x1b`, so no escape sequence of any kind stays live), DEL
//! (`\x7f`), C1 controls (`\u{9b}`: 8-bit CSI and friends), the
//! bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
//! U+2066-U+2069) and the invisible format characters that can hide or
//! reorder text (soft hyphen, zero-width spaces and joiners, word joiner
//! and invisible operators, line and paragraph separators, byte order
//! mark, interlinear annotation, the tag characters U+E0000-U+E007F).
//! Bytes that are not UTF-8 are shown as `\xNN`. A backslash stays as it
//! is: the escapes are for eyes, not for a parser.
//!
//! Machine formats keep the data: [`json_safe`] only writes the same
//! characters as JSON `\uXXXX` escapes, which every JSON reader decodes to
//! the very same string.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Which characters of an otherwise unsafe class a caller keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Nothing: one line of text (a name, a reason, a path).
    Nothing,
    /// Newline and tab: several lines (a diff on a terminal, an error).
    Lines,
}

/// Whether `c` must not reach a terminal as itself.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_hiding_format(c)
}

/// Format characters that reorder, hide or split text while showing
/// nothing themselves.
fn is_hiding_format(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

fn escape_with(text: &str, keep: Keep) -> Cow<'_, str> {
    let kept = |c: char| keep == Keep::Lines && (c == '\n' || c == '\t');
    if !text.chars().any(|c| is_unsafe(c) && !kept(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if kept(c) || !is_unsafe(c) {
            out.push(c);
        } else {
            push_escape(&mut out, c);
        }
    }
    Cow::Owned(out)
}

/// The visible spelling of one unsafe character.
fn push_escape(out: &mut String, c: char) {
    match c {
        '\t' => out.push_str("\\t"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// One line of agent text (a name, a state, a reason, a result's first
/// line): every unsafe character escaped, newline and tab included.
pub fn escape_text(text: &str) -> Cow<'_, str> {
    escape_with(text, Keep::Nothing)
}

/// Several lines of agent text (a diff on a terminal, an error chain):
/// newline and tab kept, everything else unsafe escaped (a carriage
/// return too, so no line overwrites another).
pub fn escape_lines(text: &str) -> Cow<'_, str> {
    escape_with(text, Keep::Lines)
}

/// Bytes that may not be UTF-8 (a file name, a link target): as
/// [`escape_text`], and each byte outside UTF-8 as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => escape_text(text),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len() + 16);
            for chunk in bytes.utf8_chunks() {
                out.push_str(&escape_text(chunk.valid()));
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            Cow::Owned(out)
        }
    }
}

/// A path for people: [`escape_bytes`] of its bytes.
pub fn escape_path(path: &std::path::Path) -> Cow<'_, str> {
    use std::os::unix::ffi::OsStrExt;
    escape_bytes(path.as_os_str().as_bytes())
}

/// A path as git writes one in a patch: as is when plain printable ASCII,
/// else in double quotes with C escapes (`\t`, `\n`, `\"`, `\\`, and octal
/// for every other byte outside printable ASCII, so no control, C1, bidi
/// or other non-ASCII byte is ever written raw). `git apply` reads it.
pub fn quote_path(bytes: &[u8]) -> String {
    let plain = bytes
        .iter()
        .all(|b| (0x21..0x7f).contains(b) && *b != b'"' && *b != b'\\' || *b == b' ');
    if plain {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut out = String::from("\"");
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// Serialized JSON with DEL, the C1 controls and the hiding format
/// characters written as `\uXXXX` escapes (serde_json escapes only C0):
/// the same JSON value, nothing raw for a terminal. Outside strings JSON
/// has only ASCII, so every such character is inside one.
pub fn json_safe(json: String) -> String {
    if !json.chars().any(is_unsafe) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_unsafe(c) && !c.is_ascii_whitespace() {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One sample of each class, and its spelling.
    const CLASSES: &[(&str, &str)] = &[
        ("\u{0}", "\\x00"),
        ("\u{7}", "\\x07"),
        ("\u{8}", "\\x08"),
        ("\u{1b}[2J", "\\x1b[2J"),
        ("\u{1b}]52;c;eA==\u{7}", "\\x1b]52;c;eA==\\x07"),
        ("\u{1b}P+q\u{1b}\\", "\\x1bP+q\\x1b\\"),
        ("\u{7f}", "\\x7f"),
        ("\u{85}", "\\u{85}"),
        ("\u{9b}31m", "\\u{9b}31m"),
        ("\u{9d}0;t\u{9c}", "\\u{9d}0;t\\u{9c}"),
        ("\u{61c}", "\\u{61c}"),
        ("\u{200e}\u{200f}", "\\u{200e}\\u{200f}"),
        ("\u{202a}\u{202e}", "\\u{202a}\\u{202e}"),
        ("\u{2066}\u{2069}", "\\u{2066}\\u{2069}"),
        (
            "\u{200b}\u{200d}\u{2060}\u{feff}",
            "\\u{200b}\\u{200d}\\u{2060}\\u{feff}",
        ),
        ("\u{2028}\u{2029}", "\\u{2028}\\u{2029}"),
        ("\u{e0041}", "\\u{e0041}"),
    ];

    #[test]
    fn each_class_is_spelled_out() {
        for (raw, shown) in CLASSES {
            let text = format!("a{raw}b");
            assert_eq!(escape_text(&text), format!("a{shown}b"), "{raw:?}");
            assert_eq!(escape_lines(&text), format!("a{shown}b"), "{raw:?}");
            assert_eq!(escape_bytes(text.as_bytes()), format!("a{shown}b"));
        }
    }

    #[test]
    fn lines_keep_newline_and_tab_only() {
        assert_eq!(escape_text("a\tb\r\nc"), "a\\tb\\r\\nc");
        assert_eq!(escape_lines("a\tb\r\nc"), "a\tb\\r\nc");
    }

    #[test]
    fn plain_text_is_borrowed() {
        let text = "café ☕ \\x1b [ok] עברית";
        assert!(matches!(escape_text(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(escape_lines("a\n\tb"), Cow::Borrowed(_)));
    }

    #[test]
    fn bytes_outside_utf8_are_hex() {
        assert_eq!(escape_bytes(b"a\x9b1m\xff\x1b"), "a\\x9b1m\\xff\\x1b");
        assert_eq!(escape_bytes("é\u{202e}".as_bytes()), "é\\u{202e}");
    }

    #[test]
    fn git_quoting_leaves_no_raw_byte_outside_printable_ascii() {
        assert_eq!(quote_path(b"src/a b.txt"), "src/a b.txt");
        assert_eq!(
            quote_path("x\u{1b}[1m\u{202e}\"\\\t\n\u{7f}".as_bytes()),
            "\"x\\033[1m\\342\\200\\256\\\"\\\\\\t\\n\\177\""
        );
        assert_eq!(quote_path(b"\x9b\xff"), "\"\\233\\377\"");
    }

    #[test]
    fn json_keeps_the_value_and_no_raw_character() {
        for (raw, _) in CLASSES {
            let value = serde_json::json!({ "name": format!("a{raw}b") });
            let json = json_safe(serde_json::to_string_pretty(&value).unwrap_or_default());
            assert!(!json.chars().any(|c| is_unsafe(c) && c != '\n'), "{json:?}");
            let back: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
            assert_eq!(back, value, "{json}");
        }
        assert_eq!(json_safe("\"\u{e0041}\"".into()), "\"\\udb40\\udc41\"");
    }
}
