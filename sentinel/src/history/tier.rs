//! Downsampled storage: a tier is a run of equal-width buckets covering a fixed span, oldest
//! dropped first. Every sample goes into all three tiers at once, so each range is answered
//! from one tier with exact totals, never from a tier built out of another:
//!
//! | tier     | bucket | keeps   | answers      | points       |
//! | -------- | ------ | ------- | ------------ | ------------ |
//! | `FINE`   | 10 s   | 1 hour  | 15m, 1h      | 90, 360      |
//! | `MINUTE` | 60 s   | 1 day   | 6h, 1d       | 360, 1440    |
//! | `COARSE` | 30 min | 14 days | 7d, 14d      | 336, 672     |
//!
//! A bucket keeps how long each state lasted (milliseconds, so the scaled thresholds such as
//! 9.375 s stay exact) and the peak of each line; only buckets that received a sample exist,
//! so a gap in the data is a missing point, never a 0.

use super::sample::Sample;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSpec {
    pub width_s: u32,
    /// Buckets kept: the tier's span divided by `width_s`.
    pub capacity: usize,
}

pub const FINE: TierSpec = TierSpec {
    width_s: 10,
    capacity: 360,
};
pub const MINUTE: TierSpec = TierSpec {
    width_s: 60,
    capacity: 1440,
};
pub const COARSE: TierSpec = TierSpec {
    width_s: 1800,
    capacity: 672,
};
pub const TIERS: [TierSpec; 3] = [FINE, MINUTE, COARSE];

/// `busy_slot_ms` of a bucket that did not count it.
pub const UNKNOWN_SLOT_MS: u64 = u64::MAX;

/// A line that may have no source (the Kubernetes side): `u32::MAX` stands for "unknown", so
/// the four such lines cost 16 bytes a bucket rather than 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaybeCount(u32);

impl MaybeCount {
    pub const UNKNOWN: MaybeCount = MaybeCount(u32::MAX);

    pub fn new(value: Option<u32>) -> MaybeCount {
        // A real u32::MAX pods is not a case; it is kept just below the marker.
        value.map_or(MaybeCount::UNKNOWN, |v| MaybeCount(v.min(u32::MAX - 1)))
    }

    pub fn get(self) -> Option<u32> {
        (self != MaybeCount::UNKNOWN).then_some(self.0)
    }

    /// The larger of two known values; unknown only when both are.
    fn peak(self, other: MaybeCount) -> MaybeCount {
        match (self.get(), other.get()) {
            (Some(a), Some(b)) => MaybeCount(a.max(b)),
            (Some(_), None) => self,
            (None, _) => other,
        }
    }
}

/// The highest value of each line within a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peaks {
    pub wanted: u32,
    pub desired_replicas: u32,
    pub backlog: u32,
    pub queued: u32,
    pub running_tasks: u32,
    pub held_tasks: u32,
    pub workers: MaybeCount,
    pub running: MaybeCount,
    pub waiting: MaybeCount,
    pub terminating: MaybeCount,
}

impl Peaks {
    fn of(s: &Sample) -> Peaks {
        Peaks {
            wanted: s.wanted,
            desired_replicas: s.desired_replicas,
            backlog: s.backlog,
            queued: s.queued,
            running_tasks: s.running_tasks,
            held_tasks: s.held_tasks,
            workers: MaybeCount::new(s.cluster.workers),
            running: MaybeCount::new(s.cluster.running),
            waiting: MaybeCount::new(s.cluster.waiting),
            terminating: MaybeCount::new(s.cluster.terminating),
        }
    }

    fn merge(&mut self, o: &Peaks) {
        self.wanted = self.wanted.max(o.wanted);
        self.desired_replicas = self.desired_replicas.max(o.desired_replicas);
        self.backlog = self.backlog.max(o.backlog);
        self.queued = self.queued.max(o.queued);
        self.running_tasks = self.running_tasks.max(o.running_tasks);
        self.held_tasks = self.held_tasks.max(o.held_tasks);
        self.workers = self.workers.peak(o.workers);
        self.running = self.running.peak(o.running);
        self.waiting = self.waiting.peak(o.waiting);
        self.terminating = self.terminating.peak(o.terminating);
    }
}

