//! Serves the external scaler API on its own listener until shutdown.

use super::proto::external_scaler_server::ExternalScalerServer;
use super::service::ExternalScalerService;
use crate::config::ConfigError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Server, ServerTlsConfig};

/// Starts serving `service` on `listener` (with `tls` when set); the task ends after
/// `shutdown` turns true and the open calls are done (streams end themselves on shutdown).
pub fn spawn(
    listener: TcpListener,
    tls: Option<ServerTlsConfig>,
    service: ExternalScalerService,
    mut shutdown: watch::Receiver<bool>,
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
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop)
            .await
        {
            tracing::error!(error = %e, "the external scaler port stopped");
        }
    }))
}
