//! Turns each refresh into history: for every configured worker, what KEDA would be told
//! right now (the same computation as `GET /v1/workers/{name}`) plus what the cluster says.
//!
//! A worker whose answer is unavailable (not loaded, stale) gets a gap, never a 0. Each sample
//! stands for the time since the previous refresh, capped at the staleness limit: a longer
//! silence is time KEDA would have been refused an answer, so it is not counted as observed.
//! The first refresh stands for one refresh interval.
//!
//! The backlog's fall since the worker's previous sample is the drain the history charts; it
//! is counted only between two samples no gap apart (after a gap the previous backlog says
//! nothing of the time between).

use super::decisions::DecisionSource;
use super::sample::{drifting, Sample};
use super::store::History;
use crate::backlog::cache::Snapshot;
use crate::backlog::worker_view::{worker_answer, WorkerAnswer};
use crate::config::file::WorkerConfig;
use crate::pool::ClusterSource;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct HistoryRecorder {
    history: Arc<History>,
    workers: Vec<WorkerConfig>,
    cluster: Arc<dyn ClusterSource>,
    backlog_source: DecisionSource,
    refresh_interval: Duration,
    staleness_limit: Duration,
    /// Wall-clock milliseconds of the previous refresh, whatever its outcome.
    previous_refresh_ms: Mutex<Option<u64>>,
    /// Each worker's backlog at the previous refresh, for the workers that had one.
    previous_backlogs: Mutex<HashMap<String, u32>>,
}

/// How the recorder reads its inputs.
pub struct RecorderInputs {
    pub workers: Vec<WorkerConfig>,
    pub cluster: Arc<dyn ClusterSource>,
    /// `BacklogSource::kind()` of the configured source.
    pub backlog_source_kind: &'static str,
    pub refresh_interval: Duration,
    pub staleness_limit: Duration,
}

impl HistoryRecorder {
    pub fn new(history: Arc<History>, inputs: RecorderInputs) -> HistoryRecorder {
        HistoryRecorder {
            history,
            workers: inputs.workers,
            cluster: inputs.cluster,
            backlog_source: DecisionSource::for_backlog(inputs.backlog_source_kind),
            refresh_interval: inputs.refresh_interval,
            staleness_limit: inputs.staleness_limit,
            previous_refresh_ms: Mutex::new(None),
            previous_backlogs: Mutex::default(),
        }
    }

    /// Records every worker as of `snapshot`; `now` is the monotonic time staleness is
    /// judged by (as for requests).
    pub fn record_refresh(&self, snapshot: &Snapshot, now: Instant) {
        let at_ms = self.history.now_ms();
        let (weight_ms, after_gap) = {
            let mut previous = self
                .previous_refresh_ms
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let span = match previous.replace(at_ms) {
                // A wall clock that stepped back gives 0, not a huge span.
                Some(before) => Duration::from_millis(at_ms.saturating_sub(before)),
                None => self.refresh_interval,
            };
            let after_gap = span > self.staleness_limit;
            let span = span.min(self.staleness_limit);
            (
                u32::try_from(span.as_millis()).unwrap_or(u32::MAX),
                after_gap,
            )
        };
        let mut previous_backlogs = self
            .previous_backlogs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if after_gap {
            previous_backlogs.clear();
        }
        let cold_starts = self.history.cold_starts();
        let samples = self.workers.iter().filter_map(|worker| {
            match worker_answer(worker, snapshot, now, self.staleness_limit) {
                WorkerAnswer::Ready(answer) => {
                    let view = self.cluster.view(&worker.name);
                    if let Some(cold_starts) = cold_starts {
                        // The workers it has: the replicas set, or those online in Airflow.
                        let present = view.workers.or(view.running);
                        cold_starts.backlog_read(
                            &worker.name,
                            at_ms,
                            answer.backlog,
                            answer.desired_replicas,
                            present,
                        );
                    }
                    let slots = self.cluster.worker_slots(&worker.name);
                    if let Some(drifting) = drifting(&slots, worker.sync_slots) {
                        self.history
                            .note_drifting_worker(&worker.name, &drifting.worker);
                    }
                    let sample = Sample::new(&answer, view).with_worker_slots(&slots);
                    // Looked up first: a name is allocated once per worker, not per refresh.
                    let previous = match previous_backlogs.get_mut(&worker.name) {
                        Some(before) => Some(std::mem::replace(before, sample.backlog)),
                        None => {
                            previous_backlogs.insert(worker.name.clone(), sample.backlog);
                            None
                        }
                    };
                    Some((worker.name.as_str(), sample.after(previous)))
                }
                WorkerAnswer::Unavailable(_) => {
                    previous_backlogs.remove(&worker.name);
                    None
                }
            }
        });
        self.history
            .record(at_ms, samples, weight_ms, self.backlog_source);
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::WallClock;
    use super::super::range::HistoryRange;
    use super::super::store::HistoryData;
    use super::*;
    use crate::pool::{ClusterView, NoClusterSource, WorkerSlots};
    use crate::sources::QueueBacklog;
    use std::time::{SystemTime, UNIX_EPOCH};

    /// A wall clock the test sets.
    struct ManualClock(Mutex<SystemTime>);

    impl ManualClock {
        fn at_ms(ms: u64) -> Arc<ManualClock> {
            Arc::new(ManualClock(Mutex::new(
                UNIX_EPOCH + Duration::from_millis(ms),
            )))
        }
        fn advance(&self, d: Duration) {
            *self.0.lock().unwrap() += d;
        }
    }

    impl WallClock for ManualClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }

