//! `/metrics` for cold starts: one histogram of each phase's duration and one of the whole,
//! both labelled by worker pool, observed once per start as it ends.

use super::record::{ColdStart, Outcome};
use prometheus::{HistogramOpts, HistogramVec, Registry};

/// From a warm node (a second or two) to an image pull on a fresh node (minutes).
const BUCKETS: [f64; 15] = [
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

#[derive(Clone)]
pub struct ColdStartHistograms {
    /// `astro_sentinel_cold_start_phase_seconds{worker, phase}`.
    phases: HistogramVec,
    /// `astro_sentinel_cold_start_seconds{worker, start}`.
    totals: HistogramVec,
}

impl ColdStartHistograms {
    pub fn register(registry: &Registry) -> ColdStartHistograms {
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
                labels,
            )
            .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        ColdStartHistograms {
            phases: histogram(
                "astro_sentinel_cold_start_phase_seconds",
                "Cold starts of the worker pool's workers: time from the previous phase to this one (replicas_raised, pod_scheduled, container_started, agent_registered, first_task_running; outside Kubernetes agent_registered follows backlog_seen). Observed when a start ends; a phase not seen is not observed.",
                &["worker", "phase"],
            ),
            totals: histogram(
                "astro_sentinel_cold_start_seconds",
                "Cold starts of the worker pool's workers that ran a task: from the Sentinel first seeing the backlog to the worker's first task running, by start (from_zero or additional).",
                &["worker", "start"],
            ),
        }
    }

    /// Observes every phase `start` went through and, when it ran its task, its total.
    pub fn observe(&self, pool: &str, start: &ColdStart) {
        for segment in start.segments() {
            self.phases
                .with_label_values(&[pool, segment.to.label()])
                .observe(segment.duration.as_secs_f64());
        }
        if let (Outcome::Complete, Some(total)) = (start.outcome, start.total()) {
            self.totals
                .with_label_values(&[pool, start.kind.label()])
                .observe(total.as_secs_f64());
        }
    }
}
