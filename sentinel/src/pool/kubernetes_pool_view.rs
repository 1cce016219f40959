//! Inside Kubernetes the pool view is the watch of the workers' Deployments, pods and
//! ScaledObjects; the task slots each worker runs with are only in Airflow's list of Edge
//! workers, so that part comes from the census.

use super::cluster_view::{ClusterSource, ClusterView, WorkerSlots};
use super::edge_worker_census::EdgeWorkerCensus;
use super::workload_watch::WorkloadWatch;
use std::sync::Arc;

pub struct KubernetesPoolView {
    pub watch: Arc<WorkloadWatch>,
    pub census: Arc<EdgeWorkerCensus>,
}

impl ClusterSource for KubernetesPoolView {
    fn view(&self, deployment: &str) -> ClusterView {
        self.watch.view(deployment)
    }

    fn worker_slots(&self, pool: &str) -> Vec<WorkerSlots> {
        self.census.worker_slots(pool)
    }
}
