//! Before a connection takes one of the endpoints' slots: its request head
//! is read within `HEAD_TIMEOUT` and `MAX_HEAD` bytes, under a bound of
//! its own for connections not yet authenticated (`UNAUTHENTICATED`; past
//! it the oldest waiting one is closed, so a flood of slow or silent
//! connections cannot keep the operator's out), and only a head with the
//! right bearer token goes on to hyper, holding a slot, with the bytes
//! already read put back in front of the stream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::oneshot;

use super::{authorized, error};

/// Connections whose head is still being read, at most.
pub(super) const UNAUTHENTICATED: usize = 64;
/// How long a whole request head may take to arrive.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head.
pub(super) const MAX_HEAD: usize = 16 << 10;

/// The connections still being read: closing one (dropping its sender)
/// ends its reading at once.
#[derive(Default)]
pub(super) struct Waiting(VecDeque<oneshot::Sender<()>>);

impl Waiting {
    /// Room for one more (the oldest waiting closed when there is none),
    /// and its eviction signal.
    pub(super) fn admit(&mut self) -> oneshot::Receiver<()> {
        // Those past their head dropped their receivers.
        self.0.retain(|sender| !sender.is_closed());
        while self.0.len() >= UNAUTHENTICATED {
            self.0.pop_front();
        }
        let (sender, receiver) = oneshot::channel();
        self.0.push_back(sender);
        receiver
    }
}

/// What a connection's head came to.
pub(super) enum Head {
    /// The right token: these bytes (the head and whatever followed it)
    /// go first to hyper.
    Authorized(Vec<u8>),
    /// Answered here and closed.
    Refused,
}

/// Reads the head within the bounds; answers a refused one (401, 431;
/// nothing to a connection that timed out or was closed for a newer one),
/// all of it within the same bounds.
pub(super) async fn read_head<S>(
    stream: &mut S,
    token: &str,
    evicted: oneshot::Receiver<()>,
) -> Head
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        head = tokio::time::timeout(HEAD_TIMEOUT, judge_head(stream, token)) => {
            head.unwrap_or(Head::Refused)
        }
        _ = evicted => Head::Refused,
    }
}

async fn judge_head<S>(stream: &mut S, token: &str) -> Head
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::with_capacity(1024);
    let answer = match until_head_end(stream, &mut buf).await {
        Err(_) | Ok(Ending::Closed) => return Head::Refused,
        Ok(Ending::TooLong) => refusal(
            "431 Request Header Fields Too Large",
            "",
            error(
                431,
                "bad_request",
                format!("the request head is over {MAX_HEAD} bytes"),
            ),
        ),
        Ok(Ending::Ended(end)) => {
            if authorized(authorization(&buf[..end]), token) {
                return Head::Authorized(buf);
            }
            refusal(
                "401 Unauthorized",
                "WWW-Authenticate: Bearer\r\n",
                error(401, "unauthorized", "a bearer token is required"),
            )
        }
    };
    let _ = stream.write_all(&answer).await;
    let _ = stream.shutdown().await;
    // What the client still sends is read and dropped (a close with
    // unread bytes would reset the connection before it read the answer).
    let mut sink = [0u8; 2048];
    let mut left = MAX_HEAD * 4;
    while left > 0 {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Head::Refused
}

/// A whole response that closes the connection.
fn refusal(status: &str, headers: &str, answer: super::Answer) -> Vec<u8> {
    let body = serde_json::to_vec(&answer.body).unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

enum Ending {
    /// The head ends at this offset (after its blank line).
    Ended(usize),
    TooLong,
    Closed,
}

async fn until_head_end<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> std::io::Result<Ending> {
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Ending::Closed);
        }
        // Search from where a terminator could begin.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + at + 4;
            if end > MAX_HEAD {
                return Ok(Ending::TooLong);
            }
            return Ok(Ending::Ended(end));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Ending::TooLong);
        }
    }
}

/// The value of the head's `Authorization` field, when it has exactly
/// one (hyper checks the token again on what it parses).
fn authorization(head: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    for line in head.split(|b| *b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        if line[..colon].eq_ignore_ascii_case(b"authorization") {
            if found.is_some() {
                return None;
            }
            found = Some(line[colon + 1..].trim_ascii());
        }
    }
    found
}

/// A stream with bytes already read from it put back in front.
pub(super) struct Replay<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    pub(super) fn new(first: Vec<u8>, inner: S) -> Self {
        Self {
            first,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.first.len() {
            let n = out.remaining().min(this.first.len() - this.at);
            out.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, bytes)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_authorization_field_is_found() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer t \r\n\r\n";
        assert_eq!(authorization(head), Some(&b"Bearer t"[..]));
        let two = b"GET / HTTP/1.1\r\nAuthorization: Bearer t\r\nAuthorization: Bearer u\r\n\r\n";
        assert_eq!(authorization(two), None, "two fields: neither");
        let none = b"GET /?Authorization:Bearer%20t HTTP/1.1\r\n\r\n";
        assert_eq!(authorization(none), None, "the request line is no field");
    }

    #[test]
    fn the_oldest_waiting_connection_makes_room() {
        let mut waiting = Waiting::default();
        let mut receivers: Vec<_> = (0..UNAUTHENTICATED).map(|_| waiting.admit()).collect();
        assert!(
            receivers[0]
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        receivers.push(waiting.admit());
        assert_eq!(
            receivers[0].try_recv(),
            Err(oneshot::error::TryRecvError::Closed),
            "the oldest is closed"
        );
        assert_eq!(
            receivers[1].try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        // One past its head leaves room without closing anyone.
        drop(receivers.remove(5));
        receivers.push(waiting.admit());
        assert_eq!(
            receivers[1].try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
    }
}