/// One bucket: how long each state lasted within it, and the peak of each line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Unix seconds at which the bucket starts (a multiple of the tier's width).
    pub start_s: u32,
    pub observed_ms: u32,
    pub at_maximum_ms: u32,
    /// Time with workers waiting for capacity; counted only while `waiting` is known.
    pub waiting_ms: u32,
    pub running_ms: u32,
    pub below_minimum_ms: u32,
    /// Time with scaling paused on purpose (counted in none of the states above).
    pub paused_ms: u32,
    /// Time with a worker running with other slots than the pool's `syncSlots`.
    pub slot_drift_ms: u32,
    /// The slots of the drifting worker at the bucket's last drift; `UNKNOWN` when none drifted.
    pub drift_slots: MaybeCount,
    /// Time with tasks held in `scheduled` by Airflow while below the maximum.
    pub held_back_ms: u32,
    /// The backlog's falls between refreshes while the pool ran, summed (task slots); unknown
    /// in buckets loaded from a file of format 2, which did not count them.
    pub drained: MaybeCount,
    /// Σ running task slots × time, outside paused time: how much of the pool's slots ran
    /// tasks. [`UNKNOWN_SLOT_MS`] in buckets loaded from a file of format 2.
    pub busy_slot_ms: u64,
    pub peak: Peaks,
    /// The worker's range and slots at the bucket's last sample.
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub sync_slots: u32,
}

impl Bucket {
    fn new(start_s: u32, s: &Sample) -> Bucket {
        Bucket {
            start_s,
            observed_ms: 0,
            at_maximum_ms: 0,
            waiting_ms: 0,
            running_ms: 0,
            below_minimum_ms: 0,
            paused_ms: 0,
            slot_drift_ms: 0,
            drift_slots: MaybeCount::UNKNOWN,
            held_back_ms: 0,
            drained: MaybeCount::new(Some(0)),
            busy_slot_ms: 0,
            peak: Peaks::of(s),
            min_replicas: s.min_replicas,
            max_replicas: s.max_replicas,
            sync_slots: s.sync_slots,
        }
    }

    fn add(&mut self, s: &Sample, weight_ms: u32) {
        let when = |state: bool| if state { weight_ms } else { 0 };
        self.observed_ms = self.observed_ms.saturating_add(weight_ms);
        self.at_maximum_ms = self.at_maximum_ms.saturating_add(when(s.at_maximum()));
        self.waiting_ms = self
            .waiting_ms
            .saturating_add(when(s.waiting_for_capacity() == Some(true)));
        self.running_ms = self.running_ms.saturating_add(when(s.is_running()));
        self.below_minimum_ms = self
            .below_minimum_ms
            .saturating_add(when(s.below_minimum_while_running()));
        self.paused_ms = self.paused_ms.saturating_add(when(s.paused));
        self.slot_drift_ms = self
            .slot_drift_ms
            .saturating_add(when(s.slot_drift.is_some()));
        self.held_back_ms = self
            .held_back_ms
            .saturating_add(when(s.held_below_maximum()));
        if let Some(slots) = s.slot_drift {
            self.drift_slots = MaybeCount::new(Some(slots));
        }
        if let (Some(total), Some(fell)) = (self.drained.get(), s.drained) {
            self.drained = MaybeCount::new(Some(total.saturating_add(fell)));
        }
        if self.busy_slot_ms != UNKNOWN_SLOT_MS && !s.paused {
            let busy = u64::from(s.running_slots) * u64::from(weight_ms);
            self.busy_slot_ms = self
                .busy_slot_ms
                .saturating_add(busy)
                .min(UNKNOWN_SLOT_MS - 1);
        }
        self.peak.merge(&Peaks::of(s));
        self.min_replicas = s.min_replicas;
        self.max_replicas = s.max_replicas;
        self.sync_slots = s.sync_slots;
    }
}

/// The buckets of one tier, oldest first, each start unique and increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tier {
    buckets: VecDeque<Bucket>,
}

impl Tier {
    /// A tier of `buckets` read from a file (checked with [`Tier::fits`] afterwards).
    pub fn from_buckets(buckets: VecDeque<Bucket>) -> Tier {
        Tier { buckets }
    }

