//! The Sentinel's own Prometheus metrics, all named `astro_sentinel_*`.
//!
//! Counters and the refresh histogram are updated where things happen. The per-worker and
//! per-queue gauges are computed from the cache when `/metrics` is scraped, so ages are exact
//! and a worker without fresh data has no backlog series at all (absent, not 0).

pub mod queue_events;
pub mod replicas;

use crate::backlog::cache::Snapshot;
use crate::backlog::worker_view::{worker_answer, WorkerAnswer};
use crate::config::file::WorkerConfig;
use crate::pool::cold_start::histograms::ColdStartHistograms;
use crate::pool::ClusterSource;
use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use queue_events::QueueEventMetrics;
use replicas::ReplicaGauges;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Metrics {
    registry: Registry,
    pub refreshes: IntCounter,
    pub held_task_reads: IntCounter,
    pub refresh_duration: Histogram,
    pub queue_refresh_failures: IntCounterVec,
    pub upstream_requests: IntCounterVec,
    pub http_requests: IntCounterVec,
    pub token_reviews: IntCounterVec,
    pub token_reviews_skipped: IntCounterVec,
    pub access_reviews: IntCounterVec,
    pub pod_deletion_cost_patches: IntCounterVec,
    /// Objects the workload watch holds, by kind (Deployment, Pod, ScaledObject).
    pub watch_cached_objects: IntGaugeVec,
    /// 1 while this replica holds the deletion-cost Lease (or needs none) and sets the costs.
    pub deletion_cost_leader: IntGauge,
    pub cold_starts: ColdStartHistograms,
    pub queue_events: QueueEventMetrics,
    /// The configuration in force: 1 at start, one more for each change of the file applied.
    pub config_generation: IntGauge,
    /// Changes of the configuration file refused (invalid): the running configuration stays.
    pub config_reload_failures: IntCounter,
    /// Changes of the external scaler port's certificate files, by outcome (applied, refused).
    pub external_scaler_certificate_reloads: IntCounterVec,
    /// 1 while this replica holds the history file's lock and writes the file.
    pub history_file_owner: IntGauge,
    ready: IntGauge,
    queue_task_instances: IntGaugeVec,
    queue_task_slots: IntGaugeVec,
    queue_data_age: GaugeVec,
    worker_backlog: IntGaugeVec,
    worker_expected_slots: IntGaugeVec,
    worker_oldest_queued_age: GaugeVec,
    worker_desired_replicas: IntGaugeVec,
    worker_held_tasks: IntGaugeVec,
    worker_available: IntGaugeVec,
    worker_replicas: ReplicaGauges,
    /// Serialises scrapes: the gauges are reset and refilled for each one.
    scrape: Mutex<()>,
}

/// Registers `metric`, as its constructor returned it, and hands it back. A bad name or a
/// name taken twice is a programming error that the first test run shows.
fn register<M: Collector + Clone + 'static>(r: &Registry, metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("valid metric");
    r.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(r, IntCounterVec::new(Opts::new(name, help), labels))
}

