//! Idle workers leave first: each worker pod's `controller.kubernetes.io/pod-deletion-cost`
//! is kept equal to the task slots it runs (Airflow's running task instances whose hostname is
//! the pod's name, Σ `pool_slots`). On a scale-in the ReplicaSet controller deletes pods with
//! the lowest cost first, so an idle pod goes before a busy one, which would otherwise drain
//! for up to its grace period while the idle one stays.
//!
//! Only Ready pods are annotated (the controller deletes unready ones first anyway), and only
//! when the value changes: at rest this writes nothing, and with no Ready worker pod it does not
//! ask Airflow either. A pod without the annotation counts
//! as 0, so an idle pod that never ran a task is not patched at all. The worker pods need no
//! API token for this; the Sentinel patches them (RBAC: `patch` on pods in the namespace).

use super::leader_lease::LeaderLease;
use super::workload_watch::WorkloadWatch;
use crate::sources::BacklogSource;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Api;
use prometheus::{IntCounterVec, IntGauge};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How long one patch may take. The client sets no read timeout (its watches are long-lived),
/// and a patch sent as the API server restarts can go unanswered for good: unbounded, it would
/// hold the loop, and with it every cost, from then on.
const PATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The slots each worker runs as two reads in a row confirm them: a rise counts at once, a fall
/// only once the next read sees it too. The REST source pages through the running task
/// instances while tasks start and end, so one read can miss a task whose neighbours in the
/// list finished; a busy worker then reads 0 for that one read, and a scale-in just then would
/// pick it. Two reads rarely miss the same task, and a worker whose tasks ended is marked idle
/// one refresh later.
fn confirmed(previous: &HashMap<String, u64>, now: &HashMap<String, u64>) -> HashMap<String, u64> {
    let mut slots = now.clone();
    for (host, before) in previous {
        let entry = slots.entry(host.clone()).or_default();
        *entry = (*entry).max(*before);
    }
    slots
}

pub struct DeletionCostLoop {
    pub source: Arc<dyn BacklogSource>,
    pub watch: Arc<WorkloadWatch>,
    pub pods: Api<Pod>,
    /// Each worker Deployment with the queues it serves.
    pub workers: Vec<(String, Vec<String>)>,
    pub interval: Duration,
    /// `astro_sentinel_pod_deletion_cost_patches_total{outcome}`.
    pub patches: IntCounterVec,
    /// Only the holder of this Lease patches (several replicas); None: this replica alone.
    pub leader: Option<LeaderLease>,
    /// `astro_sentinel_deletion_cost_leader`: 1 while this replica is the one that patches.
    pub leading: IntGauge,
}

impl DeletionCostLoop {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let queues: Vec<String> = {
            let mut all: Vec<String> = self.workers.iter().flat_map(|(_, q)| q.clone()).collect();
            all.sort();
            all.dedup();
            all
        };
        let mut failing = false;
        let mut previous: HashMap<String, u64> = HashMap::new();
        loop {
            let leading = match self.leader.as_mut() {
                Some(lease) => lease.lead().await,
                None => true,
            };
            self.leading.set(i64::from(leading));
            if !leading {
                // The leader's reads decide; ours would start from scratch when we take over.
                previous.clear();
            }
            // No Ready worker pod, nothing to annotate: a pool at rest costs Airflow nothing.
            if leading && self.any_running_pod() {
                match self.source.running_slots_by_host(&queues).await {
                    Ok(slots) => {
                        if failing {
                            tracing::info!("running task slots by worker readable again");
                            failing = false;
                        }
                        self.annotate(&confirmed(&previous, &slots)).await;
                        previous = slots;
                    }
                    Err(e) => {
                        // Costs stay as they were: a stale hint is better than marking busy pods idle.
                        if !failing {
                            tracing::warn!(error = %e, "cannot read running task slots by worker; pod deletion costs left as they are");
                            failing = true;
                        }
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        self.leading.set(0);
        if let Some(lease) = self.leader.as_mut() {
            lease.release().await;
        }
    }

    fn any_running_pod(&self) -> bool {
        self.workers
            .iter()
            .any(|(deployment, _)| !self.watch.running_pods(deployment).is_empty())
    }

    async fn annotate(&self, slots: &HashMap<String, u64>) {
        for (deployment, _) in &self.workers {
            for pod in self.watch.running_pods(deployment) {
                let Some(name) = pod.metadata.name.as_deref() else {
                    continue;
                };
                let wanted = slots.get(name).copied().unwrap_or(0);
                let current = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DELETION_COST))
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                if current == wanted as i64 {
                    continue;
                }
                let patch = serde_json::json!({
                    "metadata": {"annotations": {DELETION_COST: wanted.to_string()}}
                });
                let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
                let patched = self.pods.patch(name, &params, &patch);
                match tokio::time::timeout(PATCH_TIMEOUT, patched).await {
                    Ok(Ok(_)) => {
                        self.patches.with_label_values(&["ok"]).inc();
                        tracing::debug!(pod = name, cost = wanted, "pod deletion cost set");
                    }
                    Ok(Err(e)) => {
                        self.patches.with_label_values(&["error"]).inc();
                        tracing::warn!(pod = name, error = %e, "cannot set the pod deletion cost");
                    }
                    Err(_) => {
                        self.patches.with_label_values(&["error"]).inc();
                        tracing::warn!(pod = name, timeout = ?PATCH_TIMEOUT, "the API server did not answer a deletion-cost patch");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::confirmed;
    use std::collections::HashMap;

    fn slots(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|(h, n)| (h.to_string(), *n)).collect()
    }

    #[test]
    fn a_rise_counts_at_once_and_a_fall_once_two_reads_agree() {
        let first = slots(&[("w-a", 2)]);
        assert_eq!(confirmed(&HashMap::new(), &first), first);
        // w-a missed by one read (its neighbours in the listing ended): still busy.
        let missed = slots(&[("w-b", 1)]);
        assert_eq!(confirmed(&first, &missed), slots(&[("w-a", 2), ("w-b", 1)]));
        // Missing again: its task really ended.
        assert_eq!(
            confirmed(&missed, &slots(&[("w-b", 3)])),
            slots(&[("w-b", 3)])
        );
    }
}
