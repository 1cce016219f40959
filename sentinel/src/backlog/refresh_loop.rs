//! The one loop that reads the source: every distinct queue once per refresh interval,
//! whatever KEDA does. Its results go into the cache; requests never trigger a read.
//!
//! A queue whose read fails keeps its last value (the cache records the error next to it);
//! the worker view decides when that value is too old to serve. When every queue fails —
//! the upstream is down — the loop backs off (capped) instead of knocking at the interval.
//! Before publishing, pre-warm adds the slots scheduled runs are expected to need; after
//! each refresh, the history records what every worker would be told.

use crate::backlog::cache::{BacklogCache, Snapshot};
use crate::history::recorder::HistoryRecorder;
use crate::metrics::Metrics;
use crate::schedule::pre_warm::PreWarm;
use crate::sources::BacklogSource;
use airflow::backoff::Backoff;
use http_server::Readiness;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

pub struct RefreshLoop {
    pub source: Arc<dyn BacklogSource>,
    pub queues: Vec<String>,
    pub cache: Arc<BacklogCache>,
    pub metrics: Arc<Metrics>,
    /// Set once the first refresh has read at least one queue, and never cleared: a Sentinel
    /// whose data went stale stays in the Service so that KEDA hears an explicit 503 from it
    /// rather than a connection error.
    pub readiness: Readiness,
    pub interval: Duration,
    pub staleness_limit: Duration,
    /// How often the task instances Airflow holds back are counted (beside a refresh).
    pub held_tasks_interval: Duration,
    pub history: HistoryRecorder,
    /// Puts the pre-warm's expected slots into each snapshot; `None`: no pre-warm.
    pub pre_warm: Option<Arc<PreWarm>>,
}

/// The longest pause between attempts while the upstream is down: short enough that a
/// recovered upstream is noticed well within a staleness limit.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Which queues are known to be failing or stale, so each change is logged once.
#[derive(Default)]
struct Logged {
    failing: HashSet<String>,
    stale: HashSet<String>,
}

impl RefreshLoop {
    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(self.interval, MAX_BACKOFF.max(self.interval));
        let mut logged = Logged::default();
        let mut held_read_at: Option<tokio::time::Instant> = None;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            // Tokio's clock, so that a test with paused time drives the cadence.
            let started = tokio::time::Instant::now();
            let all_failed = tokio::select! {
                all_failed = self.refresh_once(&mut logged, &mut held_read_at) => all_failed,
                _ = shutdown.cancelled() => return,
            };
            let pause = if all_failed {
                backoff.next_delay().max(self.interval)
            } else {
                backoff.reset();
                self.interval
            };
            // The next refresh starts one interval after this one started, so a slow upstream
            // does not stretch the cadence (and a very slow one is simply read back to back).
            tokio::select! {
                _ = tokio::time::sleep_until(started + pause) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Reads every queue once and publishes the result; returns whether every queue failed.
    async fn refresh_once(
        &self,
        logged: &mut Logged,
        held_read_at: &mut Option<tokio::time::Instant>,
    ) -> bool {
        // Values are dated from when the read began: an age may be overstated by the read's
        // duration, never understated.
        let (at, at_wall) = (Instant::now(), SystemTime::now());
        // The tasks Airflow holds back are read beside the backlog, never into it, and only
        // every `held_tasks_interval`; in between the last count is kept.
        let read_held = held_read_at.is_none_or(|t| t.elapsed() >= self.held_tasks_interval);
        let held_read = async {
            if read_held {
                Some(self.source.held_tasks(&self.queues).await)
            } else {
                None
            }
        };
        let (outcomes, held) = tokio::join!(self.source.fetch(&self.queues), held_read);
        if read_held {
            *held_read_at = Some(tokio::time::Instant::now());
            self.metrics.held_task_reads.inc();
        }
        self.metrics.refreshes.inc();
        self.metrics
            .refresh_duration
            .observe(at.elapsed().as_secs_f64());
        let failing = &mut logged.failing;

        let mut next: Snapshot = (*self.cache.snapshot()).clone();
        let mut successes = 0usize;
        for (queue, outcome) in outcomes {
            match &outcome {
                Ok(_) => {
                    successes += 1;
                    if failing.remove(&queue) {
                        tracing::info!(%queue, "queue refresh recovered");
                    }
                }
                Err(error) => {
                    self.metrics
                        .queue_refresh_failures
                        .with_label_values(&[queue.as_str()])
                        .inc();
                    if failing.insert(queue.clone()) {
                        tracing::warn!(%queue, %error, "queue refresh failed; serving its last value until it is stale");
                    } else {
                        tracing::debug!(%queue, %error, "queue refresh failed again");
                    }
                }
            }
            next.record(&queue, outcome, at, at_wall);
        }
        match held {
            Some(Ok(held)) => next.set_held(Some(held)),
            Some(Err(error)) => {
                tracing::debug!(%error, "task instances held in scheduled unknown this refresh");
                next.set_held(None);
            }
            None => {}
        }
        let now = Instant::now();
        self.log_staleness(&next, now, &mut logged.stale);
        if let Some(pre_warm) = &self.pre_warm {
            pre_warm.annotate(&mut next, now, SystemTime::now());
        }
        self.cache.publish(next);
        // After publishing: KEDA's answers never wait for the history.
        self.history.record_refresh(&self.cache.snapshot(), now);

        if successes > 0 || self.queues.is_empty() {
            if !self.readiness.get() {
                tracing::info!(queues = self.queues.len(), "first refresh done; ready");
            }
            self.readiness.set(true);
            self.metrics.set_ready(true);
        }
        !self.queues.is_empty() && successes == 0
    }

    /// Logs once when a queue's value goes past the staleness limit and once when it is back.
    fn log_staleness(&self, snapshot: &Snapshot, now: Instant, stale: &mut HashSet<String>) {
        for (queue, entry) in snapshot.queues() {
            let is_stale = match entry.last {
                Some(r) => now.saturating_duration_since(r.at) > self.staleness_limit,
                None => false,
            };
            if is_stale && stale.insert(queue.clone()) {
                tracing::error!(
                    %queue,
                    limit = %humantime::format_duration(self.staleness_limit),
                    "queue value is stale: its workers answer 503 until a refresh succeeds"
                );
            } else if !is_stale && stale.remove(queue) {
                tracing::info!(%queue, "queue value is fresh again");
            }
        }
    }
}
