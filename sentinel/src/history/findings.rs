//! What held a worker back over a range, in the scaling history dialog's words, and the three
//! tiles. Computed from bucket totals, which are exact whatever the tier's width.
//!
//! * "Ran at its maximum of N workers for T." once at-maximum time reaches the range's
//!   threshold (15 min × range ÷ 1 day).
//! * "Workers waited for room on the cluster for T." the same for time with pending workers.
//! * "Needed fewer than its minimum of M workers for P% of the time it was running." when
//!   wanted < minimum for at least 90 % of the running time, and running time reaches
//!   2 h × range ÷ 1 day.
//! * "Paused for T." for time with scaling stopped on purpose (KEDA's pause annotations,
//!   Airflow's maintenance), the same threshold; that time counts in no other tile or finding.
//! * "Worker W ran with 8 slots while the autoscaler assumed 16 for T." for time with a worker
//!   whose reported slots differ from the pool's `syncSlots`, the same threshold.
//! * "Held below its maximum by Airflow for T: up to N tasks waited as scheduled." for time
//!   with task instances Airflow holds in `scheduled` while the pool was below its maximum,
//!   the same threshold. Which limit held them (`[core] parallelism`, a pool, a DAG's
//!   `max_active_tasks`) Airflow does not record.
//! * "Oscillated: 8 replica changes within an hour, turning back 5 times, while the backlog
//!   stayed between 7 and 9 slots, within one worker's 4." (seed 002's check, see
//!   [`oscillation`](super::oscillation)); any length of time.
//! * A fixed-size pool (min = max) is never "at its maximum" in the sense above: it reads
//!   "Fixed at 4 workers (16 slots): 35% of its slots ran tasks." and, once the backlog wanted
//!   more workers than it has for the threshold, "The backlog needed more workers for T." Its
//!   below-minimum finding would say the same as the share, so it has none.
//! * Otherwise "Stayed within its range over this period."

use super::decisions::DecisionKind;
use super::duration_text::human_duration;
use super::oscillation::Oscillation;
use super::range::HistoryRange;
use super::tier::{Bucket, UNKNOWN_SLOT_MS};
use serde::Serialize;

/// Sums over the buckets of a range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeTotals {
    pub buckets: usize,
    pub observed_ms: u64,
    pub at_maximum_ms: u64,
    /// `None` when no bucket of the range had a source for `waiting`.
    pub waiting_ms: Option<u64>,
    pub running_ms: u64,
    pub below_minimum_ms: u64,
    pub paused_ms: u64,
    pub slot_drift_ms: u64,
    pub held_back_ms: u64,
    /// The most task instances held in `scheduled` at once.
    pub peak_held_tasks: u32,
    /// Σ running slots × time over the buckets that counted it...
    pub busy_slot_ms: u64,
    /// ...and the time (observed, not paused) those buckets stand for.
    pub busy_counted_ms: u64,
    /// The slots of the last drifting worker in the range.
    pub drift_slots: Option<u32>,
    pub peak_wanted: Option<u32>,
    /// The worker's range at the last bucket (what the text names).
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub sync_slots: u32,
}

