//! The body read a byte at a time, strictly as JSON: texts decoded
//! (escapes, surrogate pairs) and kept up to a bound, numbers kept as
//! written, the rest only checked.

use std::io::BufRead;

use super::{MAX_TEXT, SkimError, Text};

/// The body, a byte at a time, with its position.
pub(super) struct Source<R> {
    pub(super) inner: R,
    pub(super) pos: u64,
}

impl<R: BufRead> Source<R> {
    pub(super) fn peek(&mut self) -> std::io::Result<Option<u8>> {
        Ok(self.inner.fill_buf()?.first().copied())
    }

    pub(super) fn bump(&mut self) {
        self.inner.consume(1);
        self.pos += 1;
    }

    pub(super) fn next(&mut self) -> std::io::Result<Option<u8>> {
        let byte = self.peek()?;
        if byte.is_some() {
            self.bump();
        }
        Ok(byte)
    }

    pub(super) fn expect(&mut self, want: u8) -> Result<(), SkimError> {
        match self.next()? {
            Some(b) if b == want => Ok(()),
            _ => Err(SkimError::Syntax(self.pos)),
        }
    }

    pub(super) fn whitespace(&mut self) -> std::io::Result<()> {
        loop {
            let buf = self.inner.fill_buf()?;
            let n = buf
                .iter()
                .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(buf.len());
            let more = n == buf.len() && n > 0;
            self.inner.consume(n);
            self.pos += n as u64;
            if !more {
                return Ok(());
            }
        }
    }

    pub(super) fn literal(&mut self, word: &[u8]) -> Result<(), SkimError> {
        for &b in word {
            self.expect(b)?;
        }
        Ok(())
    }

    /// A number's text (kept whole up to `MAX_TEXT`; a longer one is
    /// read as an impossible count).
    pub(super) fn number(&mut self) -> Result<String, SkimError> {
        let start = self.pos;
        let mut text = Vec::new();
        if self.peek()? == Some(b'-') {
            self.bump();
            text.push(b'-');
        }
        match self.next()? {
            Some(b'0') => text.push(b'0'),
            Some(d @ b'1'..=b'9') => {
                text.push(d);
                self.digits(&mut text)?;
            }
            _ => return Err(SkimError::Syntax(self.pos)),
        }
        if self.peek()? == Some(b'.') {
            self.bump();
            text.push(b'.');
            if self.digits(&mut text)? == 0 {
                return Err(SkimError::Syntax(self.pos));
            }
        }
        if let Some(e @ (b'e' | b'E')) = self.peek()? {
            self.bump();
            text.push(e);
            if let Some(s @ (b'+' | b'-')) = self.peek()? {
                self.bump();
                text.push(s);
            }
            if self.digits(&mut text)? == 0 {
                return Err(SkimError::Syntax(self.pos));
            }
        }
        if self.pos - start > MAX_TEXT as u64 {
            return Ok("-".into());
        }
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    fn digits(&mut self, text: &mut Vec<u8>) -> std::io::Result<usize> {
        let mut n = 0;
        while let Some(d @ b'0'..=b'9') = self.peek()? {
            self.bump();
            if text.len() <= MAX_TEXT {
                text.push(d);
            }
            n += 1;
        }
        Ok(n)
    }

    /// A string, decoded; its first `keep` bytes are kept (`cut` if
    /// there were more), the rest only checked. None when the kept part
    /// is not UTF-8.
    pub(super) fn string(&mut self, keep: usize) -> Result<Option<Text>, SkimError> {
        self.expect(b'"')?;
        let mut kept = Vec::new();
        let mut cut = false;
        loop {
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                return Err(SkimError::Syntax(self.pos));
            }
            let plain = buf
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .unwrap_or(buf.len());
            let stopped = plain < buf.len();
            let room = keep.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..plain.min(room)]);
            cut |= plain > room;
            self.inner.consume(plain);
            self.pos += plain as u64;
            if !stopped {
                continue;
            }
            match self.next()? {
                Some(b'"') => break,
                Some(b'\\') => {
                    let mut utf8 = [0u8; 4];
                    let decoded = self.escape()?.encode_utf8(&mut utf8);
                    if kept.len() + decoded.len() <= keep {
                        kept.extend_from_slice(decoded.as_bytes());
                    } else {
                        cut = true;
                    }
                }
                _ => return Err(SkimError::Syntax(self.pos)),
            }
        }
        Ok(String::from_utf8(kept).ok().map(|text| Text { text, cut }))
    }

    /// The character of an escape (after its backslash); a lone
    /// surrogate is U+FFFD, as lenient parsers read it.
    fn escape(&mut self) -> Result<char, SkimError> {
        let c = match self.next()? {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let high = self.hex4()?;
                if (0xD800..0xDC00).contains(&high) && self.peek()? == Some(b'\\') {
                    self.bump();
                    self.expect(b'u')?;
                    let low = self.hex4()?;
                    if (0xDC00..0xE000).contains(&low) {
                        let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                        return Ok(char::from_u32(code).unwrap_or('\u{FFFD}'));
                    }
                    return Ok('\u{FFFD}');
                }
                char::from_u32(high).unwrap_or('\u{FFFD}')
            }
            _ => return Err(SkimError::Syntax(self.pos)),
        };
        Ok(c)
    }

    fn hex4(&mut self) -> Result<u32, SkimError> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = match self.next()? {
                Some(b) => (b as char).to_digit(16),
                None => None,
            };
            value = value * 16 + digit.ok_or(SkimError::Syntax(self.pos))?;
        }
        Ok(value)
    }
}
