//! An agent's connection whose writes may not stall: an answer the agent
//! leaves unread for `limit` ends the connection, so a client that stops
//! reading cannot hold its slot, its reservation and the upstream's answer
//! for ever.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub(super) struct WriteStall<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write waits on the agent.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteStall<S> {
    pub(super) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            waiting: None,
        }
    }

    /// What the inner write said; a wait past the limit is an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.waiting = None;
            return poll;
        }
        let limit = self.limit;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the agent left its answer unread",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn an_answer_left_unread_ends_the_write_at_the_limit() {
        let (near, _far) = tokio::io::duplex(1024);
        let mut stalled = WriteStall::new(near, Duration::from_millis(200));
        let start = std::time::Instant::now();
        let error = stalled.write_all(&[0u8; 64 << 10]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
        // A reader that keeps up is never cut.
        let (near, mut far) = tokio::io::duplex(1024);
        let mut read = WriteStall::new(near, Duration::from_millis(200));
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut far, &mut sink)
                .await
                .unwrap();
            sink.len()
        });
        read.write_all(&[0u8; 64 << 10]).await.unwrap();
        drop(read);
        assert_eq!(drain.await.unwrap(), 64 << 10);
    }
}
