//! Everything recorded for one worker: its three tiers, its decision log, and since when.

use super::decisions::{DecisionLog, DecisionSource, DECISION_RETENTION_MS};
use super::range::HistoryRange;
use super::sample::Sample;
use super::tier::{Bucket, Tier, TierSpec, TIERS};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerHistory {
    /// In the order of [`TIERS`].
    tiers: [Tier; 3],
    decisions: DecisionLog,
    first_sample_ms: Option<u64>,
}

/// The buckets of one range, as of one moment.
pub struct RangeWindow<'a> {
    pub tier: TierSpec,
    /// Start of the first bucket the range covers.
    pub from_ms: u64,
    pub buckets: Vec<&'a Bucket>,
}

impl WorkerHistory {
    /// A history read from a file of an earlier format (checked with [`WorkerHistory::fits`]).
    pub fn from_parts(
        tiers: [Tier; 3],
        decisions: DecisionLog,
        first_sample_ms: Option<u64>,
    ) -> WorkerHistory {
        WorkerHistory {
            tiers,
            decisions,
            first_sample_ms,
        }
    }

    /// Records `sample`, taken at `at_ms` and standing for `weight_ms` of time.
    pub fn record(
        &mut self,
        at_ms: u64,
        sample: &Sample,
        weight_ms: u32,
        backlog_source: DecisionSource,
    ) {
        for (tier, spec) in self.tiers.iter_mut().zip(TIERS) {
            tier.add(spec, at_ms, sample, weight_ms);
        }
        self.decisions.observe(at_ms, sample, backlog_source);
        self.first_sample_ms.get_or_insert(at_ms);
    }

    /// The buckets of `range` ending with the one that holds `now_ms`: exactly as many
    /// buckets as the range spans, the last one still filling.
    pub fn window(&self, range: HistoryRange, now_ms: u64) -> RangeWindow<'_> {
        let spec = range.tier();
        let index = TIERS
            .iter()
            .position(|t| *t == spec)
            .expect("every range is answered by one of the tiers");
        let width = u64::from(spec.width_s);
        let last_start = now_ms / 1000 / width * width;
        let first_start = last_start.saturating_sub((range.buckets() - 1) * width);
        RangeWindow {
            tier: spec,
            from_ms: first_start * 1000,
            buckets: self.tiers[index].window(first_start, last_start).collect(),
        }
    }

    pub fn decisions(&self) -> &DecisionLog {
        &self.decisions
    }

    /// The first sample this history still covers: its first sample, or 14 days ago when that
    /// is older (what was before has been dropped).
    pub fn recording_since_ms(&self, now_ms: u64) -> Option<u64> {
        let kept_from = now_ms.saturating_sub(DECISION_RETENTION_MS);
        self.first_sample_ms.map(|first| first.max(kept_from))
    }

    /// Drops what is dated after `last_ms` (stamped by a clock that ran ahead); returns how
    /// many buckets and decisions went.
    pub fn drop_after(&mut self, last_ms: u64) -> usize {
        let last_start_s = u32::try_from(last_ms / 1000).unwrap_or(u32::MAX);
        let buckets: usize = self
            .tiers
            .iter_mut()
            .map(|t| t.drop_after(last_start_s))
            .sum();
        if self.first_sample_ms.is_some_and(|first| first > last_ms) {
            self.first_sample_ms = None;
        }
        buckets + self.decisions.drop_after(last_ms)
    }

    /// Whether a history read from disk has the shape this version writes.
    pub fn fits(&self) -> bool {
        self.tiers.iter().zip(TIERS).all(|(t, spec)| t.fits(spec)) && self.decisions.fits()
    }
}

#[cfg(test)]
mod tests {
    use super::super::findings::{findings, tiles, FindingKind, RangeTotals};
    use super::super::sample::tests::{sample, with_cluster};
    use super::*;

    /// Aligned to every tier's width, so each range's window is easy to reason about.
    const NOW_MS: u64 = 1_800_000_000_000;
    const API: DecisionSource = DecisionSource::AirflowApi;

    /// `total_ms` of `s`, in samples of at most `step_ms`, the last one at `NOW_MS` and the
    /// rest going back from it.
    fn feed_back_from_now(h: &mut WorkerHistory, s: &Sample, total_ms: u64, step_ms: u64) {
        let mut left = total_ms;
        let mut at = NOW_MS;
        while left > 0 {
            let weight = left.min(step_ms);
            h.record(at, s, weight as u32, API);
            left -= weight;
            at -= step_ms;
        }
    }

    fn kinds(h: &WorkerHistory, range: HistoryRange) -> Vec<FindingKind> {
        let w = h.window(range, NOW_MS);
        findings(&RangeTotals::of(w.buckets), range, None, None)
            .iter()
            .map(|f| f.kind)
            .collect()
    }

    /// A step that fits well inside each range's window and divides its threshold evenly.
    fn step_ms(range: HistoryRange) -> u64 {
        match range {
            HistoryRange::FifteenMinutes | HistoryRange::OneHour => 500,
            HistoryRange::SixHours | HistoryRange::OneDay => 5_000,
            HistoryRange::SevenDays | HistoryRange::FourteenDays => 60_000,
        }
    }

