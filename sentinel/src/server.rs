//! The HTTP/1.1 server: accepts connections, bounds them, and hands requests to [`api`].
//!
//! Limits that keep a misbehaving client from hurting KEDA's answers: at most
//! [`MAX_CONNECTIONS`] connections (an owned semaphore permit per connection, released when
//! its task ends), request headers read within [`HEADER_READ_TIMEOUT`] and held in at most
//! [`MAX_HEADER_BYTES`], and no request bodies (see `api`). On shutdown the listener closes,
//! idle keep-alive connections are told to close, and in-flight requests get
//! [`DRAIN_TIMEOUT`] to finish.
//!
//! [`api`]: crate::api

use crate::api::{handle, AppState};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub const MAX_CONNECTIONS: usize = 1024;
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's read buffer, which bounds the request line plus headers (8 KiB is its minimum).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `listener` until `shutdown` completes, then drains.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = MAX_CONNECTIONS, "connection limit reached; closing a new connection");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service = service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(handle(&state, req).await) }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }

    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still busy after the drain timeout");
    }
}
