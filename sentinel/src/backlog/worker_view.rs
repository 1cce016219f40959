//! What one worker Deployment's backlog is, computed from the cache at request time.
//!
//! A worker is served only when every one of its queues has a value younger than the
//! staleness limit. Anything else is an explicit "unavailable" (HTTP 503), never a made-up 0:
//! KEDA treats an error as "keep the pool as it is", but a 0 as "scale it away".

use crate::backlog::cache::Snapshot;
use crate::config::file::WorkerConfig;
use crate::schedule::windows::ExpectedRun;
use serde::Serialize;
use std::time::{Duration, Instant, SystemTime};

/// `ceil(backlog / sync_slots)`: the workers the backlog calls for, not yet held within the
/// worker's range (the history shows it below the minimum and above the maximum too).
pub fn wanted_replicas(backlog: u64, sync_slots: u32) -> u32 {
    let wanted = backlog.div_ceil(u64::from(sync_slots.max(1)));
    u32::try_from(wanted).unwrap_or(u32::MAX)
}

/// `ceil(backlog / sync_slots)`, held between `min` and `max`.
pub fn desired_replicas(backlog: u64, sync_slots: u32, min: u32, max: u32) -> u32 {
    wanted_replicas(backlog, sync_slots).clamp(min, max.max(min))
}

/// The 200 answer of `GET /v1/workers/{name}`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerBacklog {
    pub worker: String,
    pub queues: Vec<String>,
    /// Task slots (Σ `pool_slots`) of the queued task instances over the worker's queues.
    pub queued: u64,
    /// Task slots of the running task instances.
    pub running: u64,
    /// `queued + running`, in task slots: the value KEDA reads (`valueLocation: backlog`)
    /// against `syncSlots`, the slots one worker offers.
    pub backlog: u64,
    /// Pre-warm: the slots scheduled runs about to start are expected to need, apart from the
    /// real backlog (0 outside a pre-warm window). KEDA reads it with a trigger of its own
    /// (`valueLocation: expectedSlots`) and scales by the larger of the two, never their sum.
    pub expected_slots: u64,
    /// The runs `expectedSlots` is for.
    pub expected_for: Vec<ExpectedRun>,
    /// Headroom (`overprovisionSlots`): slots kept free above the work while the pool has any
    /// (0 when it has none, so that the pool can still go to zero).
    pub headroom_slots: u64,
    /// What the pool is sized by: the larger of `backlog` and `expectedSlots`, plus
    /// `headroomSlots`. KEDA reads it with a trigger of its own (`valueLocation:
    /// scalingSlots`) when the worker keeps headroom.
    pub scaling_slots: u64,
    /// Queued task instances (each counted once, whatever its slots).
    pub queued_tasks: u64,
    /// Running task instances.
    pub running_tasks: u64,
    /// How long the longest-waiting queued task instance has been queued, as of now; 0 when
    /// none is queued.
    pub oldest_queued_age_seconds: f64,
    /// Task instances on the worker's queues that Airflow holds in `scheduled` (`[core]
    /// parallelism`, pools, `max_active_tasks`): waiting, but never in `backlog`, since no
    /// worker could take them. `null` when the last refresh could not count them.
    pub held_tasks: Option<u64>,
    pub sync_slots: u32,
    pub desired_replicas: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// When the oldest of the worker's queue values was read (RFC 3339, UTC).
    pub updated_at: String,
    /// Age of that oldest value.
    pub age_seconds: f64,
}

/// The 503 answer: which queues have no usable value, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Unavailable {
    pub error: String,
    /// `notLoaded` (never read yet) or `stale` (older than the staleness limit).
    pub reason: &'static str,
    pub worker: String,
    /// The worker's queue names, as in the 200 answer.
    pub queues: Vec<String>,
    /// Each queue's state: which ones have no usable value, and why.
    pub queue_status: Vec<QueueStatus>,
    pub staleness_limit_seconds: f64,
    /// The worker's configuration, as in the 200 answer: a reader (the page's worker list)
    /// still knows the pool's range while its backlog is unknown.
    pub sync_slots: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    pub queue: String,
    /// `fresh`, `stale` or `notLoaded`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum WorkerAnswer {
    Ready(WorkerBacklog),
    Unavailable(Unavailable),
}

