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
}

impl TaskResult {
    fn label(self) -> &'static str {
        match self {
            TaskResult::Success => "success",
            TaskResult::Failed => "failed",
            TaskResult::Killed => "killed",
            TaskResult::StartFailed => "start_failed",
        }
    }
}

impl Metrics {
    pub fn new(slots: Slots) -> Self {
        let registry = Registry::new();
        let queue_stats = IntGaugeVec::new(
            Opts::new(
                "astro_agent_client_queue_stats",
                "Task instances on the queue in the given state, for the whole queue (not this pod).",
            ),
            &["queue", "state"],
        )
        .unwrap();
        let queue_stats_refresh_failures = IntCounter::new(
            "astro_agent_queue_stats_refresh_failures_total",
            "Failed refreshes of the queue statistics from the Airflow REST API.",
        )
        .unwrap();
        let slot_gauges = SlotGauges {
            slots,
            total: IntGauge::new(
                "astro_agent_slots",
                "Task slots of this worker (syncSlots).",
            )
            .unwrap(),
            in_use: IntGauge::new(
                "astro_agent_slots_in_use",
                "Task slots held by running jobs.",
            )
            .unwrap(),
        };
        let tasks_started = IntCounter::new(
            "astro_agent_tasks_started_total",
            "Jobs received from Airflow and started.",
        )
        .unwrap();
        let task_launches = IntCounterVec::new(
            Opts::new(
                "astro_agent_task_launches_total",
                "Task processes started, by how: prefork (forked from the launcher) or fresh (a new interpreter).",
            ),
            &["mode"],
        )
        .unwrap();
        let tasks_finished = IntCounterVec::new(
            Opts::new(
                "astro_agent_tasks_finished_total",
                "Jobs finished, by result (success, failed, killed, start_failed).",
            ),
            &["result"],
        )
        .unwrap();
        let task_duration = HistogramVec::new(
            HistogramOpts::new(
                "astro_agent_task_duration_seconds",
                "Wall time of task processes, by result.",
            )
            .buckets(vec![
                1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0,
            ]),
            &["result"],
        )
        .unwrap();
        let edge_request_duration = HistogramVec::new(
            HistogramOpts::new(
                "astro_agent_edge_api_request_duration_seconds",
                "Duration of Edge Worker API calls, by call.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0,
            ]),
            &["call"],
        )
        .unwrap();
        let edge_request_failures = IntCounterVec::new(
            Opts::new(
                "astro_agent_edge_api_request_failures_total",
                "Failed Edge Worker API calls, by call.",
            ),
            &["call"],
        )
        .unwrap();
        let heartbeat_age = Gauge::new(
            "astro_agent_heartbeat_age_seconds",
            "Seconds since the last heartbeat Airflow accepted (-1 before the first).",
        )
        .unwrap();
        let draining = IntGauge::new(
            "astro_agent_draining",
            "1 while the agent drains: it fetches no new jobs and waits for running ones.",
        )
        .unwrap();
        let task_reports_pending = IntGauge::new(
            "astro_agent_task_reports_pending",
            "Final job states not yet delivered to Airflow.",
        )
        .unwrap();
        let build_info = IntGaugeVec::new(
            Opts::new("astro_agent_build_info", "Build of this agent; always 1."),
            &["version"],
        )
        .unwrap();
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);

        for collector in [
            Box::new(queue_stats.clone()) as Box<dyn Collector>,
            Box::new(queue_stats_refresh_failures.clone()),
            Box::new(slot_gauges),
            Box::new(tasks_started.clone()),
            Box::new(task_launches.clone()),
            Box::new(tasks_finished.clone()),
            Box::new(task_duration.clone()),
            Box::new(edge_request_duration.clone()),
            Box::new(edge_request_failures.clone()),
            Box::new(heartbeat_age.clone()),
            Box::new(draining.clone()),
            Box::new(task_reports_pending.clone()),
            Box::new(build_info),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
        heartbeat_age.set(-1.0);
        // Every result exists from the start at 0, so that an alert on the first kill (often
        // just before the pod exits) sees an increase rather than a brand-new series.
        for result in [
            TaskResult::Success,
            TaskResult::Failed,
            TaskResult::Killed,
            TaskResult::StartFailed,
        ] {
            tasks_finished.with_label_values(&[result.label()]);
        }
        for mode in ["prefork", "fresh"] {
            task_launches.with_label_values(&[mode]);
        }
        Metrics {
            registry,
            queue_stats,
            queue_stats_refresh_failures,
            tasks_started,
            task_launches,
            tasks_finished,
            task_duration,
            edge_request_duration,
            edge_request_failures,
            heartbeat_age,
            draining,
            task_reports_pending,
            last_heartbeat: Mutex::new(None),
        }
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
