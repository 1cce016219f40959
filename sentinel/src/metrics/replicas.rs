//! Per-worker gauges of the pool itself: the replicas the autoscaler set, where the Deployment's
//! pods stand, and the replica bounds the Sentinel was configured with.
//!
//! They let alerts work from the Sentinel's series alone. The workers' own series vanish when a
//! pool sits at zero replicas, which is exactly when "work waits and nothing scales" must be
//! seen; the Sentinel's series do not (and need no kube-state-metrics).
//!
//! The replica and pod gauges come from the cluster watch and are absent while it is unknown
//! (no `kubernetes` section, watch not listed yet or failing, no such Deployment), never 0.
//! The bounds come from the configuration and are always present. `astro_sentinel_pool_paused`
//! (1 while KEDA's pause annotations or Airflow's maintenance stop the pool on purpose) lets the
//! alerts leave a paused pool alone; `astro_sentinel_worker_slot_drift_workers` counts the
//! pool's online workers that reported other task slots than its `syncSlots` (absent while no
//! worker reported its slots).
//!
//! Naming follows Prometheus practice: a `sum` over any label must mean something, so
//! `spec.replicas` and the bounds are metrics of their own rather than values of a `state` label
//! on the pod counts (compare kube-state-metrics' `kube_deployment_spec_replicas` and
//! `kube_horizontalpodautoscaler_spec_{min,max}_replicas`).

use crate::config::file::WorkerConfig;
use crate::metrics::gauge_vec;
use crate::pool::ClusterSource;
use prometheus::{IntGaugeVec, Registry};
use std::sync::{Arc, OnceLock};

pub struct ReplicaGauges {
    replicas: IntGaugeVec,
    pods: IntGaugeVec,
    min_replicas: IntGaugeVec,
    max_replicas: IntGaugeVec,
    paused: IntGaugeVec,
    slot_drift_workers: IntGaugeVec,
    /// Set once at start when the Sentinel has a view of the cluster.
    cluster: OnceLock<Arc<dyn ClusterSource>>,
}

impl ReplicaGauges {
    pub fn register(r: &Registry) -> Self {
        ReplicaGauges {
            replicas: gauge_vec(
                r,
                "astro_sentinel_worker_replicas",
                "Replicas the autoscaler set on the worker Deployment (spec.replicas; absent while the cluster view is unknown).",
                &["worker"],
            ),
            pods: gauge_vec(
                r,
                "astro_sentinel_worker_pods",
                "Pods of the worker Deployment by state: running (Ready), waiting (unschedulable: no node has room), terminating (draining); starting pods are in none (absent while the cluster view is unknown).",
                &["worker", "state"],
            ),
            min_replicas: gauge_vec(
                r,
                "astro_sentinel_worker_min_replicas",
                "The worker's minReplicas as configured in the Sentinel.",
                &["worker"],
            ),
            max_replicas: gauge_vec(
                r,
                "astro_sentinel_worker_max_replicas",
                "The worker's maxReplicas as configured in the Sentinel.",
                &["worker"],
            ),
            paused: gauge_vec(
                r,
                "astro_sentinel_pool_paused",
                "1 while scaling of the worker pool is paused on purpose (KEDA's paused or paused-replicas annotation on its ScaledObject; outside Kubernetes, every online worker in Airflow's maintenance), else 0 (absent while unknown).",
                &["worker"],
            ),
            slot_drift_workers: gauge_vec(
                r,
                "astro_sentinel_worker_slot_drift_workers",
                "Online workers of the pool that reported other task slots (Edge sysinfo concurrency) than the syncSlots the Sentinel scales by (absent while none reported).",
                &["worker"],
            ),
            cluster: OnceLock::new(),
        }
    }

    /// Reads replicas and pods from `cluster` from now on (the first call wins).
    pub fn follow(&self, cluster: Arc<dyn ClusterSource>) {
        let _ = self.cluster.set(cluster);
    }