impl RangeTotals {
    pub fn of<'a>(buckets: impl IntoIterator<Item = &'a Bucket>) -> RangeTotals {
        let mut t = RangeTotals::default();
        for b in buckets {
            t.buckets += 1;
            t.observed_ms += u64::from(b.observed_ms);
            t.at_maximum_ms += u64::from(b.at_maximum_ms);
            if b.peak.waiting.get().is_some() {
                t.waiting_ms = Some(t.waiting_ms.unwrap_or(0) + u64::from(b.waiting_ms));
            }
            t.running_ms += u64::from(b.running_ms);
            t.below_minimum_ms += u64::from(b.below_minimum_ms);
            t.paused_ms += u64::from(b.paused_ms);
            t.slot_drift_ms += u64::from(b.slot_drift_ms);
            t.held_back_ms += u64::from(b.held_back_ms);
            t.peak_held_tasks = t.peak_held_tasks.max(b.peak.held_tasks);
            if b.busy_slot_ms != UNKNOWN_SLOT_MS {
                t.busy_slot_ms = t.busy_slot_ms.saturating_add(b.busy_slot_ms);
                t.busy_counted_ms += u64::from(b.observed_ms.saturating_sub(b.paused_ms));
            }
            t.drift_slots = b.drift_slots.get().or(t.drift_slots);
            t.peak_wanted = Some(t.peak_wanted.unwrap_or(0).max(b.peak.wanted));
            t.min_replicas = b.min_replicas;
            t.max_replicas = b.max_replicas;
            t.sync_slots = b.sync_slots;
        }
        t
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FindingKind {
    AtMaximum,
    WaitingForCapacity,
    BelowMinimum,
    WithinRange,
    /// Idle worker-time spent on pre-warming from the schedule.
    PreWarmIdle,
    Paused,
    SlotDrift,
    HeldBack,
    Oscillation,
    /// A fixed-size pool's use of its slots.
    FixedSize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub text: String,
    /// The time the finding is about (for `withinRange`: the time observed).
    pub seconds: u64,
}

/// The three tiles; `null` where there is no data to say it (never a made-up 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tiles {
    pub peak_wanted: Option<u32>,
    pub at_maximum_seconds: Option<u64>,
    pub waiting_for_capacity_seconds: Option<u64>,
    /// Time paused on purpose, which the other tiles leave out.
    pub paused_seconds: Option<u64>,
    /// Time below the maximum with tasks Airflow held in `scheduled`.
    pub held_back_seconds: Option<u64>,
}

pub fn tiles(t: &RangeTotals) -> Tiles {
    let any = t.buckets > 0;
    Tiles {
        peak_wanted: t.peak_wanted,
        at_maximum_seconds: any.then(|| whole_seconds(t.at_maximum_ms)),
        waiting_for_capacity_seconds: t.waiting_ms.map(whole_seconds),
        paused_seconds: any.then(|| whole_seconds(t.paused_ms)),
        held_back_seconds: any.then(|| whole_seconds(t.held_back_ms)),
    }
}

