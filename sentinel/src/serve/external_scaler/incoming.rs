//! The connections the external scaler port serves: accepted from its listener with TCP
//! keep-alive on, admitted by the port's [`Admission`] (a connection over the caps is closed
//! at once, so that the listen queue keeps moving for everyone else), and each wrapped in a
//! [`SilentTimeout`].

use super::silent_timeout::SilentTimeout;
use futures_util::stream::{self, Stream};
use http_server::admission::Admission;
use socket2::{SockRef, TcpKeepalive};
use std::io;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Idle time before the kernel probes a connection whose peer vanished without a word (a
/// node that died), so that its descriptor is freed even when no HTTP/2 PING is due.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of descriptors, say) instead of spinning on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The admitted connections of `listener`, forever.
pub fn admitted(
    listener: TcpListener,
    admission: Admission,
) -> impl Stream<Item = io::Result<SilentTimeout<TcpStream>>> {
    stream::unfold((listener, admission), |(listener, admission)| async move {
        let connection = accept_admitted(&listener, &admission).await;
        Some((Ok(connection), (listener, admission)))
    })
}

async fn accept_admitted(
    listener: &TcpListener,
    admission: &Admission,
) -> SilentTimeout<TcpStream> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "the external scaler port cannot accept a connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        match admission.admit(peer.ip()) {
            Ok(slot) => {
                keep_alive(&stream);
                return SilentTimeout::new(stream, slot);
            }
            Err(refusal) => {
                let why = refusal.reason();
                tracing::debug!(%peer, why, "closed a connection to the external scaler port");
            }
        }
    }
}

fn keep_alive(stream: &TcpStream) {
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot turn on TCP keep-alive");
    }
}
