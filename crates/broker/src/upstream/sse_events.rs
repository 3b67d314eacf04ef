//! Server-sent events as a remote server sends them on the older HTTP+SSE
//! transport (the WHATWG event-stream format): bytes in, events out, with a
//! bound on one event's size so a server cannot grow the broker's memory
//! without end. Pure: the transport feeds what it reads.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field; `message` when none was given.
    pub kind: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event of more than {0} bytes")]
    TooLarge(usize),
    #[error("an event that is not UTF-8")]
    NotUtf8,
}

/// The parser's state between chunks.
#[derive(Debug)]
pub struct EventParser {
    max: usize,
    line: Vec<u8>,
    /// The last byte was a CR: a LF right after it ends nothing more.
    after_cr: bool,
    kind: Option<String>,
    data: Option<String>,
    /// Bytes of the event so far (its lines, not counting line ends).
    size: usize,
}

impl EventParser {
    /// `max`: the largest event, counted over its lines' bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            line: Vec::new(),
            after_cr: false,
            kind: None,
            data: None,
            size: 0,
        }
    }

    /// Feeds bytes; returns the events they complete, in order. After an
    /// error the stream is beyond repair: the caller ends it.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Event>, SseError> {
        let mut events = Vec::new();
        for &b in bytes {
            let was_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if was_cr => {}
                b'\n' | b'\r' => {
                    if let Some(event) = self.end_line()? {
                        events.push(event);
                    }
                }
                _ => {
                    self.size += 1;
                    if self.size > self.max {
                        return Err(SseError::TooLarge(self.max));
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(events)
    }

    /// A line ended: an empty one dispatches the event.
    fn end_line(&mut self) -> Result<Option<Event>, SseError> {
        if self.line.is_empty() {
            self.size = 0;
            let kind = self.kind.take();
            return Ok(self.data.take().map(|data| Event {
                kind: kind.unwrap_or_else(|| "message".into()),
                data,
            }));
        }
        let line = std::mem::take(&mut self.line);
        let line = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.kind = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            // `id` and `retry` serve reconnection, which this client does
            // not do (a lost stream restarts the server's session); unknown
            // fields are ignored, as the format says.
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, data: &str) -> Event {
        Event {
            kind: kind.into(),
            data: data.into(),
        }
    }

    #[test]
    fn events_across_chunks_and_line_ends() {
        let mut p = EventParser::new(1 << 10);
        let stream: &[&[u8]] = &[
            b": comment\r\nevent: endpoint\r",
            b"\ndata: /messages?session=1\r\n\r\n",
            b"data: {\"a\":\ndata:1}\n\nid: 7\nretry: 10\ndata",
            b"\n\nevent: x\n\n",
            b"data: last\r\r",
        ];
        let mut got = Vec::new();
        for chunk in stream {
            got.extend(p.feed(chunk).unwrap());
        }
        assert_eq!(
            got,
            [
                event("endpoint", "/messages?session=1"),
                event("message", "{\"a\":\n1}"),
                event("message", ""),
                event("message", "last"),
            ]
        );
    }

    #[test]
    fn an_event_is_bounded_even_without_a_line_end() {
        let mut p = EventParser::new(16);
        assert_eq!(p.feed(b"data: 0123456789\n\n").unwrap().len(), 1);
        let mut p = EventParser::new(16);
        assert_eq!(
            p.feed(b"data: 01234\ndata: 56789\n"),
            Err(SseError::TooLarge(16))
        );
        let mut p = EventParser::new(16);
        assert_eq!(p.feed(&[b'x'; 17]), Err(SseError::TooLarge(16)));
        let mut p = EventParser::new(16);
        assert_eq!(p.feed(b"data: \xff\n"), Err(SseError::NotUtf8));
    }
}
