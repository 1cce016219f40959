//! Serves the external scaler API on its own listener until shutdown, within limits a client
//! cannot pass: connections capped in all and per address (`admission`), cut when silent
//! (`silent_timeout`), a TLS handshake bounded in time ([`tls::with_handshake_timeout`]),
//! HTTP/2 streams capped per connection, and HTTP/2 PINGs that find a peer that stopped
//! answering.
//!
//! [`tls::with_handshake_timeout`]: super::tls::with_handshake_timeout

use super::admission;
use super::incoming::admitted;
use super::proto::external_scaler_server::ExternalScalerServer;
use super::service::ExternalScalerService;
use super::tls::with_handshake_timeout;
use crate::config::ConfigError;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Server, ServerTlsConfig};

/// Calls open at once on one connection. KEDA's operator opens one `StreamIsActive` per
/// ScaledObject on a shared connection, so this is also the most ScaledObjects one KEDA can
/// point at this Sentinel.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 512;
/// How often the port PINGs each client, and how long it waits for the answer before it closes
/// the connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts serving `service` on `listener` (with `tls` when set); the task ends after
/// `shutdown` is cancelled and the open calls are done (streams end themselves on shutdown).
pub fn spawn(
    listener: TcpListener,
    tls: Option<ServerTlsConfig>,
    service: ExternalScalerService,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, ConfigError> {
    let mut builder = Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(tls) = tls {
        builder = builder
            .tls_config(with_handshake_timeout(tls))
            .map_err(|e| {
                ConfigError::new(format!(
                "--external-scaler-tls-cert: the certificate, key or client CA is unusable: {e}"
            ))
            })?;
    }
    let router = builder.add_service(ExternalScalerServer::new(service));
    Ok(tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(
                admitted(listener, admission::for_the_port()),
                shutdown.cancelled_owned(),
            )
            .await
        {
            tracing::error!(error = %e, "the external scaler port stopped");
        }
    }))
}
