//! KEDA's external scaler gRPC API (`externalscaler.proto`), for the `external-push` trigger:
//! KEDA keeps a `StreamIsActive` stream open, and the Sentinel pushes `true` at the refresh that
//! first sees work for the worker, instead of waiting for KEDA's next poll.
//!
//! * [`service`]: the four RPCs, answered from the same cache and the same [`worker_answer`]
//!   as `GET /v1/workers/{name}`; an unavailable worker is a gRPC `UNAVAILABLE` error, never
//!   `false` / 0 (the 503 rule of `/v1`).
//! * [`tls`]: the port's flags and its TLS. KEDA's external scalers send no credentials
//!   except a TLS client certificate (`tlsClientCert` / `tlsClientKey` of a
//!   TriggerAuthentication), so unless `auth.disabled` is true the port requires mutual TLS:
//!   a client certificate signed by `--external-scaler-client-ca`. [`certificates`] reads
//!   those files again whenever they change; `handshakes` runs each connection's TLS handshake.
//! * [`server`]: serves it on its own port until shutdown, within limits: connections capped
//!   in all and per address (`admission`) and cut when silent (`silent_timeout`), accepted
//!   by `incoming`.
//!
//! [`worker_answer`]: crate::backlog::worker_view::worker_answer

pub mod admission;
pub mod certificates;
pub mod handshakes;
mod incoming;
pub mod server;
pub mod service;
mod silent_timeout;
pub mod tls;

/// The code generated from `proto/externalscaler.proto` (see `build.rs`).
pub mod proto {
    tonic::include_proto!("externalscaler");
}
