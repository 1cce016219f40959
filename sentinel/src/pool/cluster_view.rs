//! What the Kubernetes side knows about a worker Deployment: how many workers the autoscaler
//! set, how many run, how many wait for room on the cluster and how many are on their way out.
//!
//! The history asks a [`ClusterSource`] once per refresh for every worker: the watch of the
//! Deployments and pods ([`WorkloadWatch`]) inside Kubernetes, Airflow's list of Edge workers
//! ([`EdgeWorkerCensus`]) outside. A line a source cannot tell is `None`, and the history
//! reports it as missing instead of drawing it at 0; [`NoClusterSource`] knows no line.
//!
//! [`WorkloadWatch`]: super::WorkloadWatch
//! [`EdgeWorkerCensus`]: super::EdgeWorkerCensus

use serde::{Deserialize, Serialize};

/// One Deployment's pods as the cluster sees them; `None` means "no source for this line".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The replica count the autoscaler set (the Deployment's `spec.replicas`).
    pub workers: Option<u32>,
    /// Workers actually running (ready).
    pub running: Option<u32>,
    /// Workers waiting for room on the cluster (unschedulable, `Pending`).
    pub waiting: Option<u32>,
    /// Workers being removed (draining their tasks).
    pub terminating: Option<u32>,
    /// Scaling stopped on purpose: KEDA's pause annotations on the ScaledObject, or (outside
    /// Kubernetes) every online worker of the pool in Airflow's maintenance.
    pub paused: Option<bool>,
}

/// One online worker of a pool and the task slots it reported running with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSlots {
    pub worker: String,
    pub slots: u32,
}

pub trait ClusterSource: Send + Sync + 'static {
    /// What the cluster knows about the Deployment named `deployment` right now.
    fn view(&self, deployment: &str) -> ClusterView {
        let _ = deployment;
        ClusterView::default()
    }

    /// The pool's online workers with the slots each reported, in name order; empty when
    /// the source does not know (Kubernetes does not: Airflow's list of Edge workers does).
    fn worker_slots(&self, pool: &str) -> Vec<WorkerSlots> {
        let _ = pool;
        Vec::new()
    }
}

/// No Kubernetes data: every line unknown.
pub struct NoClusterSource;

impl ClusterSource for NoClusterSource {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_watcher_every_line_is_unknown() {
        let view = NoClusterSource.view("astro-worker-default");
        assert_eq!(view, ClusterView::default());
        assert_eq!(
            (
                view.workers,
                view.running,
                view.waiting,
                view.terminating,
                view.paused
            ),
            (None, None, None, None, None)
        );
    }
}
