//! astro-sentinel: serves each Airflow worker Deployment's backlog to KEDA's `metrics-api`
//! scaler, so that KEDA can wake a Deployment that sits at zero replicas.
//!
//! Data flows one way: a backlog source ([`sources`]) is read by the refresh loop once per
//! interval for every distinct queue; results land in the cache ([`backlog`]); requests
//! ([`serve::api`], routed by [`serve::routes`], guarded by [`serve::auth`]) compute each
//! worker's answer from the cache and never reach Airflow. A worker whose data is missing or
//! older than the staleness limit answers 503 — never a made-up 0. After each refresh the
//! [`history`] records what every worker would be told and what the [`pool`] view says of its
//! workers, for `GET /v1/workers/{name}/history`; the page at `/ui/` ([`serve::ui`]) reads that
//! same API. On a port of its own, the [`serve::external_scaler`] serves KEDA's external scaler
//! gRPC API from the same cache, and pushes activity to KEDA as each refresh lands. The
//! [`schedule`] reads when each DAG runs next, so that a pool is up when its work arrives.
//!
//! [`config`] reads what the Sentinel runs with, [`app`] starts the parts, [`metrics`] counts
//! them, [`kubernetes_client`] reaches the Kubernetes API (the pool view, TokenReview), and
//! [`shutdown`] stops them on a signal. [`secrets`] is the `ensure-secrets` command the chart
//! runs before an install or upgrade: KEDA's token and the external scaler's certificates.

pub mod app;
pub mod backlog;
pub mod config;
pub mod history;
pub mod kubernetes_client;
pub mod metrics;
pub mod pool;
pub mod schedule;
pub mod secrets;
pub mod serve;
pub mod shutdown;
pub mod sources;
