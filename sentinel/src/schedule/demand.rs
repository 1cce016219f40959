//! What a run needs at its start on one pool, learned from the DAG's recent finished runs: the
//! peak of task slots held at once on the pool's queues within the run's first minutes (from
//! its first task queued), the largest over the runs read. A DAG never run yet counts the slots
//! of its tasks on those queues, up to one worker's slots: a guess is paid in idle workers.

use airflow::dag_schedule::{DagTask, RunTaskInstance};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

/// Finished runs read per DAG.
pub const RUNS_LEARNED: u32 = 5;
/// The "start" of a run: this long from its first task queued on the pool's queues.
pub const START_WINDOW: Duration = Duration::from_secs(120);
/// Airflow's default queue, for a task that names none.
pub const DEFAULT_QUEUE: &str = "default";

/// Where an expected demand comes from (the decision log says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The largest start peak of the last `runs` finished runs.
    Learned { runs: u32, peak: u64 },
    /// No finished run yet: its tasks on the pool's queues take `declared` slots.
    Declared { declared: u64 },
}

impl Basis {
    /// `last 5 runs needed 6 slots at start`.
    pub fn describe(&self) -> String {
        match self {
            Basis::Learned { runs, peak } => {
                format!(
                    "last {runs} run{} needed {peak} slot{} at start",
                    plural(*runs as u64),
                    plural(*peak)
                )
            }
            Basis::Declared { declared } => format!(
                "never run yet: its tasks on these queues take {declared} slot{}",
                plural(*declared)
            ),
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The slots a run of the DAG is expected to need at its start on one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub slots: u64,
    pub basis: Basis,
}

/// From the DAG's finished runs (`run_ids`) and their task instances on any queue: the demand
/// on `queues`. `None` without a finished run.
pub fn learned(
    run_ids: &[String],
    instances: &[RunTaskInstance],
    queues: &HashSet<&str>,
) -> Option<Demand> {
    if run_ids.is_empty() {
        return None;
    }
    let mut by_run: BTreeMap<&str, Vec<Interval>> =
        run_ids.iter().map(|r| (r.as_str(), Vec::new())).collect();
    for ti in instances {
        let on_pool = queues.contains(ti.queue.as_deref().unwrap_or(DEFAULT_QUEUE));
        let (Some(intervals), true) = (by_run.get_mut(ti.dag_run_id.as_str()), on_pool) else {
            continue;
        };
        // A task instance never queued (skipped, upstream failed) took no slot.
        let Some(from) = ti
            .queued_when
            .as_deref()
            .or(ti.start_date.as_deref())
            .and_then(parse_time)
        else {
            continue;
        };
        intervals.push(Interval {
            from,
            to: ti.end_date.as_deref().and_then(parse_time),
            slots: ti.pool_slots.max(1),
        });
    }
    let peak = by_run.values().map(|i| peak_at_start(i)).max().unwrap_or(0);
    Some(Demand {
        slots: peak,
        basis: Basis::Learned {
            runs: u32::try_from(run_ids.len()).unwrap_or(u32::MAX),
            peak,
        },
    })
}

/// For a DAG never run: the slots of its tasks on `queues`, counted up to `one_worker`.
pub fn declared(tasks: &[DagTask], queues: &HashSet<&str>, one_worker: u32) -> Demand {
    let declared: u64 = tasks
        .iter()
        .filter(|t| queues.contains(t.queue.as_deref().unwrap_or(DEFAULT_QUEUE)))
        .map(|t| t.pool_slots.map_or(1, |s| s.ceil().max(1.0) as u64))
        .sum();
    Demand {
        slots: declared.min(u64::from(one_worker)),
        basis: Basis::Declared { declared },
    }
}

/// When a task instance held its slots; `to` is `None` while it still does.
#[derive(Debug, Clone, Copy)]
struct Interval {
    from: SystemTime,
    to: Option<SystemTime>,
    slots: u64,
}

/// The most slots held at once within [`START_WINDOW`] of the first interval's start. A task
/// that ends when another starts does not overlap it.
fn peak_at_start(intervals: &[Interval]) -> u64 {
    let Some(start) = intervals.iter().map(|i| i.from).min() else {
        return 0;
    };
    let window_end = start + START_WINDOW;
    // (time, is_start, slots): at equal times ends sort before starts.
    let mut events: Vec<(SystemTime, bool, u64)> = Vec::new();
    for i in intervals.iter().filter(|i| i.from < window_end) {
        events.push((i.from, true, i.slots));
        if let Some(to) = i.to.filter(|to| *to < window_end) {
            events.push((to.max(i.from), false, i.slots));
        }
    }
    events.sort_by_key(|(at, is_start, _)| (*at, *is_start));
    let (mut held, mut peak) = (0u64, 0u64);
    for (_, is_start, slots) in events {
        if is_start {
            held += slots;
            peak = peak.max(held);
        } else {
            held = held.saturating_sub(slots);
        }
    }
    peak
}

pub fn parse_time(text: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ti(run: &str, queue: &str, slots: u64, from: &str, to: Option<&str>) -> RunTaskInstance {
        RunTaskInstance {
            dag_run_id: run.into(),
            queue: Some(queue.into()),
            pool_slots: slots,
            queued_when: Some(format!("2026-01-01T05:{from}Z")),
            start_date: None,
            end_date: to.map(|t| format!("2026-01-01T05:{t}Z")),
        }
    }

    fn queues<'a>(q: &[&'a str]) -> HashSet<&'a str> {
        q.iter().copied().collect()
    }

    fn runs(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_peak_counts_slots_held_at_once_in_the_first_minutes() {
        let tis = [
            // r1: 2 + 3 overlap (5), then 1 after both ended.
            ti("r1", "q", 2, "00:00", Some("00:30")),
            ti("r1", "q", 3, "00:10", Some("00:40")),
            ti("r1", "q", 1, "00:40", Some("01:00")),
            // Past the start window: not the start's demand.
            ti("r1", "q", 9, "02:01", None),
            // Another queue: another pool's work.
            ti("r1", "other", 7, "00:05", Some("00:20")),
            // r2: a task ending when the next starts does not overlap it.
            ti("r2", "q", 4, "10:00", Some("10:20")),
            ti("r2", "q", 4, "10:20", Some("10:50")),
        ];
        let d = learned(&runs(&["r1", "r2"]), &tis, &queues(&["q"])).unwrap();
        assert_eq!(d.slots, 5);
        assert_eq!(d.basis, Basis::Learned { runs: 2, peak: 5 });
        assert_eq!(d.basis.describe(), "last 2 runs needed 5 slots at start");
    }

    #[test]
    fn a_run_without_work_on_the_pool_counts_zero_and_unlisted_runs_are_ignored() {
        let tis = [
            ti("old", "q", 8, "00:00", Some("00:10")),
            ti("r1", "other", 3, "00:00", None),
        ];
        let d = learned(&runs(&["r1"]), &tis, &queues(&["q"])).unwrap();
        assert_eq!(d.slots, 0);
        assert!(learned(&[], &tis, &queues(&["q"])).is_none());
    }

    #[test]
    fn a_task_never_queued_took_no_slot() {
        let mut skipped = ti("r1", "q", 5, "00:00", None);
        skipped.queued_when = None;
        let d = learned(
            &runs(&["r1"]),
            &[skipped, ti("r1", "q", 1, "00:01", None)],
            &queues(&["q"]),
        )
        .unwrap();
        assert_eq!(d.slots, 1);
    }

    #[test]
    fn a_dag_never_run_counts_its_tasks_up_to_one_worker() {
        let task = |queue: Option<&str>, slots: Option<f64>| DagTask {
            task_id: Some("t".into()),
            queue: queue.map(Into::into),
            pool_slots: slots,
        };
        let tasks = [
            task(Some("q"), Some(2.0)),
            task(None, None),
            task(Some("other"), Some(5.0)),
        ];
        let d = declared(&tasks, &queues(&["q", DEFAULT_QUEUE]), 16);
        assert_eq!(
            d,
            Demand {
                slots: 3,
                basis: Basis::Declared { declared: 3 }
            }
        );
        let capped = declared(&tasks, &queues(&["q", DEFAULT_QUEUE]), 2);
        assert_eq!(capped.slots, 2);
        assert_eq!(
            capped.basis.describe(),
            "never run yet: its tasks on these queues take 3 slots"
        );
    }
}