    /// Refills every gauge for `workers`; the caller serialises scrapes.
    pub fn fill(&self, workers: &[WorkerConfig]) {
        self.replicas.reset();
        self.pods.reset();
        self.min_replicas.reset();
        self.max_replicas.reset();
        self.paused.reset();
        self.slot_drift_workers.reset();
        for worker in workers {
            let name = worker.name.as_str();
            self.min_replicas
                .with_label_values(&[name])
                .set(i64::from(worker.min_replicas));
            self.max_replicas
                .with_label_values(&[name])
                .set(i64::from(worker.max_replicas));
            let Some(cluster) = self.cluster.get() else {
                continue;
            };
            let view = cluster.view(name);
            if let Some(paused) = view.paused {
                self.paused
                    .with_label_values(&[name])
                    .set(i64::from(paused));
            }
            let slots = cluster.worker_slots(name);
            if !slots.is_empty() {
                let drifting = slots
                    .iter()
                    .filter(|w| w.slots != worker.sync_slots)
                    .count();
                self.slot_drift_workers
                    .with_label_values(&[name])
                    .set(drifting as i64);
            }
            if let Some(n) = view.workers {
                self.replicas.with_label_values(&[name]).set(i64::from(n));
            }
            for (state, count) in [
                ("running", view.running),
                ("waiting", view.waiting),
                ("terminating", view.terminating),
            ] {
                if let Some(n) = count {
                    self.pods
                        .with_label_values(&[name, state])
                        .set(i64::from(n));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{ClusterView, WorkerSlots};
    use prometheus::{Encoder, TextEncoder};

    struct OneDeployment(ClusterView);

    impl ClusterSource for OneDeployment {
        fn view(&self, deployment: &str) -> ClusterView {
            if deployment == "astro-worker-a" {
                self.0
            } else {
                ClusterView::default()
            }
        }
    }

    /// A paused pool whose workers reported 4 and 8 slots.
    struct PausedWithSlots;

    impl ClusterSource for PausedWithSlots {
        fn view(&self, deployment: &str) -> ClusterView {
            ClusterView {
                paused: (deployment == "astro-worker-a").then_some(true),
                ..ClusterView::default()
            }
        }

        fn worker_slots(&self, pool: &str) -> Vec<WorkerSlots> {
            if pool != "astro-worker-a" {
                return Vec::new();
            }
            [("a-1", 4), ("a-2", 8)]
                .into_iter()
                .map(|(w, slots)| WorkerSlots {
                    worker: w.into(),
                    slots,
                })
                .collect()
        }
    }

    #[test]
    fn paused_and_slot_drift_only_where_known() {
        let r = Registry::new();
        let gauges = ReplicaGauges::register(&r);
        gauges.follow(Arc::new(PausedWithSlots));
        gauges.fill(&[
            worker("astro-worker-a", 0, 5),
            worker("astro-worker-b", 0, 5),
        ]);
        let text = exposition(&r);
        assert!(
            text.contains("astro_sentinel_pool_paused{worker=\"astro-worker-a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("astro_sentinel_worker_slot_drift_workers{worker=\"astro-worker-a\"} 1"),
            "one of two reported other than 4 slots: {text}"
        );
        assert!(!text.contains("astro_sentinel_pool_paused{worker=\"astro-worker-b\"}"));
        assert!(
            !text.contains("astro_sentinel_worker_slot_drift_workers{worker=\"astro-worker-b\"}")
        );
    }

    fn worker(name: &str, min: u32, max: u32) -> WorkerConfig {
        WorkerConfig {
            name: name.into(),
            queues: vec!["q".into()],
            sync_slots: 4,
            min_replicas: min,
            max_replicas: max,
            overprovision_slots: 0,
        }
    }

    fn exposition(r: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn bounds_always_and_replicas_only_where_the_cluster_knows() {
        let r = Registry::new();
        let gauges = ReplicaGauges::register(&r);
        let workers = [
            worker("astro-worker-a", 0, 10),
            worker("astro-worker-b", 1, 3),
        ];

        gauges.fill(&workers);
        let text = exposition(&r);
        assert!(text.contains("astro_sentinel_worker_max_replicas{worker=\"astro-worker-a\"} 10"));
        assert!(text.contains("astro_sentinel_worker_min_replicas{worker=\"astro-worker-b\"} 1"));
        assert!(!text.contains("astro_sentinel_worker_replicas{"), "{text}");
        assert!(!text.contains("astro_sentinel_worker_pods{"), "{text}");

        // At zero the series are there with 0: what the at-zero alerts need.
        gauges.follow(Arc::new(OneDeployment(ClusterView {
            workers: Some(0),
            running: Some(0),
            waiting: Some(0),
            terminating: Some(0),
            paused: None,
        })));
        gauges.fill(&workers);
        let text = exposition(&r);
        assert!(text.contains("astro_sentinel_worker_replicas{worker=\"astro-worker-a\"} 0"));
        assert!(
            text.contains(
                "astro_sentinel_worker_pods{state=\"waiting\",worker=\"astro-worker-a\"} 0"
            ),
            "{text}"
        );
        // A Deployment the cluster does not know: unknown, not 0.
        assert!(!text.contains("astro_sentinel_worker_replicas{worker=\"astro-worker-b\"}"));
        assert!(!text.contains("state=\"running\",worker=\"astro-worker-b\""));
    }

    #[test]
    fn pod_counts_by_state() {
        let r = Registry::new();
        let gauges = ReplicaGauges::register(&r);
        gauges.follow(Arc::new(OneDeployment(ClusterView {
            workers: Some(5),
            running: Some(2),
            waiting: Some(3),
            terminating: Some(1),
            paused: None,
        })));
        gauges.fill(&[worker("astro-worker-a", 0, 5)]);
        let text = exposition(&r);
        for line in [
            "astro_sentinel_worker_replicas{worker=\"astro-worker-a\"} 5",
            "astro_sentinel_worker_pods{state=\"running\",worker=\"astro-worker-a\"} 2",
            "astro_sentinel_worker_pods{state=\"waiting\",worker=\"astro-worker-a\"} 3",
            "astro_sentinel_worker_pods{state=\"terminating\",worker=\"astro-worker-a\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
