//! What held a worker back over a range, in the scaling history dialog's words, and the three
//! tiles. Computed from bucket totals, which are exact whatever the tier's width.
//!
//! * "Ran at its maximum of N workers for T." once at-maximum time reaches the range's
//!   threshold (15 min × range ÷ 1 day).
//! * "Workers waited for room on the cluster for T." the same for time with pending workers.
//! * "Needed fewer than its minimum of M workers for P% of the time it was running." when
//!   wanted < minimum for at least 90 % of the running time, and running time reaches
//!   2 h × range ÷ 1 day.
//! * Otherwise "Stayed within its range over this period."

use super::duration_text::human_duration;
use super::range::HistoryRange;
use super::tier::Bucket;
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
    pub peak_wanted: Option<u32>,
    /// The worker's range at the last bucket (what the text names).
    pub min_replicas: u32,
    pub max_replicas: u32,
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
            t.peak_wanted = Some(t.peak_wanted.unwrap_or(0).max(b.peak.wanted));
            t.min_replicas = b.min_replicas;
            t.max_replicas = b.max_replicas;
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
}

pub fn tiles(t: &RangeTotals) -> Tiles {
    let any = t.buckets > 0;
    Tiles {
        peak_wanted: t.peak_wanted,
        at_maximum_seconds: any.then(|| whole_seconds(t.at_maximum_ms)),
        waiting_for_capacity_seconds: t.waiting_ms.map(whole_seconds),
    }
}

/// The findings for `range`; empty when the range holds no data at all.
pub fn findings(t: &RangeTotals, range: HistoryRange) -> Vec<Finding> {
    if t.buckets == 0 {
        return Vec::new();
    }
    let threshold = range.finding_threshold_ms();
    let mut out = Vec::new();
    if t.at_maximum_ms >= threshold {
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
    if t.running_ms > 0
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
        let f = findings(&t, HistoryRange::FifteenMinutes);
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
            findings(&t, HistoryRange::OneDay)[0].text,
            "Needed fewer than its minimum of 2 workers for 95% of the time it was running."
        );
        let t = RangeTotals {
            max_replicas: 1,
            at_maximum_ms: 2 * 3_600_000,
            ..totals(86_400_000)
        };
        assert_eq!(
            findings(&t, HistoryRange::OneDay)[0].text,
            "Ran at its maximum of 1 worker for 2 h."
        );
        assert_eq!(
            findings(&totals(60_000), HistoryRange::OneDay),
            vec![Finding {
                kind: FindingKind::WithinRange,
                text: "Stayed within its range over this period.".into(),
                seconds: 60
            }]
        );
    }

    #[test]
    fn no_data_no_findings_and_null_tiles() {
        let empty = RangeTotals::default();
        assert!(findings(&empty, HistoryRange::OneDay).is_empty());
        assert_eq!(
            tiles(&empty),
            Tiles {
                peak_wanted: None,
                at_maximum_seconds: None,
                waiting_for_capacity_seconds: None
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
        let f = findings(&with(floor, floor / 10 * 9), HistoryRange::OneDay);
        assert_eq!(kinds(&f), vec![FindingKind::BelowMinimum]);
        assert!(f[0].text.contains("for 90%"), "{}", f[0].text);
        // Just under 90 %.
        let f = findings(&with(floor, floor / 10 * 9 - 1), HistoryRange::OneDay);
        assert_eq!(kinds(&f), vec![FindingKind::WithinRange]);
        // 100 % but 1 ms short of the running floor.
        let f = findings(&with(floor - 1, floor - 1), HistoryRange::OneDay);
        assert_eq!(kinds(&f), vec![FindingKind::WithinRange]);
        // The floor scales: 15 minutes of running is enough on a 1 h range (5 min floor).
        let f = findings(&with(15 * 60_000, 15 * 60_000), HistoryRange::OneHour);
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
