//! Serves the external scaler API on its own listener until shutdown, within limits a client
//! cannot pass: connections capped in all and per address (`admission`), cut when silent
//! (`silent_timeout`), TLS handshakes bounded in time (`handshakes`), HTTP/2 streams capped per
//! connection, and HTTP/2 PINGs that find a peer that stopped answering.

use super::admission;
use super::certificates::Certificates;
use super::handshakes::handshaken;
use super::incoming::admitted;
use super::proto::external_scaler_server::ExternalScalerServer;
use super::service::ExternalScalerService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

/// Calls open at once on one connection. KEDA's operator opens one `StreamIsActive` per
/// ScaledObject on a shared connection, so this is also the most ScaledObjects one KEDA can
/// point at this Sentinel.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 512;
/// How often the port PINGs each client, and how long it waits for the answer before it closes
/// the connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts serving `service` on `listener` (over TLS with `certificates` when set); the task
/// ends after `shutdown` is cancelled and the open calls are done (streams end themselves on
/// shutdown).
pub fn spawn(
    listener: TcpListener,
    certificates: Option<Arc<Certificates>>,
    service: ExternalScalerService,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let router = Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(ExternalScalerServer::new(service));
    let connections = admitted(listener, admission::for_the_port());
    let shutdown = shutdown.cancelled_owned();
    tokio::spawn(async move {
        let served = match certificates {
            Some(certificates) => {
                router
                    .serve_with_incoming_shutdown(handshaken(connections, certificates), shutdown)
                    .await
            }
            None => {
                router
                    .serve_with_incoming_shutdown(connections, shutdown)
                    .await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "the external scaler port stopped");
        }
    })
}
