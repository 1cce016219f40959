//! Every cold start timed: for each scale-up from zero and each new worker Pod, the phases
//! backlog seen → replicas raised → Pod scheduled → container started → agent registered in
//! Airflow → first task running, from the Sentinel's refresh, the Kubernetes watch and Airflow.
//!
//! The [`tracker`] is fed by the refresh (backlog), the [`WorkloadWatch`](super::WorkloadWatch)
//! ([`pod_facts`] from each Pod) and [`airflow_phases`] (or the Edge worker census outside
//! Kubernetes); finished starts reach the [`histograms`] in `/metrics` and, through the
//! history, the [`answer`] of `GET /v1/workers/{name}/history` and the page.
//! [`ColdStarts::typical_cold_start`] gives a pool's measured lead from zero to its first task.

pub mod airflow_phases;
pub mod answer;
pub mod histograms;
pub mod phase;
pub mod pod_facts;
pub mod record;
pub mod saved;
pub mod tracker;
pub mod watch_events;

pub use tracker::ColdStarts;