    #[test]
    fn at_maximum_becomes_a_finding_exactly_at_each_ranges_threshold() {
        for range in HistoryRange::ALL {
            let threshold = range.finding_threshold_ms();
            // A pool that otherwise sits well within its range for the whole period.
            let background = range.millis() / 2;
            for (at_max_ms, expected) in [
                (threshold - 1, FindingKind::WithinRange),
                (threshold, FindingKind::AtMaximum),
            ] {
                let mut h = WorkerHistory::default();
                feed_back_from_now(&mut h, &sample(8), background, step_ms(range));
                feed_back_from_now(&mut h, &sample(20), at_max_ms, step_ms(range));
                let w = h.window(range, NOW_MS);
                let t = RangeTotals::of(w.buckets);
                assert_eq!(t.at_maximum_ms, at_max_ms, "{}", range.as_str());
                let f = findings(&t, range, None, None);
                assert_eq!(f[0].kind, expected, "{} at {at_max_ms} ms", range.as_str());
                if expected == FindingKind::AtMaximum {
                    assert!(f[0]
                        .text
                        .starts_with("Ran at its maximum of 5 workers for "));
                }
            }
        }
    }

    #[test]
    fn waiting_for_capacity_becomes_a_finding_exactly_at_each_ranges_threshold() {
        for range in HistoryRange::ALL {
            let threshold = range.finding_threshold_ms();
            for (waiting_ms, expected) in [
                (threshold - 1, vec![FindingKind::WithinRange]),
                (threshold, vec![FindingKind::WaitingForCapacity]),
            ] {
                let mut h = WorkerHistory::default();
                let fitting = with_cluster(sample(12), 3, 3, 0);
                let waiting = with_cluster(sample(12), 3, 2, 1);
                feed_back_from_now(&mut h, &fitting, range.millis() / 2, step_ms(range));
                feed_back_from_now(&mut h, &waiting, waiting_ms, step_ms(range));
                assert_eq!(kinds(&h, range), expected, "{}", range.as_str());
                let w = h.window(range, NOW_MS);
                let t = tiles(&RangeTotals::of(w.buckets));
                assert_eq!(
                    t.waiting_for_capacity_seconds,
                    Some((waiting_ms + 500) / 1000)
                );
            }
        }
    }

    #[test]
    fn below_minimum_needs_ninety_percent_and_the_running_floor_on_each_range() {
        for range in HistoryRange::ALL {
            let floor = range.running_floor_ms();
            let mut idle_at_min = with_cluster(sample(0), 2, 2, 0);
            idle_at_min.min_replicas = 2; // wanted 0 < 2, running
            let mut busy = with_cluster(sample(8), 2, 2, 0);
            busy.min_replicas = 2; // wanted 2, not below
            let check = |below_ms: u64, other_ms: u64, expected: FindingKind| {
                let mut h = WorkerHistory::default();
                feed_back_from_now(&mut h, &busy, other_ms, step_ms(range));
                feed_back_from_now(&mut h, &idle_at_min, below_ms, step_ms(range));
                assert_eq!(
                    kinds(&h, range),
                    vec![expected],
                    "{}: {below_ms} of {}",
                    range.as_str(),
                    below_ms + other_ms
                );
            };
            // At the floor, exactly 90 %.
            check(floor / 10 * 9, floor / 10, FindingKind::BelowMinimum);
            // At the floor, just under 90 %.
            check(
                floor / 10 * 9 - step_ms(range),
                floor / 10 + step_ms(range),
                FindingKind::WithinRange,
            );
            // 100 % of the running time, one step short of the floor.
            check(floor - step_ms(range), 0, FindingKind::WithinRange);
        }
    }

    #[test]
    fn idle_at_zero_is_not_running_time() {
        let mut h = WorkerHistory::default();
        let mut idle = with_cluster(sample(0), 0, 0, 0);
        idle.min_replicas = 0;
        feed_back_from_now(&mut h, &idle, 3_600_000, 5_000);
        let t = RangeTotals::of(h.window(HistoryRange::OneDay, NOW_MS).buckets);
        assert_eq!((t.observed_ms, t.running_ms), (3_600_000, 0));
    }

    #[test]
    fn each_range_covers_its_span_with_its_tiers_points() {
        let mut h = WorkerHistory::default();
        // 14 days of samples every 10 s (fills every bucket of every tier).
        let mut at = NOW_MS - 14 * 86_400_000 + 10_000;
        while at <= NOW_MS {
            h.record(at, &sample(8), 10_000, API);
            at += 10_000;
        }
        for range in HistoryRange::ALL {
            let w = h.window(range, NOW_MS);
            assert_eq!(
                w.buckets.len() as u64,
                range.buckets(),
                "{}",
                range.as_str()
            );
            assert_eq!(
                NOW_MS - w.from_ms,
                range.millis() - u64::from(w.tier.width_s) * 1000
            );
            let t = RangeTotals::of(w.buckets);
            // The same period reads the same from every tier (the last bucket holds one sample).
            assert_eq!(
                t.observed_ms,
                range.millis() - u64::from(w.tier.width_s) * 1000 + 10_000,
                "{}",
                range.as_str()
            );
        }
        assert!(h.fits());
        assert_eq!(
            h.recording_since_ms(NOW_MS),
            Some(NOW_MS - 14 * 86_400_000 + 10_000)
        );
        assert_eq!(
            h.recording_since_ms(NOW_MS + 86_400_000),
            Some(NOW_MS - 13 * 86_400_000),
            "a day later the first day is gone"
        );
    }
}
