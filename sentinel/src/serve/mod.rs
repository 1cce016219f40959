//! What the Sentinel serves, all from the cache and the history, never from Airflow: on the one
//! HTTP port the [`api`] (`/v1/workers`, `/metrics`, `/healthz`, `/readyz`, by [`routes`]) with
//! `/v1` guarded by [`auth`], the agents' wake-up stream ([`queue_events`]), and the page at
//! `/ui/` ([`ui`]); on a port of its own, KEDA's
//! [`external_scaler`] gRPC API.

pub mod api;
pub mod auth;
pub mod external_scaler;
pub mod queue_events;
pub mod response;
pub mod routes;
pub mod ui;
