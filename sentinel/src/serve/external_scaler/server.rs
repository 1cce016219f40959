//! Serves the external scaler API on its own listener until shutdown.

use super::proto::external_scaler_server::ExternalScalerServer;
use super::service::ExternalScalerService;
use crate::config::ConfigError;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Server, ServerTlsConfig};

/// Starts serving `service` on `listener` (with `tls` when set); the task ends after
/// `shutdown` is cancelled and the open calls are done (streams end themselves on shutdown).
pub fn spawn(
    listener: TcpListener,
    tls: Option<ServerTlsConfig>,
    service: ExternalScalerService,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, ConfigError> {
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(|e| {
            ConfigError::new(format!(
                "--external-scaler-tls-cert: the certificate, key or client CA is unusable: {e}"
            ))
        })?;
    }
    let router = builder.add_service(ExternalScalerServer::new(service));
    Ok(tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                shutdown.cancelled_owned(),
            )
            .await
        {
            tracing::error!(error = %e, "the external scaler port stopped");
        }
    }))
}
