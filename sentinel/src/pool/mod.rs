//! The pool view: what each worker pool has right now — the replicas the autoscaler set, the
//! workers running, waiting for room or on their way out — and the pod-deletion cost that makes
//! a scale-in remove idle workers first.
//!
//! Inside Kubernetes the [`WorkloadWatch`] follows the workers' Deployments and pods with
//! watches; outside it (no `kubernetes` section: the demo, a Sentinel outside the cluster) the
//! [`EdgeWorkerCensus`] counts Airflow's list of Edge workers (inside it too, for the task slots
//! each worker reported: the [`KubernetesPoolView`]). Both answer as a
//! [`ClusterSource`], which the history and the replica gauges read; a line neither can tell is
//! unknown, never zero.
//!
//! Nothing here reads the history: the history reads this.

mod cluster_view;
pub mod cold_start;
mod deletion_cost;
mod edge_worker_census;
mod kubernetes_pool_view;
mod leader_lease;
mod pod_state;
mod scaled_object;
mod trimmed_objects;
mod watch_backoff;
mod workload_watch;

pub use cluster_view::{ClusterSource, ClusterView, NoClusterSource, WorkerSlots};
pub use cold_start::ColdStarts;
pub use deletion_cost::DeletionCostLoop;
pub use edge_worker_census::EdgeWorkerCensus;
pub use kubernetes_pool_view::KubernetesPoolView;
pub use leader_lease::LeaderLease;
pub use workload_watch::WorkloadWatch;