    struct FixedCluster(ClusterView);

    impl ClusterSource for FixedCluster {
        fn view(&self, deployment: &str) -> ClusterView {
            if deployment == "w" {
                self.0
            } else {
                ClusterView::default()
            }
        }
    }

    /// Airflow's side outside Kubernetes: paused or not, and one worker with 2 slots.
    struct EdgeWorkers {
        paused: bool,
    }

    impl ClusterSource for EdgeWorkers {
        fn view(&self, _: &str) -> ClusterView {
            ClusterView {
                running: Some(1),
                terminating: Some(0),
                paused: Some(self.paused),
                ..ClusterView::default()
            }
        }

        fn worker_slots(&self, _: &str) -> Vec<WorkerSlots> {
            vec![WorkerSlots {
                worker: "edge-a".into(),
                slots: 2,
            }]
        }
    }

    #[test]
    fn paused_time_and_a_drifting_worker_become_findings() {
        let (clock, history, recorder) = setup(Arc::new(EdgeWorkers { paused: true }));
        let now = Instant::now();
        // Busy enough for the maximum of 5: paused, it is not "at maximum".
        for _ in 0..6 {
            recorder.record_refresh(&snapshot(Some(tasks(30, 10)), now), now);
            clock.advance(Duration::from_secs(2));
        }
        let a = history.answer(&worker(), HistoryRange::FifteenMinutes);
        let texts: Vec<&str> = a.findings.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(
            texts,
            vec![
                "Paused for 12 s.",
                "Worker edge-a ran with 2 slots while the autoscaler assumed 4 for 12 s."
            ]
        );
        assert_eq!(a.tiles.paused_seconds, Some(12));
        assert_eq!(a.tiles.at_maximum_seconds, Some(0));
        assert!(a.series.iter().all(|p| p.paused));
    }

    fn worker() -> WorkerConfig {
        WorkerConfig {
            name: "w".into(),
            queues: vec!["q".into()],
            sync_slots: 4,
            min_replicas: 1,
            max_replicas: 5,
            overprovision_slots: 0,
        }
    }

    const T0_MS: u64 = 1_800_000_000_000;

    fn setup(cluster: Arc<dyn ClusterSource>) -> (Arc<ManualClock>, Arc<History>, HistoryRecorder) {
        let clock = ManualClock::at_ms(T0_MS);
        let history = Arc::new(History::new(
            clock.clone(),
            "test".into(),
            HistoryData::default(),
        ));
        let recorder = HistoryRecorder::new(
            history.clone(),
            RecorderInputs {
                workers: vec![worker()],
                cluster,
                backlog_source_kind: "postgres",
                refresh_interval: Duration::from_secs(2),
                staleness_limit: Duration::from_secs(30),
            },
        );
        (clock, history, recorder)
    }

    fn tasks(queued: u64, running: u64) -> QueueBacklog {
        QueueBacklog::one_slot_tasks(queued, running)
    }

    #[test]
    fn backlog_is_recorded_in_slots_beside_the_task_counts() {
        let (_clock, history, recorder) = setup(Arc::new(NoClusterSource));
        let now = Instant::now();
        // 3 queued tasks of 3 slots, 2 running of 1: 11 slots, ceil(11 / 4) = 3 wanted.
        let mixed = Some(QueueBacklog {
            queued_tasks: 3,
            running_tasks: 2,
            queued_slots: 9,
            running_slots: 2,
            oldest_queued_age: None,
        });
        recorder.record_refresh(&snapshot(mixed, now), now);
        let a = history.answer(&worker(), HistoryRange::OneHour);
        assert_eq!(a.series[0].backlog, 11);
        assert_eq!(a.tiles.peak_wanted, Some(3));
        let peak = serde_json::to_value(&a.series[0]).unwrap();
        assert_eq!(
            (peak["queued"].as_u64(), peak["runningTasks"].as_u64()),
            (Some(3), Some(2))
        );
    }