pub(crate) fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(r, IntGaugeVec::new(Opts::new(name, help), labels))
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        gauge_vec(
            &r,
            "astro_sentinel_build_info",
            "Always 1; the label carries the Sentinel's version.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        Metrics {
            config_generation: register(
                &r,
                IntGauge::new(
                    "astro_sentinel_config_generation",
                    "The configuration in force: 1 at start, one more for each change of the file applied without a restart.",
                ),
            ),
            config_reload_failures: register(
                &r,
                IntCounter::new(
                    "astro_sentinel_config_reload_failures_total",
                    "Changes of the configuration file refused as invalid (the running configuration is kept; the log names the field).",
                ),
            ),
            external_scaler_certificate_reloads: counter_vec(
                &r,
                "astro_sentinel_external_scaler_certificate_reloads_total",
                "Changes of the external scaler port's certificate, key or client CA files: applied (new connections get them) or refused as unusable (the port keeps serving the previous ones; the log says why).",
                &["outcome"],
            ),
            history_file_owner: register(
                &r,
                IntGauge::new(
                    "astro_sentinel_history_file_owner",
                    "1 while this replica holds the history file's lock and writes it; 0 while another replica does (this one keeps its history in memory).",
                ),
            ),
            ready: register(
                &r,
                IntGauge::new(
                    "astro_sentinel_ready",
                    "1 once the first refresh has read at least one queue.",
                ),
            ),
            refreshes: register(
                &r,
                IntCounter::new(
                    "astro_sentinel_refreshes_total",
                    "Refresh cycles run (each reads every configured queue once).",
                ),
            ),
            held_task_reads: register(
                &r,
                IntCounter::new(
                    "astro_sentinel_held_task_reads_total",
                    "Counts of the task instances Airflow holds in `scheduled` (every `heldTasksInterval`, beside a refresh): one request per queue (airflow-api) or one query (postgres).",
                ),
            ),
            refresh_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "astro_sentinel_refresh_duration_seconds",
                        "Time one refresh cycle took to read all queues from the source.",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0,
                    ]),
                ),
            ),
            queue_refresh_failures: counter_vec(
                &r,
                "astro_sentinel_queue_refresh_failures_total",
                "Refreshes of the queue that failed (its last value is kept until it is stale).",
                &["queue"],
            ),
            upstream_requests: counter_vec(
                &r,
                "astro_sentinel_upstream_requests_total",
                "Requests (airflow-api) or queries (postgres) sent to the backlog source.",
                &["source"],
            ),
            http_requests: counter_vec(
                &r,
                "astro_sentinel_http_requests_total",
                "HTTP requests answered, by handler and status code.",
                &["handler", "code"],
            ),
            token_reviews: counter_vec(
                &r,
                "astro_sentinel_token_reviews_total",
                "TokenReview calls to the Kubernetes API server, by outcome (cache hits excluded).",
                &["outcome"],
            ),
            token_reviews_skipped: counter_vec(
                &r,
                "astro_sentinel_token_reviews_skipped_total",
                "Bearer tokens answered without a TokenReview, by reason: not_jwt (401), rate_limited (503 with Retry-After).",
                &["reason"],
            ),
            access_reviews: counter_vec(
                &r,
                "astro_sentinel_access_reviews_total",
                "Reviews of people's Kubernetes tokens (auth.kubernetesUsers): kind token (TokenReview: who) or access (LocalSubjectAccessReview: may get the worker's Deployment), by outcome answered or error (cache hits excluded).",
                &["kind", "outcome"],
            ),
            pod_deletion_cost_patches: counter_vec(
                &r,
                "astro_sentinel_pod_deletion_cost_patches_total",
                "Worker pods whose pod-deletion-cost annotation was set to their running task slots, by outcome.",
                &["outcome"],
            ),
            deletion_cost_leader: register(
                &r,
                IntGauge::new(
                    "astro_sentinel_deletion_cost_leader",
                    "1 while this replica sets the worker pods' deletion costs (it holds kubernetes.deletionCostLease, or none is configured).",
                ),
            ),
            watch_cached_objects: gauge_vec(
                &r,
                "astro_sentinel_watch_cached_objects",
                "Objects the watches of the workers' namespace hold in memory, by kind (only those with kubernetes.workerLabels when set).",
                &["kind"],
            ),
            queue_task_instances: gauge_vec(
                &r,
                "astro_sentinel_queue_task_instances",
                "Task instances on the queue in the state, as last read.",
                &["queue", "state"],
            ),
            queue_task_slots: gauge_vec(
                &r,
                "astro_sentinel_queue_task_slots",
                "Task slots (sum of pool_slots) of the task instances on the queue in the state, as last read.",
                &["queue", "state"],
            ),
            queue_data_age: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "astro_sentinel_queue_data_age_seconds",
                        "Age of the last value read for the queue (absent until the first read).",
                    ),
                    &["queue"],
                ),
            ),
            worker_backlog: gauge_vec(
                &r,
                "astro_sentinel_worker_backlog",
                "Task slots (sum of pool_slots) of the queued plus running task instances over the worker's queues, the value KEDA reads (absent when not fresh).",
                &["worker"],
            ),
            worker_expected_slots: gauge_vec(
                &r,
                "astro_sentinel_worker_expected_slots",
                "Task slots that scheduled runs about to start are expected to need (pre-warm), apart from the backlog; 0 outside a pre-warm window (absent when not fresh).",
                &["worker"],
            ),
            worker_oldest_queued_age: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "astro_sentinel_worker_oldest_queued_age_seconds",
                        "How long the longest-waiting queued task instance over the worker's queues has been queued; 0 when none is (absent when not fresh).",
                    ),
                    &["worker"],
                ),
            ),
            worker_desired_replicas: gauge_vec(
                &r,
                "astro_sentinel_worker_desired_replicas",
                "ceil(backlog / syncSlots) held between minReplicas and maxReplicas (absent when not fresh).",
                &["worker"],
            ),
            worker_held_tasks: gauge_vec(
                &r,
                "astro_sentinel_worker_held_tasks",
                "Task instances on the worker's queues that Airflow holds in scheduled ([core] parallelism, pools, max_active_tasks): waiting, never in the backlog (absent when not fresh or not counted).",
                &["worker"],
            ),
            worker_available: gauge_vec(
                &r,
                "astro_sentinel_worker_available",
                "1 when the worker's backlog is fresh and served, 0 when it answers 503.",
                &["worker"],
            ),
            worker_replicas: ReplicaGauges::register(&r),
            cold_starts: ColdStartHistograms::register(&r),
            queue_events: QueueEventMetrics::register(&r),
            registry: r,
            scrape: Mutex::new(()),
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Exports each worker's replicas and pods as `cluster` sees them from now on.
    pub fn follow_cluster(&self, cluster: Arc<dyn ClusterSource>) {
        self.worker_replicas.follow(cluster);
    }

    /// The text exposition of every metric, with gauges computed from `snapshot` at `now`.
    pub fn render(
        &self,
        snapshot: &Snapshot,
        workers: &[WorkerConfig],
        now: Instant,
        staleness_limit: Duration,
    ) -> String {
        let _guard = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.queue_task_instances.reset();
        self.queue_task_slots.reset();
        self.queue_data_age.reset();
        for (queue, entry) in snapshot.queues() {
            if let Some(reading) = entry.last {
                let q = queue.as_str();
                let b = reading.backlog;
                for (state, tasks, slots) in [
                    ("queued", b.queued_tasks, b.queued_slots),
                    ("running", b.running_tasks, b.running_slots),
                ] {
                    self.queue_task_instances
                        .with_label_values(&[q, state])
                        .set(saturating_i64(tasks));
                    self.queue_task_slots
                        .with_label_values(&[q, state])
                        .set(saturating_i64(slots));
                }
                self.queue_data_age
                    .with_label_values(&[q])
                    .set(now.saturating_duration_since(reading.at).as_secs_f64());
            }
        }
        self.worker_backlog.reset();
        self.worker_expected_slots.reset();
        self.worker_oldest_queued_age.reset();
        self.worker_desired_replicas.reset();
        self.worker_held_tasks.reset();
        for worker in workers {
            let name = worker.name.as_str();
            match worker_answer(worker, snapshot, now, staleness_limit) {
                WorkerAnswer::Ready(b) => {
                    self.worker_available.with_label_values(&[name]).set(1);
                    self.worker_backlog
                        .with_label_values(&[name])
                        .set(saturating_i64(b.backlog));
                    self.worker_expected_slots
                        .with_label_values(&[name])
                        .set(saturating_i64(b.expected_slots));
                    self.worker_oldest_queued_age
                        .with_label_values(&[name])
                        .set(b.oldest_queued_age_seconds);
                    self.worker_desired_replicas
                        .with_label_values(&[name])
                        .set(i64::from(b.desired_replicas));
                    if let Some(held) = b.held_tasks {
                        self.worker_held_tasks
                            .with_label_values(&[name])
                            .set(saturating_i64(held));
                    }
                }
                WorkerAnswer::Unavailable(_) => {
                    self.worker_available.with_label_values(&[name]).set(0);
                }
            }
        }
        self.worker_replicas.fill(workers);
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
