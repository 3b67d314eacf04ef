//! Relative paths as text for the layer's JSON files: printable ASCII as
//! is, every other byte (and `%`) as `%XX`, so any file name round-trips.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(crate) fn encode_path(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn decode_path(text: &str) -> Option<PathBuf> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(OsStr::from_bytes(&out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_name_round_trips() {
        let odd = OsStr::from_bytes(b"a/b%c\n\xff d");
        let text = encode_path(Path::new(odd));
        assert_eq!(text, "a/b%25c%0A%FF d");
        assert_eq!(decode_path(&text).as_deref(), Some(Path::new(odd)));
        assert_eq!(decode_path("bad%z"), None);
        assert_eq!(decode_path("bad%"), None);
    }
}
