//! The TLS side of the external scaler port: each admitted connection's handshake, with the
//! certificates in force when it arrived (`super::certificates`), bounded in time. Handshakes
//! run side by side and finished ones are served as they finish, so a client that starts one
//! and stalls holds up nobody else; a failed one is dropped with its connection.

use super::admission::MAX_CONNECTIONS;
use super::certificates::Certificates;
use futures_util::stream::{Stream, StreamExt};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its TLS handshake: one that starts it and stops (or drips
/// a byte now and then) would otherwise hold its connection for as long as it likes.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections of `admitted` once their handshake is done.
pub fn handshaken<IO>(
    admitted: impl Stream<Item = io::Result<IO>>,
    certificates: Arc<Certificates>,
) -> impl Stream<Item = io::Result<TlsStream<IO>>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    admitted
        .map(move |connection| {
            let acceptor = TlsAcceptor::from(certificates.current());
            async move {
                let handshake = acceptor.accept(connection?);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(done) => done,
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TLS handshake not done in time",
                    )),
                }
            }
        })
        // Every connection holds an admission ticket: at most this many can be handshaking.
        .buffer_unordered(MAX_CONNECTIONS)
        .filter_map(|handshake| async move {
            match handshake {
                Ok(stream) => Some(Ok(stream)),
                Err(e) => {
                    tracing::debug!(error = %e, "a TLS handshake on the external scaler port failed");
                    None
                }
            }
        })
}
