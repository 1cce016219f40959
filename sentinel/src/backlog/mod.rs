//! The backlog each worker is told: the [`refresh_loop`] reads every distinct queue from the
//! [source](crate::sources) once per interval into the [`cache`], and the [`worker_view`] turns
//! the cache into each worker's answer — the one `/v1`, the external scaler, the metrics and the
//! history all give. Requests never reach the source.

pub mod cache;
pub mod refresh_loop;
pub mod worker_view;