    /// Adds `sample`, which stands for `weight_ms` of time, to the bucket holding `at_ms`.
    pub fn add(&mut self, spec: TierSpec, at_ms: u64, sample: &Sample, weight_ms: u32) {
        let width = u64::from(spec.width_s);
        let start_s = u32::try_from(at_ms / 1000 / width * width).unwrap_or(u32::MAX);
        let span_s = u64::from(spec.width_s) * spec.capacity as u64;
        let mut newest = self
            .buckets
            .back()
            .map_or(start_s, |b| b.start_s.max(start_s));
        if u64::from(start_s) + span_s <= u64::from(newest) {
            // The wall clock went back further than this tier keeps: the buckets ahead of it
            // were stamped by a clock that ran ahead. Keeping them would drop every sample
            // until the clock caught up with them — a frozen tier — so they go instead.
            self.drop_after(start_s);
            newest = start_s;
        }
        // Drop what falls out of the span before adding, so the length never passes capacity.
        while self
            .buckets
            .front()
            .is_some_and(|b| u64::from(b.start_s) + span_s <= u64::from(newest))
        {
            self.buckets.pop_front();
        }
        // The bound is a fixed allocation, not whatever doubling would reach.
        if self.buckets.capacity() < spec.capacity {
            self.buckets
                .reserve_exact(spec.capacity.saturating_sub(self.buckets.len()));
        }
        let index = self.buckets.partition_point(|b| b.start_s < start_s);
        match self.buckets.get_mut(index) {
            Some(bucket) if bucket.start_s == start_s => bucket.add(sample, weight_ms),
            _ => {
                let mut bucket = Bucket::new(start_s, sample);
                bucket.add(sample, weight_ms);
                // Only a wall clock that stepped back inserts anywhere but at the end.
                self.buckets.insert(index, bucket);
            }
        }
    }

    /// Drops the buckets that start after `last_start_s`; returns how many.
    pub fn drop_after(&mut self, last_start_s: u32) -> usize {
        let kept = self.buckets.partition_point(|b| b.start_s <= last_start_s);
        let dropped = self.buckets.len() - kept;
        self.buckets.truncate(kept);
        dropped
    }

    /// The buckets starting within `first_start_s..=last_start_s`, oldest first.
    pub fn window(&self, first_start_s: u64, last_start_s: u64) -> impl Iterator<Item = &Bucket> {
        let from = self
            .buckets
            .partition_point(|b| u64::from(b.start_s) < first_start_s);
        self.buckets
            .range(from..)
            .take_while(move |b| u64::from(b.start_s) <= last_start_s)
    }

