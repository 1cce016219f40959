//! HTTP clients for Apache Airflow 3, shared by `astro-agent` and `astro-sentinel`.
//!
//! * [`edge_client`] speaks the Edge Worker API (`/edge_worker/v1/…`) that the edge3
//!   provider serves: register, heartbeat, fetch jobs, report job states, push logs.
//! * [`rest_api`] counts task instances per queue and state through the public REST API v2,
//!   and lists the Edge workers ([`edge_worker_list`]) and the executor callbacks they run
//!   ([`edge_callback_jobs`]); [`dag_schedule`] reads, through the
//!   same client, when each DAG runs next and what its earlier runs took.
//! * [`backoff`] is the one retry policy both use.
//! * [`secret_file`] takes credentials from files (or values), the same way in both binaries.
//! * [`trusted_ca`] adds a private CA (`--ca-file`) to both clients.

pub mod backoff;
pub mod dag_schedule;
pub mod edge_callback_jobs;
pub mod edge_client;
pub mod edge_token;
pub mod edge_types;
pub mod edge_worker_list;
pub mod error;
pub mod rest_api;
pub mod secret_file;
pub mod trusted_ca;

pub use error::ApiError;