pub const NOT_LOADED: &str = "notLoaded";
pub const STALE: &str = "stale";
pub const FRESH: &str = "fresh";

/// The answer for `worker` from `snapshot`, as of `now`.
pub fn worker_answer(
    worker: &WorkerConfig,
    snapshot: &Snapshot,
    now: Instant,
    staleness_limit: Duration,
) -> WorkerAnswer {
    let mut queued = 0u64;
    let mut running = 0u64;
    let mut queued_tasks = 0u64;
    let mut running_tasks = 0u64;
    let mut oldest_queued = Duration::ZERO;
    let mut oldest: Option<(Duration, SystemTime)> = None;
    let mut statuses = Vec::with_capacity(worker.queues.len());
    let mut any_not_loaded = false;
    let mut any_stale = false;

    for queue in &worker.queues {
        let entry = snapshot.queue(queue);
        let last_error = entry.and_then(|e| e.last_error.as_deref().map(str::to_string));
        match entry.and_then(|e| e.last) {
            None => {
                any_not_loaded = true;
                statuses.push(QueueStatus {
                    queue: queue.clone(),
                    state: NOT_LOADED,
                    age_seconds: None,
                    last_error,
                });
            }
            Some(reading) => {
                let age = now.saturating_duration_since(reading.at);
                let stale = age > staleness_limit;
                any_stale |= stale;
                let b = reading.backlog;
                queued = queued.saturating_add(b.queued_slots);
                running = running.saturating_add(b.running_slots);
                queued_tasks = queued_tasks.saturating_add(b.queued_tasks);
                running_tasks = running_tasks.saturating_add(b.running_tasks);
                // The wait as read, plus the time since: it keeps growing between refreshes.
                if let Some(waited) = b.oldest_queued_age {
                    oldest_queued = oldest_queued.max(waited.saturating_add(age));
                }
                if oldest.is_none_or(|(a, _)| age > a) {
                    oldest = Some((age, reading.at_wall));
                }
                statuses.push(QueueStatus {
                    queue: queue.clone(),
                    state: if stale { STALE } else { FRESH },
                    age_seconds: Some(seconds(age)),
                    last_error,
                });
            }
        }
    }

    if any_not_loaded || any_stale {
        let reason = if any_not_loaded { NOT_LOADED } else { STALE };
        let bad: Vec<&str> = statuses
            .iter()
            .filter(|s| s.state != FRESH)
            .map(|s| s.queue.as_str())
            .collect();
        let error = if any_not_loaded {
            format!(
                "backlog of worker {} is not loaded yet: no value read for queue(s) {}",
                worker.name,
                bad.join(", ")
            )
        } else {
            format!(
                "backlog of worker {} is stale: queue(s) {} not refreshed within {}",
                worker.name,
                bad.join(", "),
                humantime::format_duration(staleness_limit)
            )
        };
        return WorkerAnswer::Unavailable(Unavailable {
            error,
            reason,
            worker: worker.name.clone(),
            queues: worker.queues.clone(),
            queue_status: statuses,
            staleness_limit_seconds: seconds(staleness_limit),
            sync_slots: worker.sync_slots,
            min_replicas: worker.min_replicas,
            max_replicas: worker.max_replicas,
        });
    }

    let (age, at_wall) = oldest.expect("a valid worker has at least one queue");
    let backlog = queued.saturating_add(running);
    let expected = snapshot.expected(&worker.name);
    let expected_slots = expected.map_or(0, |e| e.slots);
    let work = backlog.max(expected_slots);
    // Headroom rides on work: an idle pool keeps none and can still go to zero.
    let headroom_slots = if work > 0 {
        u64::from(worker.overprovision_slots)
    } else {
        0
    };
    let scaling_slots = work.saturating_add(headroom_slots);
    WorkerAnswer::Ready(WorkerBacklog {
        worker: worker.name.clone(),
        queues: worker.queues.clone(),
        queued,
        running,
        backlog,
        expected_slots,
        expected_for: expected.map(|e| e.runs.clone()).unwrap_or_default(),
        headroom_slots,
        scaling_slots,
        queued_tasks,
        running_tasks,
        oldest_queued_age_seconds: seconds(oldest_queued),
        held_tasks: snapshot.held(&worker.queues),
        sync_slots: worker.sync_slots,
        desired_replicas: desired_replicas(
            scaling_slots,
            worker.sync_slots,
            worker.min_replicas,
            worker.max_replicas,
        ),
        min_replicas: worker.min_replicas,
        max_replicas: worker.max_replicas,
        updated_at: rfc3339(at_wall),
        age_seconds: seconds(age),
    })
}

