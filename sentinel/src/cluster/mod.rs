//! The cluster side of each worker: what the autoscaler set, which pods run, wait for room or
//! terminate — read from the Kubernetes API with watches — and the pod-deletion cost that makes
//! a scale-in remove idle workers first.
//!
//! Everything here is optional: without a `kubernetes` section in the configuration (the demo,
//! a Sentinel outside the cluster) the Sentinel serves the backlog alone and the cluster lines
//! are unknown, never zero.

mod client;
mod deletion_cost;
mod pod_state;
mod workload_watch;

pub use client::{kube_client, review_client};
pub use deletion_cost::DeletionCostLoop;
pub use workload_watch::WorkloadWatch;