/// The findings for `range`; empty when the range holds no data at all. `drifting_worker` names
/// the last worker seen running with other slots than the pool's, when it is known;
/// `oscillation` is the worst oscillating hour of the decision log in the range, if any.
pub fn findings(
    t: &RangeTotals,
    range: HistoryRange,
    drifting_worker: Option<&str>,
    oscillation: Option<&Oscillation>,
) -> Vec<Finding> {
    if t.buckets == 0 {
        return Vec::new();
    }
    let threshold = range.finding_threshold_ms();
    let mut out = Vec::new();
    if t.paused_ms >= threshold {
        let seconds = whole_seconds(t.paused_ms);
        out.push(Finding {
            kind: FindingKind::Paused,
            text: format!("Paused for {}.", human_duration(seconds)),
            seconds,
        });
    }
    if t.held_back_ms >= threshold {
        let seconds = whole_seconds(t.held_back_ms);
        let tasks = if t.peak_held_tasks == 1 {
            "1 task".to_string()
        } else {
            format!("{} tasks", t.peak_held_tasks)
        };
        out.push(Finding {
            kind: FindingKind::HeldBack,
            text: format!(
                "Held below its maximum by Airflow for {}: up to {tasks} waited as scheduled.",
                human_duration(seconds)
            ),
            seconds,
        });
    }
    if t.slot_drift_ms >= threshold {
        let seconds = whole_seconds(t.slot_drift_ms);
        let who = drifting_worker.map_or_else(|| "A worker".to_string(), |w| format!("Worker {w}"));
        let with = t
            .drift_slots
            .map_or_else(|| "other slots".to_string(), slots);
        out.push(Finding {
            kind: FindingKind::SlotDrift,
            text: format!(
                "{who} ran with {with} while the autoscaler assumed {} for {}.",
                t.sync_slots,
                human_duration(seconds)
            ),
            seconds,
        });
    }
    if let Some(o) = oscillation {
        let counted = match o.kind {
            DecisionKind::Workers => "worker count changes",
            DecisionKind::DesiredReplicas => "changes of the wanted workers",
        };
        out.push(Finding {
            kind: FindingKind::Oscillation,
            text: format!(
                "Oscillated: {} {counted} within an hour, turning back {} times, while the backlog \
                 stayed between {} and {}, within one worker's {}.",
                o.changes,
                o.reversals,
                o.lowest_backlog,
                slots(o.highest_backlog),
                slots(o.sync_slots),
            ),
            seconds: 0,
        });
    }
    let fixed_size = t.min_replicas == t.max_replicas && t.max_replicas > 0;
    if fixed_size {
        out.extend(fixed_size_findings(t, threshold));
    } else if t.at_maximum_ms >= threshold {
        let seconds = whole_seconds(t.at_maximum_ms);
        out.push(Finding {
            kind: FindingKind::AtMaximum,
            text: format!(
                "Ran at its maximum of {} for {}.",
                workers(t.max_replicas),
                human_duration(seconds)
            ),
            seconds,
        });
    }
    if let Some(waiting) = t.waiting_ms.filter(|w| *w >= threshold) {
        let seconds = whole_seconds(waiting);
        out.push(Finding {
            kind: FindingKind::WaitingForCapacity,
            text: format!(
                "Workers waited for room on the cluster for {}.",
                human_duration(seconds)
            ),
            seconds,
        });
    }
    // Exact in integers: below / running >= 90 %.
    if !fixed_size
        && t.running_ms > 0
        && t.running_ms >= range.running_floor_ms()
        && t.below_minimum_ms * 10 >= t.running_ms * 9
    {
        // Rounded down, so the figure never reads 90 % when the share is below it.
        let percent = t.below_minimum_ms * 100 / t.running_ms;
        out.push(Finding {
            kind: FindingKind::BelowMinimum,
            text: format!(
                "Needed fewer than its minimum of {} for {percent}% of the time it was running.",
                workers(t.min_replicas)
            ),
            seconds: whole_seconds(t.below_minimum_ms),
        });
    }
    if out.is_empty() {
        out.push(Finding {
            kind: FindingKind::WithinRange,
            text: "Stayed within its range over this period.".into(),
            seconds: whole_seconds(t.observed_ms),
        });
    }
    out
}

/// What a pool with min = max did with its slots, and how long its size held work back.
fn fixed_size_findings(t: &RangeTotals, threshold: u64) -> Vec<Finding> {
    let capacity = u64::from(t.max_replicas) * u64::from(t.sync_slots);
    let size = format!(
        "Fixed at {} ({})",
        workers(t.max_replicas),
        slots(u32::try_from(capacity).unwrap_or(u32::MAX))
    );
    let offered_slot_ms = u128::from(capacity) * u128::from(t.busy_counted_ms);
    // Rounded down, so that a pool short of full never reads 100 %.
    let text = match (u128::from(t.busy_slot_ms) * 100).checked_div(offered_slot_ms) {
        Some(percent) => format!("{size}: {percent}% of its slots ran tasks."),
        None => format!("{size}."),
    };
    let mut out = vec![Finding {
        kind: FindingKind::FixedSize,
        text,
        seconds: whole_seconds(t.busy_counted_ms),
    }];
    if t.at_maximum_ms >= threshold {
        let seconds = whole_seconds(t.at_maximum_ms);
        out.push(Finding {
            kind: FindingKind::AtMaximum,
            text: format!(
                "The backlog needed more than its {} for {}.",
                workers(t.max_replicas),
                human_duration(seconds)
            ),
            seconds,
        });
    }
    out
}

fn slots(n: u32) -> String {
    if n == 1 {
        "1 slot".into()
    } else {
        format!("{n} slots")
    }
}

fn workers(n: u32) -> String {
    if n == 1 {
        "1 worker".into()
    } else {
        format!("{n} workers")
    }
}

