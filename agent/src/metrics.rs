//! Every Prometheus metric the agent exports, registered once in one registry.

use crate::slots::Slots;
use airflow::edge_client::CallObserver;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Metrics {
    registry: Registry,
    /// Task instances per queue and state for the whole queue (the autoscaling signal).
    pub queue_stats: IntGaugeVec,
    pub queue_stats_refresh_failures: IntCounter,
    pub tasks_started: IntCounter,
    pub task_launches: IntCounterVec,
    pub tasks_finished: IntCounterVec,
    pub task_duration: HistogramVec,
    pub edge_request_duration: HistogramVec,
    pub edge_request_failures: IntCounterVec,
    pub heartbeat_age: Gauge,
    pub draining: IntGauge,
    pub task_reports_pending: IntGauge,
    pub settings_overridden: IntGaugeVec,
    pub sentinel_subscribed: IntGauge,
    pub wakeups: IntCounter,
    last_heartbeat: Mutex<Option<Instant>>,
}

/// How a task ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskResult {
    Success,
    Failed,
    /// Terminated by the agent (second signal or drain deadline).
    Killed,
    /// The task process could not be started.
    StartFailed,
    /// The job's workload is not one this worker runs (see [`crate::workload`]).
    Unsupported,
}

impl TaskResult {
    fn label(self) -> &'static str {
        match self {
            TaskResult::Success => "success",
            TaskResult::Failed => "failed",
            TaskResult::Killed => "killed",
            TaskResult::StartFailed => "start_failed",
            TaskResult::Unsupported => "unsupported",
        }
    }
}

/// Registers `metric`, as its constructor returned it, and hands it back. A bad name or a
/// name taken twice is a programming error that the first test run shows.
fn register<M: Collector + Clone + 'static>(r: &Registry, metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("valid metric");
    r.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

