//! The HTTP/1.1 server behind both binaries' endpoints (the agent's `/metrics` and probes, the
//! Sentinel's KEDA API): the same limits for both, so that no client can make either spin or
//! hold every connection.
//!
//! * At most [`Limits::max_connections`] connections, each holding an owned semaphore permit
//!   that its task releases by ending; one more is closed at once. The cap keeps file
//!   descriptors for the binary's real work. One peer address holds at most
//!   [`Limits::max_connections_per_peer`] of them, and the last [`Limits::reserved_connections`]
//!   free slots go only to addresses holding none, so that one client (or a few) flooding the
//!   port cannot starve another, such as the kubelet's liveness probe; where the server asks,
//!   its own host counts as one peer, whatever loopback address it comes from (see
//!   `admission`).
//! * `accept` errors (out of file descriptors, most often) back off from
//!   [`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`]: the pending connection stays in the
//!   backlog, so retrying at once would spin.
//! * Request headers must arrive within [`Limits::header_read_timeout`] and fit in
//!   [`Limits::max_header_bytes`]; a response write that makes no progress for
//!   [`Limits::write_stall_timeout`] ends its connection (a client that pipelines requests and
//!   never reads the answers), and a connection older than [`Limits::max_connection_age`] is
//!   closed after its current request (keep-alive clients reconnect).
//! * On shutdown the listener closes, idle connections close, and in-flight requests get
//!   [`Limits::drain_timeout`].
//!
//! Repeated warnings (failed accepts, refused connections) are logged at most once per
//! [`WARN_EVERY`], with the number left out: a flood must not become a flood of log lines.

pub mod admission;
mod log_throttle;
mod readiness;
mod write_deadline;

use admission::Admission;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use log_throttle::LogThrottle;
pub use readiness::Readiness;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use write_deadline::WriteDeadline;

pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// What one server allows its clients.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    /// How many of them one peer address may hold.
    pub max_connections_per_peer: usize,
    /// Free slots that only an address holding no connection may take.
    pub reserved_connections: usize,
    /// Every connection from this host (any loopback address, or the address it arrives at) is
    /// one peer: for a server whose network namespace holds code it does not trust.
    pub one_peer_for_this_host: bool,
    pub header_read_timeout: Duration,
    /// hyper's read buffer, which bounds the request line plus headers (8 KiB is its minimum).
    pub max_header_bytes: usize,
    pub write_stall_timeout: Duration,
    pub max_connection_age: Duration,
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            // No per-peer share and no reserve unless a server asks: many legitimate clients
            // can share one address (a proxy, a node's SNAT), and only the server knows its own.
            max_connections_per_peer: 1024,
            reserved_connections: 0,
            one_peer_for_this_host: false,
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            write_stall_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(300),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// Serves `listener` with `handler` until `shutdown` completes, then drains. The listener is
/// bound by the caller, so that a bad address fails at start-up rather than in the background.
///
/// A response body may be a long-lived stream (the Sentinel's queue events): it holds its
/// connection until it ends, so such a stream must end by itself on shutdown.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    let admission = Admission::new(
        limits.max_connections,
        limits.max_connections_per_peer,
        limits.reserved_connections,
    );
    let closing = CancellationToken::new();
    let mut accept_failures = LogThrottle::new(WARN_EVERY);
    let mut refusals = LogThrottle::new(WARN_EVERY);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    pair
                }
                Err(e) => {
                    if let Some(left_out) = accept_failures.ready() {
                        tracing::warn!(error = %e, left_out, retry_in = ?backoff, "accept failed");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let ticket = match admission.admit(peer_of(&stream, peer, &limits)) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                if let Some(left_out) = refusals.ready() {
                    tracing::warn!(
                        %peer,
                        limit = limits.max_connections,
                        per_peer = limits.max_connections_per_peer,
                        reserved = limits.reserved_connections,
                        left_out,
                        "{}; closing new connections",
                        refusal.reason()
                    );
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_stall_timeout));
        let handler = handler.clone();
        let service = service_fn(move |req| {
            let response = handler(req);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let connection = builder.serve_connection(io, service);
        let closing = closing.clone();
        let max_age = limits.max_connection_age;
        tokio::spawn(async move {
            let _ticket = ticket;
            tokio::pin!(connection);
            tokio::select! {
                ended = connection.as_mut() => return log_end(peer, ended),
                _ = closing.cancelled() => {}
                _ = tokio::time::sleep(max_age) => {}
            }
            connection.as_mut().graceful_shutdown();
            log_end(peer, connection.await);
        });
    }

    drop(listener);
    closing.cancel();
    if tokio::time::timeout(limits.drain_timeout, admission.all_ended())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still busy after the drain timeout");
    }
}

/// Whose share a connection from `peer` takes (see [`Limits::one_peer_for_this_host`]).
fn peer_of(stream: &tokio::net::TcpStream, peer: SocketAddr, limits: &Limits) -> IpAddr {
    match stream.local_addr() {
        Ok(local) if limits.one_peer_for_this_host => {
            admission::one_peer_for_this_host(peer.ip(), local.ip())
        }
        _ => peer.ip(),
    }
}

fn log_end(peer: SocketAddr, ended: hyper::Result<()>) {
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