    /// Whether every bucket is a well-formed member of `spec` (for a file read from disk).
    pub fn fits(&self, spec: TierSpec) -> bool {
        self.buckets.len() <= spec.capacity
            && self.buckets.iter().all(|b| b.start_s % spec.width_s == 0)
            && self
                .buckets
                .iter()
                .zip(self.buckets.iter().skip(1))
                .all(|(a, b)| a.start_s < b.start_s)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::tests::{sample, with_cluster};
    use super::*;

    const T0_MS: u64 = 1_800_000_000_000;

    #[test]
    fn samples_in_one_bucket_add_their_time_and_keep_peaks() {
        let mut tier = Tier::default();
        tier.add(FINE, T0_MS, &sample(20), 2000);
        tier.add(FINE, T0_MS + 2000, &with_cluster(sample(4), 3, 2, 1), 2000);
        tier.add(FINE, T0_MS + 4000, &sample(8), 2000);
        let buckets: Vec<_> = tier.window(0, u64::MAX).collect();
        assert_eq!(buckets.len(), 1);
        let b = buckets[0];
        assert_eq!(b.observed_ms, 6000);
        assert_eq!(
            b.at_maximum_ms, 2000,
            "only the first sample asked for 5 of 5"
        );
        assert_eq!(b.waiting_ms, 2000);
        assert_eq!(b.running_ms, 6000);
        assert_eq!(b.peak.wanted, 5);
        assert_eq!(b.peak.backlog, 20);
        assert_eq!(b.peak.workers.get(), Some(3));
        assert_eq!(b.peak.waiting.get(), Some(1));
        assert_eq!(
            (b.paused_ms, b.slot_drift_ms, b.drift_slots.get()),
            (0, 0, None)
        );
        // 10 running slots for 2 s, 2 for 2 s, 4 for 2 s.
        assert_eq!(b.busy_slot_ms, (10 + 2 + 4) * 2000);
        assert_eq!(
            b.drained.get(),
            Some(0),
            "no sample knew its previous backlog"
        );
    }

    #[test]
    fn drained_adds_the_falls_and_busy_time_leaves_paused_time_out() {
        let mut tier = Tier::default();
        let running = |backlog| with_cluster(sample(backlog), 3, 3, 0);
        tier.add(FINE, T0_MS, &running(12).after(None), 2000);
        tier.add(FINE, T0_MS + 2000, &running(8).after(Some(12)), 2000);
        tier.add(FINE, T0_MS + 4000, &running(9).after(Some(8)), 2000);
        tier.add(FINE, T0_MS + 6000, &running(5).after(Some(9)), 2000);
        let mut paused = running(4);
        paused.paused = true;
        tier.add(FINE, T0_MS + 8000, &paused, 2000);
        let b = tier.window(0, u64::MAX).next().unwrap();
        assert_eq!(b.drained.get(), Some(8), "12 to 8, 8 to 9, 9 to 5");
        assert_eq!(
            b.busy_slot_ms,
            (6 + 4 + 5 + 3) * 2000,
            "the paused sample left out"
        );
    }

    #[test]
    fn paused_and_drifting_time_add_up_apart_from_the_other_states() {
        let mut tier = Tier::default();
        let mut paused = sample(20);
        paused.paused = true;
        tier.add(FINE, T0_MS, &paused, 2000);
        let mut drifting = sample(20);
        drifting.slot_drift = Some(8);
        tier.add(FINE, T0_MS + 2000, &drifting, 3000);
        let b = tier.window(0, u64::MAX).next().unwrap();
        assert_eq!(b.paused_ms, 2000);
        assert_eq!(
            b.at_maximum_ms, 3000,
            "the paused sample at 5 of 5 is not at its maximum"
        );
        assert_eq!(b.running_ms, 3000);
        assert_eq!((b.slot_drift_ms, b.drift_slots.get()), (3000, Some(8)));
    }

    #[test]
    fn keeps_its_span_and_no_more() {
        let mut tier = Tier::default();
        for i in 0..(FINE.capacity as u64 + 50) {
            tier.add(FINE, T0_MS + i * 10_000, &sample(4), 10_000);
        }
        let all: Vec<_> = tier.window(0, u64::MAX).collect();
        assert_eq!(all.len(), FINE.capacity);
        assert_eq!(
            u64::from(all[0].start_s),
            T0_MS / 1000 + 50 * 10,
            "the oldest 50 dropped"
        );
        assert_eq!(tier.buckets.capacity(), FINE.capacity, "fixed allocation");
        assert!(tier.fits(FINE));
    }

    #[test]
    fn a_gap_leaves_no_bucket_and_an_old_sample_fills_its_place() {
        let mut tier = Tier::default();
        tier.add(FINE, T0_MS, &sample(4), 10_000);
        tier.add(FINE, T0_MS + 60_000, &sample(4), 10_000);
        let starts: Vec<u64> = tier
            .window(0, u64::MAX)
            .map(|b| u64::from(b.start_s))
            .collect();
        assert_eq!(starts, vec![T0_MS / 1000, T0_MS / 1000 + 60]);
        // The wall clock stepped back 30 s: the sample lands where it belongs.
        tier.add(FINE, T0_MS + 30_000, &sample(4), 10_000);
        assert_eq!(tier.window(0, u64::MAX).count(), 3);
        assert!(tier.fits(FINE));
    }

    #[test]
    fn a_clock_that_went_back_further_than_the_span_does_not_freeze_the_tier() {
        let mut tier = Tier::default();
        // Stamped by a clock a day ahead.
        tier.add(FINE, T0_MS + 86_400_000, &sample(4), 10_000);
        for i in 0..3 {
            tier.add(FINE, T0_MS + i * 10_000, &sample(4), 10_000);
        }
        let starts: Vec<u64> = tier
            .window(0, u64::MAX)
            .map(|b| u64::from(b.start_s))
            .collect();
        assert_eq!(
            starts,
            vec![T0_MS / 1000, T0_MS / 1000 + 10, T0_MS / 1000 + 20],
            "recording goes on; the bucket from the clock ahead is gone"
        );
        assert!(tier.fits(FINE));
        assert_eq!(tier.drop_after((T0_MS / 1000 + 10) as u32), 1);
        assert_eq!(tier.window(0, u64::MAX).count(), 2);
    }

    #[test]
    fn window_selects_by_start() {
        let mut tier = Tier::default();
        for i in 0..10 {
            tier.add(MINUTE, T0_MS + i * 60_000, &sample(4), 60_000);
        }
        let t0 = T0_MS / 1000;
        assert_eq!(tier.window(t0 + 120, t0 + 300).count(), 4);
        assert_eq!(tier.window(t0 + 121, t0 + 300).count(), 3);
    }

    #[test]
    fn unknown_is_kept_apart_from_zero() {
        assert_eq!(MaybeCount::new(None).get(), None);
        assert_eq!(MaybeCount::new(Some(0)).get(), Some(0));
        assert_eq!(
            MaybeCount::new(None).peak(MaybeCount::new(Some(0))).get(),
            Some(0)
        );
        assert_eq!(
            MaybeCount::new(Some(u32::MAX)).get(),
            Some(u32::MAX - 1),
            "never read back as unknown"
        );
    }
}