    fn snapshot(counts: Option<QueueBacklog>, read_at: Instant) -> Snapshot {
        let mut s = Snapshot::empty(&["q".to_string()]);
        if let Some(c) = counts {
            s.record("q", Ok(c), read_at, SystemTime::now());
        }
        s
    }

    #[test]
    fn each_refresh_stands_for_the_time_since_the_last_capped_at_the_staleness_limit() {
        let (clock, history, recorder) = setup(Arc::new(NoClusterSource));
        let now = Instant::now();
        let busy = Some(tasks(30, 10));
        recorder.record_refresh(&snapshot(busy, now), now); // first: one interval, 2 s
        clock.advance(Duration::from_secs(3));
        recorder.record_refresh(&snapshot(busy, now), now); // 3 s
        clock.advance(Duration::from_secs(100));
        recorder.record_refresh(&snapshot(busy, now), now); // 100 s, capped at 30 s
        let a = history.answer(&worker(), HistoryRange::OneHour);
        assert_eq!(a.tiles.at_maximum_seconds, Some(35), "2 + 3 + 30");
        assert_eq!(a.tiles.peak_wanted, Some(10), "ceil(40 / 4), not held at 5");
        assert_eq!(a.decisions.len(), 0);
        assert_eq!(
            a.missing,
            vec!["workers", "running", "waiting", "terminating"]
        );
    }

    #[test]
    fn unavailable_data_is_a_gap_never_a_zero() {
        let (clock, history, recorder) = setup(Arc::new(NoClusterSource));
        let now = Instant::now();
        recorder.record_refresh(&snapshot(None, now), now); // not loaded
        clock.advance(Duration::from_secs(20));
        let stale_read = now - Duration::from_secs(31);
        let old = Some(tasks(1, 0));
        recorder.record_refresh(&snapshot(old, stale_read), now); // stale
        let a = history.answer(&worker(), HistoryRange::FifteenMinutes);
        assert!(a.series.is_empty(), "{:?}", a.series);
        assert_eq!(a.recording_since, None);
        assert!(a.findings.is_empty());
        clock.advance(Duration::from_secs(20));
        recorder.record_refresh(&snapshot(old, now), now);
        let a = history.answer(&worker(), HistoryRange::FifteenMinutes);
        assert_eq!(a.series.len(), 1);
        assert_eq!(a.series[0].backlog, 1);
    }

    #[test]
    fn the_backlogs_falls_become_the_drain_rate_and_a_gap_starts_over() {
        let view = ClusterView {
            workers: Some(3),
            running: Some(3),
            waiting: Some(0),
            terminating: Some(0),
            paused: Some(false),
        };
        let (clock, history, recorder) = setup(Arc::new(FixedCluster(view)));
        let now = Instant::now();
        // 40, 30, 32, 20 slots two seconds apart: it fell by 10 + 0 + 12 while running 8 s.
        for (queued, running) in [(28, 12), (18, 12), (20, 12), (8, 12)] {
            recorder.record_refresh(&snapshot(Some(tasks(queued, running)), now), now);
            clock.advance(Duration::from_secs(2));
        }
        let a = history.answer(&worker(), HistoryRange::FifteenMinutes);
        assert_eq!(a.series.len(), 1);
        assert_eq!(
            a.series[0].drained_per_minute,
            Some(165.0),
            "22 slots in 8 s"
        );
        // Silent for longer than the staleness limit: the fall across it is not counted.
        clock.advance(Duration::from_secs(100));
        recorder.record_refresh(&snapshot(Some(tasks(0, 5)), now), now);
        let a = history.answer(&worker(), HistoryRange::FifteenMinutes);
        assert_eq!(a.series.len(), 2);
        assert_eq!(a.series[1].drained_per_minute, Some(0.0));
    }

    #[test]
    fn the_cluster_view_reaches_the_samples_and_decisions() {
        let view = ClusterView {
            workers: Some(4),
            running: Some(3),
            waiting: Some(1),
            terminating: Some(0),
            paused: Some(false),
        };
        let (_clock, history, recorder) = setup(Arc::new(FixedCluster(view)));
        let now = Instant::now();
        let counts = Some(tasks(12, 4));
        recorder.record_refresh(&snapshot(counts, now), now);
        let a = history.answer(&worker(), HistoryRange::OneHour);
        assert!(a.missing.is_empty());
        assert_eq!(a.series[0].workers, Some(4));
        assert_eq!(a.series[0].waiting, Some(1));
        assert_eq!(a.tiles.waiting_for_capacity_seconds, Some(2));
    }
}
