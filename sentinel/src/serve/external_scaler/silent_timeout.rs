//! A connection of the external scaler port that is closed when its client goes silent: no
//! bytes within [`FIRST_BYTES_TIMEOUT`] of being accepted (a TLS handshake or HTTP/2 preface
//! never started), or none for [`SILENT_TIMEOUT`] since the last ones. A live client is never
//! silent that long: the port sends HTTP/2 PINGs every
//! [`KEEPALIVE_INTERVAL`](super::server::KEEPALIVE_INTERVAL) and a client answers them even
//! when it has no call open. The connection also holds its `Ticket` of the port's
//! admission (`super::admission`), freed when it closes.

use http_server::admission::Ticket;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Instant, Sleep};
use tonic::transport::server::Connected;

/// How long a new connection may stay silent.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an established connection may stay silent (well over the keep-alive interval).
pub const SILENT_TIMEOUT: Duration = Duration::from_secs(90);

pub struct SilentTimeout<IO> {
    io: IO,
    deadline: Pin<Box<Sleep>>,
    silent_timeout: Duration,
    _slot: Ticket,
}

impl<IO> SilentTimeout<IO> {
    pub fn new(io: IO, slot: Ticket) -> Self {
        Self::with_timeouts(io, slot, FIRST_BYTES_TIMEOUT, SILENT_TIMEOUT)
    }

    fn with_timeouts(io: IO, slot: Ticket, first_bytes: Duration, silent: Duration) -> Self {
        SilentTimeout {
            io,
            deadline: Box::pin(sleep(first_bytes)),
            silent_timeout: silent,
            _slot: slot,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SilentTimeout<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + me.silent_timeout;
                    me.deadline.as_mut().reset(next);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                ready!(me.deadline.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing for too long",
                )))
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SilentTimeout<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for SilentTimeout<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_server::admission::Admission;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const FIRST: Duration = Duration::from_secs(10);
    const SILENT: Duration = Duration::from_secs(90);

    fn connection(
        admission: &Admission,
    ) -> (
        SilentTimeout<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
    ) {
        let (server, client) = tokio::io::duplex(64);
        let slot = admission.admit([10, 0, 0, 1].into()).unwrap();
        (
            SilentTimeout::with_timeouts(server, slot, FIRST, SILENT),
            client,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_speaks_is_cut_after_the_first_bytes_timeout() {
        let admission = Admission::new(1, 1, 0);
        let (mut server, _client) = connection(&admission);
        let started = Instant::now();
        let e = server.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), FIRST);
        assert!(admission.admit([10, 0, 0, 2].into()).is_err(), "still held");
        drop(server);
        assert!(
            admission.admit([10, 0, 0, 2].into()).is_ok(),
            "freed on close"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn each_read_renews_the_deadline_and_silence_after_it_cuts() {
        let admission = Admission::new(1, 1, 0);
        let (mut server, mut client) = connection(&admission);
        let mut buf = [0; 8];
        client.write_all(b"hello").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 5);
        for _ in 0..5 {
            tokio::time::advance(SILENT - Duration::from_secs(1)).await;
            client.write_all(b"ping").await.unwrap();
            assert_eq!(server.read(&mut buf).await.unwrap(), 4);
        }
        let last = Instant::now();
        let e = server.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(last.elapsed(), SILENT);
    }
}