impl Metrics {
    pub fn new(slots: Slots) -> Self {
        let r = Registry::new();
        r.register(Box::new(SlotGauges {
            slots,
            total: IntGauge::new(
                "astro_agent_slots",
                "Task slots of this worker (syncSlots).",
            )
            .expect("valid metric"),
            in_use: IntGauge::new(
                "astro_agent_slots_in_use",
                "Task slots held by running jobs.",
            )
            .expect("valid metric"),
        }))
        .expect("unique metric");
        let metrics = Metrics {
            queue_stats: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "astro_agent_client_queue_stats",
                        "Task instances on the queue in the given state, for the whole queue (not this pod).",
                    ),
                    &["queue", "state"],
                ),
            ),
            queue_stats_refresh_failures: register(
                &r,
                IntCounter::new(
                    "astro_agent_queue_stats_refresh_failures_total",
                    "Failed refreshes of the queue statistics from the Airflow REST API.",
                ),
            ),
            tasks_started: register(
                &r,
                IntCounter::new(
                    "astro_agent_tasks_started_total",
                    "Jobs received from Airflow and started.",
                ),
            ),
            task_launches: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "astro_agent_task_launches_total",
                        "Task processes started, by how: prefork (forked from the launcher) or fresh (a new interpreter).",
                    ),
                    &["mode"],
                ),
            ),
            tasks_finished: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "astro_agent_tasks_finished_total",
                        "Jobs finished, by result (success, failed, killed, start_failed, unsupported).",
                    ),
                    &["result"],
                ),
            ),
            task_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "astro_agent_task_duration_seconds",
                        "Wall time of task processes, by result.",
                    )
                    .buckets(vec![
                        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0,
                    ]),
                    &["result"],
                ),
            ),
            edge_request_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "astro_agent_edge_api_request_duration_seconds",
                        "Duration of Edge Worker API calls, by call.",
                    )
                    .buckets(vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0,
                    ]),
                    &["call"],
                ),
            ),
            edge_request_failures: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "astro_agent_edge_api_request_failures_total",
                        "Failed Edge Worker API calls, by call.",
                    ),
                    &["call"],
                ),
            ),
            heartbeat_age: register(
                &r,
                Gauge::new(
                    "astro_agent_heartbeat_age_seconds",
                    "Seconds since the last heartbeat Airflow accepted (-1 before the first).",
                ),
            ),
            sentinel_subscribed: register(
                &r,
                IntGauge::new(
                    "astro_agent_sentinel_subscribed",
                    "1 while the agent holds a subscription to the Sentinel's queue events (then an idle agent fetches at the subscribed interval unless woken), 0 while it polls Airflow at the idle interval.",
                ),
            ),
            wakeups: register(
                &r,
                IntCounter::new(
                    "astro_agent_wakeups_total",
                    "Times the Sentinel woke the fetch loop because work was queued on the agent's queues.",
                ),
            ),
            draining: register(
                &r,
                IntGauge::new(
                    "astro_agent_draining",
                    "1 while the agent drains: it fetches no new jobs and waits for running ones.",
                ),
            ),
            task_reports_pending: register(
                &r,
                IntGauge::new(
                    "astro_agent_task_reports_pending",
                    "Final job states not yet delivered to Airflow.",
                ),
            ),
            settings_overridden: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "astro_agent_settings_overridden",
                        "1 while Airflow has set this worker's `concurrency` or `queues` to something else than its configuration (the autoscaler still assumes the configured value).",
                    ),
                    &["setting"],
                ),
            ),
            last_heartbeat: Mutex::new(None),
            registry: r,
        };
        register(
            &metrics.registry,
            IntGaugeVec::new(
                Opts::new("astro_agent_build_info", "Build of this agent; always 1."),
                &["version"],
            ),
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        metrics.heartbeat_age.set(-1.0);
        // Every result exists from the start at 0, so that an alert on the first kill (often
        // just before the pod exits) sees an increase rather than a brand-new series.
        for result in [
            TaskResult::Success,
            TaskResult::Failed,
            TaskResult::Killed,
            TaskResult::StartFailed,
            TaskResult::Unsupported,
        ] {
            metrics.tasks_finished.with_label_values(&[result.label()]);
        }
        for mode in ["prefork", "fresh"] {
            metrics.task_launches.with_label_values(&[mode]);
        }
        metrics
    }

    pub fn heartbeat_accepted(&self) {
        *self.last_heartbeat.lock().unwrap() = Some(Instant::now());
    }

    pub fn task_finished(&self, result: TaskResult, duration: Duration) {
        self.tasks_finished
            .with_label_values(&[result.label()])
            .inc();
        self.task_duration
            .with_label_values(&[result.label()])
            .observe(duration.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        if let Some(at) = *self.last_heartbeat.lock().unwrap() {
            self.heartbeat_age.set(at.elapsed().as_secs_f64());
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding to a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// Feeds Edge API call outcomes into the request metrics.
pub struct EdgeCallMetrics(pub std::sync::Arc<Metrics>);

impl CallObserver for EdgeCallMetrics {
    fn observe(&self, call: &'static str, elapsed: Duration, ok: bool) {
        self.0
            .edge_request_duration
            .with_label_values(&[call])
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.0
                .edge_request_failures
                .with_label_values(&[call])
                .inc();
        }
    }
}

/// The slot gauges, read from the slots at each scrape rather than kept up to date beside them.
struct SlotGauges {
    slots: Slots,
    total: IntGauge,
    in_use: IntGauge,
}

impl Collector for SlotGauges {
    fn desc(&self) -> Vec<&Desc> {
        [&self.total, &self.in_use]
            .into_iter()
            .flat_map(|gauge| gauge.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.total.set(self.slots.total() as i64);
        self.in_use.set(self.slots.in_use() as i64);
        [&self.total, &self.in_use]
            .into_iter()
            .flat_map(|gauge| gauge.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_the_contract_metric_and_build_info() {
        let m = Metrics::new(Slots::new(3));
        m.queue_stats
            .with_label_values(&["default", "queued"])
            .set(7);
        let text = m.render();
        assert!(
            text.contains("astro_agent_client_queue_stats{queue=\"default\",state=\"queued\"} 7")
        );
        assert!(text.contains("astro_agent_build_info{version="));
        assert!(text.contains("astro_agent_heartbeat_age_seconds -1"));
        assert!(text.contains("astro_agent_tasks_finished_total{result=\"killed\"} 0"));
    }

    #[tokio::test]
    async fn slot_gauges_are_read_at_scrape_time() {
        let slots = Slots::new(3);
        let m = Metrics::new(slots.clone());
        let reservation = slots.reserve().await;
        let lease = slots.reserve().await.into_lease(2).await;
        let text = m.render();
        assert!(text.contains("\nastro_agent_slots 3\n"), "{text}");
        assert!(
            text.contains("\nastro_agent_slots_in_use 2\n"),
            "the fetch loop's reservation is not a slot in use: {text}"
        );
        drop((reservation, lease));
        slots.resize(5);
        let text = m.render();
        assert!(text.contains("\nastro_agent_slots 5\n"), "{text}");
        assert!(text.contains("\nastro_agent_slots_in_use 0\n"), "{text}");
    }

    #[test]
    fn heartbeat_age_counts_from_the_last_accepted_heartbeat() {
        let m = Metrics::new(Slots::new(3));
        m.heartbeat_accepted();
        let text = m.render();
        let line = text
            .lines()
            .find(|l| l.starts_with("astro_agent_heartbeat_age_seconds "))
            .unwrap();
        let age: f64 = line.split(' ').nth(1).unwrap().parse().unwrap();
        assert!((0.0..1.0).contains(&age), "{line}");
    }
}