impl WorkerBacklog {
    /// The work the pool has: the real backlog, or the slots expected by pre-warm when more
    /// (the same run is never counted twice); `scalingSlots` without the headroom.
    pub fn work_slots(&self) -> u64 {
        self.backlog.max(self.expected_slots)
    }
}

/// Seconds with millisecond precision.
fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::QueueBacklog;

    fn tasks(queued: u64, running: u64) -> QueueBacklog {
        QueueBacklog::one_slot_tasks(queued, running)
    }

    fn worker(queues: &[&str], slots: u32, min: u32, max: u32) -> WorkerConfig {
        WorkerConfig {
            name: "w".into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            sync_slots: slots,
            min_replicas: min,
            max_replicas: max,
            overprovision_slots: 0,
        }
    }

    #[test]
    fn headroom_rides_on_the_work_and_leaves_an_idle_pool_free_to_go_to_zero() {
        let now = Instant::now();
        let mut s = Snapshot::empty(&["q".to_string()]);
        let mut keeps_headroom = worker(&["q"], 4, 0, 5);
        keeps_headroom.overprovision_slots = 6;
        let answer =
            |s: &Snapshot| match worker_answer(&keeps_headroom, s, now, Duration::from_secs(30)) {
                WorkerAnswer::Ready(b) => b,
                other => panic!("expected ready, got {other:?}"),
            };
        s.record("q", Ok(tasks(0, 0)), now, SystemTime::now());
        let idle = answer(&s);
        assert_eq!(
            (
                idle.headroom_slots,
                idle.scaling_slots,
                idle.desired_replicas
            ),
            (0, 0, 0)
        );
        s.record("q", Ok(tasks(2, 1)), now, SystemTime::now());
        let busy = answer(&s);
        // 3 slots of work and 6 kept free: ceil(9 / 4) workers; the backlog stays the real one.
        assert_eq!(
            (
                busy.backlog,
                busy.headroom_slots,
                busy.scaling_slots,
                busy.desired_replicas
            ),
            (3, 6, 9, 3)
        );
        let json = serde_json::to_value(&busy).unwrap();
        assert_eq!(
            (
                json["scalingSlots"].as_u64(),
                json["headroomSlots"].as_u64()
            ),
            (Some(9), Some(6))
        );
        s.record("q", Ok(tasks(40, 0)), now, SystemTime::now());
        assert_eq!(answer(&s).desired_replicas, 5, "never above the maximum");
    }

    #[test]
    fn expected_slots_stand_apart_and_the_pool_is_sized_by_the_larger() {
        use crate::schedule::windows::{Expected, ExpectedRun};
        let now = Instant::now();
        let mut s = Snapshot::empty(&["q".to_string()]);
        s.record("q", Ok(tasks(1, 1)), now, SystemTime::now());
        let answer = |s: &Snapshot| match worker_answer(
            &worker(&["q"], 2, 0, 10),
            s,
            now,
            Duration::from_secs(30),
        ) {
            WorkerAnswer::Ready(b) => b,
            other => panic!("expected ready, got {other:?}"),
        };
        let plain = answer(&s);
        assert_eq!(
            (plain.backlog, plain.expected_slots, plain.desired_replicas),
            (2, 0, 1)
        );
        assert!(plain.expected_for.is_empty());
        let runs = vec![ExpectedRun {
            dag: "etl".into(),
            run_after: "2026-01-01T05:00:00Z".into(),
        }];
        s.set_expected(
            [(
                "w".to_string(),
                Expected {
                    slots: 6,
                    runs: runs.clone(),
                },
            )]
            .into(),
        );
        let warm = answer(&s);
        // The backlog stays the real one; the replicas follow max(2, 6), not 2 + 6.
        assert_eq!(
            (warm.backlog, warm.expected_slots, warm.desired_replicas),
            (2, 6, 3)
        );
        assert_eq!(warm.scaling_slots, 6);
        assert_eq!(warm.expected_for, runs);
        let json = serde_json::to_value(&warm).unwrap();
        assert_eq!(json["expectedSlots"], 6);
        assert_eq!(json["expectedFor"][0]["runAfter"], "2026-01-01T05:00:00Z");
        // The real backlog above the expectation takes over.
        s.record("q", Ok(tasks(9, 0)), now, SystemTime::now());
        assert_eq!(answer(&s).desired_replicas, 5);
    }

    #[test]
    fn wanted_rounds_up_without_clamping() {
        assert_eq!(wanted_replicas(0, 4), 0);
        assert_eq!(wanted_replicas(12, 4), 3);
        assert_eq!(wanted_replicas(13, 4), 4);
        assert_eq!(wanted_replicas(1000, 16), 63, "above any max");
        assert_eq!(wanted_replicas(u64::MAX, 1), u32::MAX);
    }

    #[test]
    fn formula_rounds_up_and_clamps() {
        assert_eq!(desired_replicas(0, 16, 0, 10), 0);
        assert_eq!(desired_replicas(1, 16, 0, 10), 1);
        assert_eq!(desired_replicas(16, 16, 0, 10), 1);
        assert_eq!(desired_replicas(17, 16, 0, 10), 2);
        assert_eq!(desired_replicas(30, 4, 0, 10), 8);
        assert_eq!(desired_replicas(0, 16, 2, 10), 2, "held at min");
        assert_eq!(desired_replicas(1000, 16, 0, 10), 10, "held at max");
        assert_eq!(desired_replicas(u64::MAX, 1, 0, u32::MAX), u32::MAX);
        assert_eq!(desired_replicas(5, 1, 3, 3), 3);
        // The seed's example: 40 tasks at concurrency 5 → 8; 60 → its max of 8; 3 → min 1.
        assert_eq!(desired_replicas(40, 5, 1, 8), 8);
        assert_eq!(desired_replicas(60, 5, 1, 8), 8);
        assert_eq!(desired_replicas(3, 5, 1, 8), 1);
    }

    #[test]
    fn held_tasks_stand_beside_the_backlog_never_in_it() {
        let now = Instant::now();
        let mut s = Snapshot::empty(&["a".to_string(), "b".to_string()]);
        s.record("a", Ok(tasks(1, 0)), now, SystemTime::now());
        s.record("b", Ok(tasks(0, 0)), now, SystemTime::now());
        let answer = |s: &Snapshot| match worker_answer(
            &worker(&["a", "b"], 1, 0, 10),
            s,
            now,
            Duration::from_secs(30),
        ) {
            WorkerAnswer::Ready(b) => b,
            WorkerAnswer::Unavailable(u) => panic!("{u:?}"),
        };
        assert_eq!(answer(&s).held_tasks, None, "never counted");
        s.set_held(Some([("a".to_string(), 3), ("b".to_string(), 2)].into()));
        let b = answer(&s);
        assert_eq!(b.held_tasks, Some(5));
        assert_eq!(
            (b.backlog, b.desired_replicas),
            (1, 1),
            "held tasks scale nothing"
        );
        s.set_held(Some([("a".to_string(), 3)].into()));
        assert_eq!(
            answer(&s).held_tasks,
            None,
            "queue b not counted: the sum is unknown"
        );
        s.set_held(None);
        assert_eq!(answer(&s).held_tasks, None);
    }

    #[test]
    fn sums_queues_and_reports_the_oldest_age() {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut s = Snapshot::empty(&["a".to_string(), "b".to_string()]);
        let old = now - Duration::from_secs(5);
        s.record("a", Ok(tasks(10, 3)), old, wall - Duration::from_secs(5));
        s.record("b", Ok(tasks(20, 0)), now, wall);
        let WorkerAnswer::Ready(b) = worker_answer(
            &worker(&["a", "b"], 4, 0, 100),
            &s,
            now,
            Duration::from_secs(30),
        ) else {
            panic!("expected ready")
        };
        assert_eq!((b.queued, b.running, b.backlog), (30, 3, 33));
        assert_eq!(b.desired_replicas, 9);
        assert_eq!(b.age_seconds, 5.0);
        assert!(b.updated_at.ends_with('Z'));
        assert_eq!(b.oldest_queued_age_seconds, 0.0, "no wait was read");
    }

    #[test]
    fn backlog_counts_slots_and_keeps_task_counts_beside() {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut s = Snapshot::empty(&["a".to_string(), "b".to_string()]);
        // a: 2 queued tasks of 3 slots and 1 of 1, 1 running of 3; b: 1 queued of 1.
        s.record(
            "a",
            Ok(QueueBacklog {
                queued_tasks: 3,
                running_tasks: 1,
                queued_slots: 7,
                running_slots: 3,
                oldest_queued_age: Some(Duration::from_secs(40)),
            }),
            now - Duration::from_secs(2),
            wall,
        );
        s.record(
            "b",
            Ok(QueueBacklog {
                queued_slots: 1,
                queued_tasks: 1,
                oldest_queued_age: Some(Duration::from_secs(41)),
                ..QueueBacklog::default()
            }),
            now,
            wall,
        );
        let WorkerAnswer::Ready(b) = worker_answer(
            &worker(&["a", "b"], 4, 0, 100),
            &s,
            now,
            Duration::from_secs(30),
        ) else {
            panic!("expected ready")
        };
        assert_eq!((b.queued, b.running, b.backlog), (8, 3, 11));
        assert_eq!((b.queued_tasks, b.running_tasks), (4, 1));
        assert_eq!(b.desired_replicas, 3, "ceil(11 slots / 4)");
        // a's 40 s as read 2 s ago is 42 s now, older than b's 41 s read just now.
        assert_eq!(b.oldest_queued_age_seconds, 42.0);
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["backlog"], 11);
        assert_eq!(json["queuedTasks"], 4);
        assert_eq!(json["runningTasks"], 1);
        assert_eq!(json["oldestQueuedAgeSeconds"], 42.0);
    }

    #[test]
    fn a_stale_queue_makes_the_worker_unavailable_never_zero() {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut s = Snapshot::empty(&["a".to_string(), "b".to_string()]);
        s.record("a", Ok(QueueBacklog::default()), now, wall);
        s.record(
            "b",
            Ok(QueueBacklog::default()),
            now - Duration::from_secs(31),
            wall,
        );
        s.record("b", Err("connection refused".into()), now, wall);
        match worker_answer(
            &worker(&["a", "b"], 4, 0, 10),
            &s,
            now,
            Duration::from_secs(30),
        ) {
            WorkerAnswer::Unavailable(u) => {
                assert_eq!(u.reason, STALE);
                assert_eq!(u.queue_status[0].state, FRESH);
                assert_eq!(u.queue_status[1].state, STALE);
                assert_eq!(
                    u.queue_status[1].last_error.as_deref(),
                    Some("connection refused")
                );
                assert!(u.error.contains('b'));
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
        // Exactly at the limit is still fresh.
        s.record(
            "b",
            Ok(QueueBacklog::default()),
            now - Duration::from_secs(30),
            wall,
        );
        assert!(matches!(
            worker_answer(
                &worker(&["a", "b"], 4, 0, 10),
                &s,
                now,
                Duration::from_secs(30)
            ),
            WorkerAnswer::Ready(_)
        ));
    }

    #[test]
    fn a_queue_never_read_is_not_loaded() {
        let now = Instant::now();
        let mut s = Snapshot::empty(&["a".to_string()]);
        s.record("a", Err("HTTP 500".into()), now, SystemTime::now());
        match worker_answer(&worker(&["a"], 4, 0, 10), &s, now, Duration::from_secs(30)) {
            WorkerAnswer::Unavailable(u) => {
                assert_eq!(u.reason, NOT_LOADED);
                assert_eq!((u.sync_slots, u.min_replicas, u.max_replicas), (4, 0, 10));
                assert_eq!(u.queue_status[0].last_error.as_deref(), Some("HTTP 500"));
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
    }
}
