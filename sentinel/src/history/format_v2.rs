//! Reading history files of format 2, the one before the bucket counted the backlog's drain
//! and the slots that ran tasks: each bucket is read as it was and kept with those two
//! unknown (the page draws no drain rate there, a fixed-size pool's share leaves that time
//! out), so an upgrade keeps the 14 days recorded before it.
//!
//! Format 2 counted a fixed-size pool (min = max) as "at its maximum" all the time; format 3
//! counts the time its backlog wanted more workers than it has. What format 2 counted says
//! nothing of that, so such a bucket's at-maximum time is read as 0.

use super::decisions::DecisionLog;
use super::tier::{Bucket, MaybeCount, Peaks, Tier, TierSpec, UNKNOWN_SLOT_MS};
use super::worker_history::WorkerHistory;
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};

pub const FORMAT_VERSION: u32 = 2;

/// The payload of a format 2 file.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct SavedV2 {
    pub tiers: [TierSpec; 3],
    pub max_decisions: u32,
    pub workers: BTreeMap<String, WorkerHistoryV2>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct WorkerHistoryV2 {
    pub tiers: [TierV2; 3],
    pub decisions: DecisionLog,
    pub first_sample_ms: Option<u64>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct TierV2 {
    pub buckets: VecDeque<BucketV2>,
}

/// [`Bucket`] as format 2 wrote it: the same fields in the same order, without `drained` and
/// `busy_slot_ms`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub struct BucketV2 {
    pub start_s: u32,
    pub observed_ms: u32,
    pub at_maximum_ms: u32,
    pub waiting_ms: u32,
    pub running_ms: u32,
    pub below_minimum_ms: u32,
    pub paused_ms: u32,
    pub slot_drift_ms: u32,
    pub drift_slots: MaybeCount,
    pub held_back_ms: u32,
    pub peak: Peaks,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub sync_slots: u32,
}

impl From<BucketV2> for Bucket {
    fn from(b: BucketV2) -> Bucket {
        let fixed_size = b.min_replicas == b.max_replicas;
        Bucket {
            start_s: b.start_s,
            observed_ms: b.observed_ms,
            at_maximum_ms: if fixed_size { 0 } else { b.at_maximum_ms },
            waiting_ms: b.waiting_ms,
            running_ms: b.running_ms,
            below_minimum_ms: b.below_minimum_ms,
            paused_ms: b.paused_ms,
            slot_drift_ms: b.slot_drift_ms,
            drift_slots: b.drift_slots,
            held_back_ms: b.held_back_ms,
            drained: MaybeCount::UNKNOWN,
            busy_slot_ms: UNKNOWN_SLOT_MS,
            peak: b.peak,
            min_replicas: b.min_replicas,
            max_replicas: b.max_replicas,
            sync_slots: b.sync_slots,
        }
    }
}

impl From<WorkerHistoryV2> for WorkerHistory {
    fn from(h: WorkerHistoryV2) -> WorkerHistory {
        let tiers = h
            .tiers
            .map(|t| Tier::from_buckets(t.buckets.into_iter().map(Bucket::from).collect()));
        WorkerHistory::from_parts(tiers, h.decisions, h.first_sample_ms)
    }
}