/// Milliseconds to the nearest second (37.5 s reads 38 s).
pub fn whole_seconds(ms: u64) -> u64 {
    (ms + 500) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(observed_ms: u64) -> RangeTotals {
        RangeTotals {
            buckets: 1,
            observed_ms,
            peak_wanted: Some(3),
            min_replicas: 1,
            max_replicas: 5,
            ..RangeTotals::default()
        }
    }

    fn kinds(f: &[Finding]) -> Vec<FindingKind> {
        f.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn texts_read_like_the_seed() {
        let t = RangeTotals {
            at_maximum_ms: 120_000,
            waiting_ms: Some(40 * 60_000),
            ..totals(86_400_000)
        };
        let f = findings(&t, HistoryRange::FifteenMinutes, None, None);
        assert_eq!(f[0].text, "Ran at its maximum of 5 workers for 2 min.");
        assert_eq!(f[0].seconds, 120);
        assert_eq!(
            f[1].text,
            "Workers waited for room on the cluster for 40 min."
        );
        let t = RangeTotals {
            running_ms: 10_000_000,
            below_minimum_ms: 9_500_000,
            min_replicas: 2,
            ..totals(86_400_000)
        };
        assert_eq!(
            findings(&t, HistoryRange::OneDay, None, None)[0].text,
            "Needed fewer than its minimum of 2 workers for 95% of the time it was running."
        );
        let t = RangeTotals {
            min_replicas: 0,
            max_replicas: 1,
            at_maximum_ms: 2 * 3_600_000,
            ..totals(86_400_000)
        };
        assert_eq!(
            findings(&t, HistoryRange::OneDay, None, None)[0].text,
            "Ran at its maximum of 1 worker for 2 h."
        );
        assert_eq!(
            findings(&totals(60_000), HistoryRange::OneDay, None, None),
            vec![Finding {
                kind: FindingKind::WithinRange,
                text: "Stayed within its range over this period.".into(),
                seconds: 60
            }]
        );
    }

    #[test]
    fn paused_and_slot_drift_read_like_the_issue() {
        let t = RangeTotals {
            paused_ms: 3 * 3_600_000,
            slot_drift_ms: 40 * 60_000,
            drift_slots: Some(8),
            sync_slots: 16,
            ..totals(86_400_000)
        };
        let f = findings(&t, HistoryRange::OneDay, Some("edge-a"), None);
        assert_eq!(kinds(&f), vec![FindingKind::Paused, FindingKind::SlotDrift]);
        assert_eq!(f[0].text, "Paused for 3 h.");
        assert_eq!(
            f[1].text,
            "Worker edge-a ran with 8 slots while the autoscaler assumed 16 for 40 min."
        );
        assert_eq!(
            findings(&t, HistoryRange::OneDay, None, None)[1].text,
            "A worker ran with 8 slots while the autoscaler assumed 16 for 40 min."
        );
        assert_eq!(tiles(&t).paused_seconds, Some(3 * 3600));
        let held = RangeTotals {
            held_back_ms: 40 * 60_000,
            peak_held_tasks: 12,
            ..totals(86_400_000)
        };
        let f = findings(&held, HistoryRange::OneDay, None, None);
        assert_eq!(
            f[0].text,
            "Held below its maximum by Airflow for 40 min: up to 12 tasks waited as scheduled."
        );
        assert_eq!(tiles(&held).held_back_seconds, Some(2400));
        // Below the range's threshold (15 min on a day): neither.
        let short = RangeTotals {
            paused_ms: 15 * 60_000 - 1,
            slot_drift_ms: 15 * 60_000 - 1,
            ..t
        };
        assert_eq!(
            kinds(&findings(&short, HistoryRange::OneDay, None, None)),
            vec![FindingKind::WithinRange]
        );
    }

    #[test]
    fn oscillation_reads_like_seed_002s_check() {
        let o = Oscillation {
            changes: 8,
            reversals: 5,
            lowest_backlog: 7,
            highest_backlog: 9,
            sync_slots: 4,
            kind: DecisionKind::Workers,
        };
        let f = findings(&totals(3_600_000), HistoryRange::OneHour, None, Some(&o));
        assert_eq!(kinds(&f), vec![FindingKind::Oscillation]);
        assert_eq!(
            f[0].text,
            "Oscillated: 8 worker count changes within an hour, turning back 5 times, while the \
             backlog stayed between 7 and 9 slots, within one worker's 4 slots."
        );
    }

    #[test]
    fn a_fixed_size_pool_reads_its_share_of_slots_not_at_maximum() {
        let fixed = RangeTotals {
            min_replicas: 4,
            max_replicas: 4,
            sync_slots: 4,
            // 16 slots offered for an hour, 35 % of them busy.
            busy_counted_ms: 3_600_000,
            busy_slot_ms: 16 * 3_600_000 * 35 / 100,
            running_ms: 3_600_000,
            below_minimum_ms: 3_600_000,
            ..totals(3_600_000)
        };
        let f = findings(&fixed, HistoryRange::OneHour, None, None);
        assert_eq!(
            kinds(&f),
            vec![FindingKind::FixedSize],
            "no below-minimum either"
        );
        assert_eq!(
            f[0].text,
            "Fixed at 4 workers (16 slots): 35% of its slots ran tasks."
        );
        let short = RangeTotals {
            at_maximum_ms: 12 * 60_000,
            ..fixed.clone()
        };
        let f = findings(&short, HistoryRange::OneHour, None, None);
        assert_eq!(
            kinds(&f),
            vec![FindingKind::FixedSize, FindingKind::AtMaximum]
        );
        assert_eq!(
            f[1].text,
            "The backlog needed more than its 4 workers for 12 min."
        );
        let unknown = RangeTotals {
            busy_counted_ms: 0,
            busy_slot_ms: 0,
            ..fixed
        };
        assert_eq!(
            findings(&unknown, HistoryRange::OneHour, None, None)[0].text,
            "Fixed at 4 workers (16 slots).",
            "recorded before the slots were counted"
        );
    }

    #[test]
    fn no_data_no_findings_and_null_tiles() {
        let empty = RangeTotals::default();
        assert!(findings(&empty, HistoryRange::OneDay, None, None).is_empty());
        assert_eq!(
            tiles(&empty),
            Tiles {
                peak_wanted: None,
                at_maximum_seconds: None,
                waiting_for_capacity_seconds: None,
                paused_seconds: None,
                held_back_seconds: None,
            }
        );
        let no_pods = totals(1000);
        let tiles = tiles(&no_pods);
        assert_eq!(tiles.at_maximum_seconds, Some(0));
        assert_eq!(
            tiles.waiting_for_capacity_seconds, None,
            "no source for waiting"
        );
    }

    #[test]
    fn the_ninety_percent_rule_is_exact() {
        let floor = HistoryRange::OneDay.running_floor_ms();
        let with = |running_ms, below_minimum_ms| RangeTotals {
            running_ms,
            below_minimum_ms,
            ..totals(86_400_000)
        };
        // Exactly 90 % at exactly the floor.
        let f = findings(
            &with(floor, floor / 10 * 9),
            HistoryRange::OneDay,
            None,
            None,
        );
        assert_eq!(kinds(&f), vec![FindingKind::BelowMinimum]);
        assert!(f[0].text.contains("for 90%"), "{}", f[0].text);
        // Just under 90 %.
        let f = findings(
            &with(floor, floor / 10 * 9 - 1),
            HistoryRange::OneDay,
            None,
            None,
        );
        assert_eq!(kinds(&f), vec![FindingKind::WithinRange]);
        // 100 % but 1 ms short of the running floor.
        let f = findings(
            &with(floor - 1, floor - 1),
            HistoryRange::OneDay,
            None,
            None,
        );
        assert_eq!(kinds(&f), vec![FindingKind::WithinRange]);
        // The floor scales: 15 minutes of running is enough on a 1 h range (5 min floor).
        let f = findings(
            &with(15 * 60_000, 15 * 60_000),
            HistoryRange::OneHour,
            None,
            None,
        );
        assert_eq!(kinds(&f), vec![FindingKind::BelowMinimum]);
        assert!(f[0].text.contains("for 100%"));
    }

    #[test]
    fn whole_seconds_round_to_nearest() {
        assert_eq!(whole_seconds(37_500), 38);
        assert_eq!(whole_seconds(37_499), 37);
        assert_eq!(whole_seconds(0), 0);
    }
}
