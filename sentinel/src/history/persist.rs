//! Keeping the history across restarts (`history.path`): saved every minute and on shutdown,
//! loaded at start.
//!
//! The file is `ASTROHST`, a format version (u32, little endian), the SHA-256 of the payload
//! and the payload: the tier layout, every worker's history and the [`SavedLogs`] (recent cold
//! starts, the pre-warm log) in postcard (a compact serde
//! format with a stable, documented wire format, maintained; bincode's development has ceased,
//! RUSTSEC-2025-0141). Writing goes to a temporary file in the same folder, synced, then renamed over
//! the old one, so a crash leaves the old file or the new one, never half of one. A file that
//! is corrupt, from another format version or with another tier layout is logged and ignored:
//! the Sentinel starts with an empty history rather than a wrong one (and never fails to
//! start because of it).
//!
//! Two guards on loading: a file larger than the configured workers' history can ever take
//! ([`max_file_bytes`]) is not read at all, so a wrong or hostile file cannot exhaust the
//! Sentinel's memory; and what the file dates more than [`FUTURE_TOLERANCE`] after now (saved
//! by a clock that ran ahead) is dropped, as it would otherwise hold its place at the head of
//! every tier.

use super::decisions::MAX_DECISIONS;
use super::format_v2::{self, SavedV2};
use super::pre_warm_log::MAX_PRE_WARM_ENTRIES;
use super::saved_logs::SavedLogs;
use super::store::{History, HistoryData};
use super::tier::{TierSpec, TIERS};
use super::worker_history::WorkerHistory;
use crate::config::file::WorkerConfig;
use crate::pool::cold_start::tracker::KEPT_PER_POOL;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const MAGIC: &[u8; 8] = b"ASTROHST";
/// Bumped whenever the payload's types change shape (2: a bucket keeps paused time, held-back
/// tasks and slot drift; 3: the backlog's drain and the slots that ran tasks; 4: the cold starts
/// and the pre-warm log). Files of the two previous formats are read too ([`format_v2`], and 3
/// without the logs).
const FORMAT_VERSION: u32 = 4;
const FORMAT_V3: u32 = 3;
const HEADER_LEN: usize = MAGIC.len() + 4 + 32;
pub const SAVE_INTERVAL: Duration = Duration::from_secs(60);
/// How far past now a loaded bucket or decision may be dated: clocks of two nodes disagree a
/// little, never by this much.
pub const FUTURE_TOLERANCE: Duration = Duration::from_secs(300);

/// The most bytes one worker's history can take in the file: every bucket of every tier and
/// every decision present, each integer at postcard's longest (5 bytes a u32, 10 a u64), and
/// room for the worker's name and the lengths. A bucket is 19 u32 and a u64; a decision a u64,
/// two enum tags and 8 u32.
const MAX_WORKER_BYTES: usize = (TIERS[0].capacity + TIERS[1].capacity + TIERS[2].capacity)
    * (19 * 5 + 10)
    + MAX_DECISIONS * (10 + 2 * 5 + 8 * 5)
    + KEPT_PER_POOL * MAX_COLD_START_BYTES
    + MAX_PRE_WARM_ENTRIES * MAX_PRE_WARM_ENTRY_BYTES
    + 1024;
/// A saved cold start: a Pod's name (at most 253 bytes) and at most six marks.
const MAX_COLD_START_BYTES: usize = 256 + 4 + 6 * (1 + 10 + 1) + 4;
/// A saved pre-warm entry: a DAG id (at most 250 bytes), two timestamps, its sentence (which
/// names the DAG) and a few numbers.
const MAX_PRE_WARM_ENTRY_BYTES: usize = 2 * 256 + 2 * 40 + 1024 + 64;

/// The largest file the history of `workers` configured workers can make.
pub fn max_file_bytes(workers: usize) -> usize {
    HEADER_LEN + workers.max(1) * MAX_WORKER_BYTES
}

/// The payload, written from a borrow of the data...
#[derive(Serialize)]
struct SavedRef<'a> {
    tiers: [TierSpec; 3],
    max_decisions: u32,
    workers: &'a BTreeMap<String, WorkerHistory>,
    logs: &'a SavedLogs,
}

/// ...and read back owned (the same fields in the same order: the same encoding).
#[derive(Deserialize)]
struct Saved {
    tiers: [TierSpec; 3],
    max_decisions: u32,
    workers: BTreeMap<String, WorkerHistory>,
    logs: SavedLogs,
}

/// Format 3: the same without the logs.
#[derive(Deserialize)]
struct SavedV3 {
    tiers: [TierSpec; 3],
    max_decisions: u32,
    workers: BTreeMap<String, WorkerHistory>,
}

pub fn encode(data: &HistoryData) -> Vec<u8> {
    encode_parts(&data.workers, &data.logs)
}

fn encode_parts(workers: &BTreeMap<String, WorkerHistory>, logs: &SavedLogs) -> Vec<u8> {
    let payload = postcard::to_stdvec(&SavedRef {
        tiers: TIERS,
        max_decisions: MAX_DECISIONS as u32,
        workers,
        logs,
    })
    .expect("plain structs serialise");
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

/// Why a file was not used, in one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a history file (bad header)")]
    NotAHistoryFile,
    #[error(
        "written in format version {found}, this Sentinel reads versions {oldest} to {FORMAT_VERSION}",
        found = .0,
        oldest = format_v2::FORMAT_VERSION
    )]
    OtherVersion(u32),
    #[error("corrupt (checksum mismatch)")]
    Corrupt,
    #[error("unreadable payload: {0}")]
    Unreadable(String),
    #[error("written with another tier layout or decision bound")]
    OtherLayout,
}

pub fn decode(bytes: &[u8]) -> Result<HistoryData, DecodeError> {
    if bytes.len() < HEADER_LEN || &bytes[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::NotAHistoryFile);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if !(format_v2::FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(DecodeError::OtherVersion(version));
    }
    let (digest, payload) = bytes[12..].split_at(32);
    if Sha256::digest(payload).as_slice() != digest {
        return Err(DecodeError::Corrupt);
    }
    let unreadable = |e: postcard::Error| DecodeError::Unreadable(e.to_string());
    let saved: Saved = match version {
        format_v2::FORMAT_VERSION => {
            let v2: SavedV2 = postcard::from_bytes(payload).map_err(unreadable)?;
            Saved {
                tiers: v2.tiers,
                max_decisions: v2.max_decisions,
                workers: v2
                    .workers
                    .into_iter()
                    .map(|(name, h)| (name, WorkerHistory::from(h)))
                    .collect(),
                logs: SavedLogs::default(),
            }
        }
        FORMAT_V3 => {
            let v3: SavedV3 = postcard::from_bytes(payload).map_err(unreadable)?;
            Saved {
                tiers: v3.tiers,
                max_decisions: v3.max_decisions,
                workers: v3.workers,
                logs: SavedLogs::default(),
            }
        }
        _ => postcard::from_bytes(payload).map_err(unreadable)?,
    };
    if saved.tiers != TIERS
        || saved.max_decisions as usize != MAX_DECISIONS
        || !saved.workers.values().all(WorkerHistory::fits)
    {
        return Err(DecodeError::OtherLayout);
    }
    Ok(HistoryData {
        workers: saved.workers,
        logs: saved.logs,
    })
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, synced, renamed over it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut temporary = tempfile::Builder::new()
        .prefix(".history-")
        .tempfile_in(folder)?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    temporary.persist(path).map_err(|e| e.error)?;
    // The rename itself is durable once the folder is synced.
    std::fs::File::open(folder)?.sync_all()
}

/// The history saved at `path`, keeping only the configured workers and what is dated up to
/// `now_ms` (within [`FUTURE_TOLERANCE`]); empty when there is no file or it cannot be used
/// (logged).
pub fn load(path: &Path, workers: &[WorkerConfig], now_ms: u64) -> HistoryData {
    load_within(path, workers, now_ms, max_file_bytes(workers.len()))
}

fn load_within(
    path: &Path,
    workers: &[WorkerConfig],
    now_ms: u64,
    max_bytes: usize,
) -> HistoryData {
    let bytes = match read_at_most(path, max_bytes) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            tracing::warn!(
                path = %path.display(),
                max_bytes,
                workers = workers.len(),
                "history.path: the saved history is larger than the configured workers' history can be; \
                 not read, starting empty (it is replaced at the next save)"
            );
            return HistoryData::default();
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no saved history yet; recording from now");
            return HistoryData::default();
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the saved history; starting empty");
            return HistoryData::default();
        }
    };
    match decode(&bytes) {
        Ok(mut data) => {
            let before = data.workers.len();
            data.workers
                .retain(|name, _| workers.iter().any(|w| &w.name == name));
            let latest_ms = now_ms.saturating_add(FUTURE_TOLERANCE.as_millis() as u64);
            let from_the_future: usize = data
                .workers
                .values_mut()
                .map(|w| w.drop_after(latest_ms))
                .sum::<usize>()
                + data
                    .logs
                    .retain(|name| workers.iter().any(|w| w.name == name), latest_ms);
            if from_the_future > 0 {
                tracing::warn!(
                    path = %path.display(),
                    dropped = from_the_future,
                    "the saved history holds buckets and decisions dated after now (saved by a clock \
                     that ran ahead); they are dropped"
                );
            }
            tracing::info!(
                path = %path.display(),
                workers = data.workers.len(),
                dropped = before - data.workers.len(),
                "history loaded"
            );
            data
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "saved history ignored; starting empty (it is replaced at the next save)");
            HistoryData::default()
        }
    }
}

/// The bytes of `path`, or `None` when it holds more than `max_bytes` (then at most one byte
/// more is read).
fn read_at_most(path: &Path, max_bytes: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max_bytes as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() <= max_bytes).then_some(bytes))
}

/// Encodes under the history's lock and writes outside it, off the async threads.
async fn save(history: &Arc<History>, path: &Path) -> Result<(), String> {
    let history = history.clone();
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let logs = history.saved_logs();
        let bytes = history.with_data(|data| encode_parts(&data.workers, &logs));
        write_atomically(&path, &bytes).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Saves every [`SAVE_INTERVAL`] and once more when `shutdown` is cancelled.
pub async fn keep_saved(history: Arc<History>, path: PathBuf, shutdown: CancellationToken) {
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(SAVE_INTERVAL) => false,
            _ = shutdown.cancelled() => true,
        };
        match save(&history, &path).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(path = %path.display(), "history saved again");
            }
            Ok(()) => tracing::debug!(path = %path.display(), "history saved"),
            // Logged once per failing stretch, not every minute.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(path = %path.display(), %error, "cannot save the history; it stays in memory");
            }
            Err(_) => {}
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::decisions::DecisionSource;
    use super::super::sample::tests::{sample, with_cluster};
    use super::super::saved_logs::example;
    use super::*;

    const T0_MS: u64 = 1_800_000_000_000;
    /// An hour after [`data`] begins.
    const NOW_MS: u64 = T0_MS + 3_600_000;

    fn data() -> HistoryData {
        let mut h = WorkerHistory::default();
        for i in 0..500u64 {
            let s = if i % 50 < 25 {
                with_cluster(sample(20), 5, 4, 1)
            } else {
                sample(6)
            };
            h.record(T0_MS + i * 2000, &s, 2000, DecisionSource::Postgres);
        }
        let mut d = HistoryData::default();
        d.workers.insert("astro-worker-default".into(), h);
        d.workers
            .insert("astro-worker-etl".into(), WorkerHistory::default());
        d
    }

    fn workers(names: &[&str]) -> Vec<WorkerConfig> {
        names
            .iter()
            .map(|n| WorkerConfig {
                name: n.to_string(),
                queues: vec!["q".into()],
                sync_slots: 4,
                min_replicas: 1,
                max_replicas: 5,
                overprovision_slots: 0,
            })
            .collect()
    }

    fn temp_path(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{tag}.bin"));
        (dir, path)
    }

    #[test]
    fn round_trip_keeps_everything_of_configured_workers() {
        let original = data();
        assert_eq!(decode(&encode(&original)).unwrap(), original);
        let (_dir, path) = temp_path("round-trip");
        write_atomically(&path, &encode(&original)).unwrap();
        let loaded = load(&path, &workers(&["astro-worker-default"]), NOW_MS);
        assert_eq!(
            loaded.workers.len(),
            1,
            "a worker no longer configured is dropped"
        );
        assert_eq!(
            loaded.workers["astro-worker-default"],
            original.workers["astro-worker-default"]
        );
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    }

    #[test]
    fn a_bad_file_is_refused_with_its_reason() {
        let good = encode(&data());
        assert_eq!(decode(b"").unwrap_err(), DecodeError::NotAHistoryFile);
        assert_eq!(
            decode(b"{\"workers\": {}} not ours, but long enough to have a header").unwrap_err(),
            DecodeError::NotAHistoryFile
        );
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x01;
        assert_eq!(decode(&flipped).unwrap_err(), DecodeError::Corrupt);
        assert_eq!(
            decode(&good[..good.len() - 10]).unwrap_err(),
            DecodeError::Corrupt,
            "truncated"
        );
        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            decode(&newer).unwrap_err(),
            DecodeError::OtherVersion(FORMAT_VERSION + 1)
        );

        // A payload with a sound checksum but another tier layout.
        let mut tiers = TIERS;
        tiers[0].width_s = 5;
        let payload = postcard::to_stdvec(&SavedRef {
            tiers,
            max_decisions: MAX_DECISIONS as u32,
            workers: &BTreeMap::new(),
            logs: &SavedLogs::default(),
        })
        .unwrap();
        let mut other = good[..12].to_vec();
        other.extend_from_slice(&Sha256::digest(&payload));
        other.extend_from_slice(&payload);
        assert_eq!(decode(&other).unwrap_err(), DecodeError::OtherLayout);

        // Garbage with a sound checksum.
        let payload = vec![0xff; 64];
        let mut garbage = good[..12].to_vec();
        garbage.extend_from_slice(&Sha256::digest(&payload));
        garbage.extend_from_slice(&payload);
        assert!(matches!(
            decode(&garbage).unwrap_err(),
            DecodeError::Unreadable(_)
        ));
    }

    #[test]
    fn the_logs_round_trip_and_a_format_3_file_is_read_without_them() {
        let mut original = data();
        original.logs = example("astro-worker-default", T0_MS);
        assert_eq!(decode(&encode(&original)).unwrap(), original);

        #[derive(Serialize)]
        struct V3<'a> {
            tiers: [TierSpec; 3],
            max_decisions: u32,
            workers: &'a BTreeMap<String, WorkerHistory>,
        }
        let payload = postcard::to_stdvec(&V3 {
            tiers: TIERS,
            max_decisions: MAX_DECISIONS as u32,
            workers: &original.workers,
        })
        .unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&FORMAT_V3.to_le_bytes());
        bytes.extend_from_slice(&Sha256::digest(&payload));
        bytes.extend_from_slice(&payload);
        let read = decode(&bytes).unwrap();
        assert_eq!(read.workers, original.workers);
        assert_eq!(read.logs, SavedLogs::default());
    }

    #[test]
    fn loading_keeps_the_logs_of_configured_workers_up_to_now() {
        let (_dir, path) = temp_path("logs");
        let mut d = data();
        d.logs = example("astro-worker-default", T0_MS);
        let ahead = example(
            "astro-worker-default",
            NOW_MS + 2 * FUTURE_TOLERANCE.as_millis() as u64,
        );
        for (w, starts) in ahead.cold_starts {
            d.logs.cold_starts.get_mut(&w).unwrap().extend(starts);
        }
        for (w, entries) in ahead.pre_warm {
            d.logs.pre_warm.get_mut(&w).unwrap().extend(entries);
        }
        d.logs
            .pre_warm
            .extend(example("astro-worker-gone", T0_MS).pre_warm);
        write_atomically(&path, &encode(&d)).unwrap();
        let loaded = load(&path, &workers(&["astro-worker-default"]), NOW_MS);
        assert_eq!(loaded.logs, example("astro-worker-default", T0_MS));
    }

    #[test]
    fn a_file_of_the_previous_format_is_read_with_the_new_counts_unknown() {
        use super::super::decisions::DecisionLog;
        use super::super::format_v2::{BucketV2, TierV2, WorkerHistoryV2};
        use super::super::tier::{MaybeCount, Peaks, UNKNOWN_SLOT_MS};
        let peak = Peaks {
            wanted: 6,
            desired_replicas: 4,
            backlog: 24,
            queued: 8,
            running_tasks: 16,
            held_tasks: 0,
            workers: MaybeCount::new(Some(4)),
            running: MaybeCount::new(Some(4)),
            waiting: MaybeCount::UNKNOWN,
            terminating: MaybeCount::new(Some(0)),
        };
        let bucket = |start_s, min_replicas| BucketV2 {
            start_s,
            observed_ms: 10_000,
            at_maximum_ms: 10_000,
            waiting_ms: 0,
            running_ms: 10_000,
            below_minimum_ms: 0,
            paused_ms: 0,
            slot_drift_ms: 0,
            drift_slots: MaybeCount::UNKNOWN,
            held_back_ms: 0,
            peak,
            min_replicas,
            max_replicas: 4,
            sync_slots: 4,
        };
        let start_s = (T0_MS / 1000) as u32;
        let v2 = SavedV2 {
            tiers: TIERS,
            max_decisions: MAX_DECISIONS as u32,
            workers: BTreeMap::from([(
                "w".to_string(),
                WorkerHistoryV2 {
                    tiers: [
                        TierV2 {
                            buckets: [bucket(start_s, 1), bucket(start_s + 10, 4)].into(),
                        },
                        TierV2 {
                            buckets: Default::default(),
                        },
                        TierV2 {
                            buckets: Default::default(),
                        },
                    ],
                    decisions: DecisionLog::default(),
                    first_sample_ms: Some(T0_MS),
                },
            )]),
        };
        let payload = postcard::to_stdvec(&v2).unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&format_v2::FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&Sha256::digest(&payload));
        bytes.extend_from_slice(&payload);
        let data = decode(&bytes).unwrap();
        let window = data.workers["w"].window(
            super::super::range::HistoryRange::FifteenMinutes,
            T0_MS + 20_000,
        );
        let [scaled, fixed] = window.buckets.as_slice() else {
            panic!("two buckets: {}", window.buckets.len())
        };
        assert_eq!((scaled.peak, scaled.at_maximum_ms), (peak, 10_000));
        assert_eq!(scaled.drained, MaybeCount::UNKNOWN);
        assert_eq!(scaled.busy_slot_ms, UNKNOWN_SLOT_MS);
        assert_eq!(
            fixed.at_maximum_ms, 0,
            "format 2's always-at-maximum of a fixed-size pool says nothing"
        );
        // Saved again, it is format 3.
        assert_eq!(&encode(&data)[8..12], &FORMAT_VERSION.to_le_bytes());
    }

    #[test]
    fn loading_a_corrupt_or_missing_file_starts_empty() {
        let (_dir, path) = temp_path("corrupt");
        let all = workers(&["astro-worker-default"]);
        assert_eq!(
            load(&path, &all, NOW_MS),
            HistoryData::default(),
            "no file yet"
        );
        let mut bytes = encode(&data());
        bytes[HEADER_LEN + 3] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&path, &all, NOW_MS), HistoryData::default());
        // The next save replaces it.
        write_atomically(&path, &encode(&data())).unwrap();
        assert_eq!(load(&path, &all, NOW_MS).workers.len(), 1);
    }

    #[test]
    fn a_file_larger_than_the_workers_history_can_be_is_not_read() {
        let (_dir, path) = temp_path("large");
        let bytes = encode(&data());
        std::fs::write(&path, &bytes).unwrap();
        let all = workers(&["astro-worker-default"]);
        let loaded = load_within(&path, &all, NOW_MS, bytes.len());
        assert_eq!(loaded.workers.len(), 1, "at the cap");
        let refused = load_within(&path, &all, NOW_MS, bytes.len() - 1);
        assert_eq!(refused, HistoryData::default(), "over the cap");
    }

    #[test]
    fn the_cap_holds_a_worker_history_at_its_fullest() {
        // Every bucket of 14 days and every decision, with long numbers.
        let mut h = WorkerHistory::default();
        for i in 0..14 * 8640u64 {
            let (backlog, workers) = if i % 2 == 0 {
                (1, 7)
            } else {
                (u32::MAX / 2, u32::MAX / 4)
            };
            let s = with_cluster(sample(backlog), workers, workers, workers);
            h.record(
                T0_MS + i * 10_000,
                &s,
                u32::MAX / 2,
                DecisionSource::Postgres,
            );
        }
        let mut d = HistoryData::default();
        d.workers.insert("w".repeat(253), h);
        let size = encode(&d).len();
        assert!(
            size <= max_file_bytes(1),
            "{size} bytes over {}",
            max_file_bytes(1)
        );
    }

    #[test]
    fn what_the_file_dates_after_now_is_dropped_and_recording_goes_on() {
        use super::super::range::HistoryRange;
        let mut ahead = data();
        let history = ahead.workers.get_mut("astro-worker-default").unwrap();
        // Saved by a clock two days ahead.
        let two_days_ms = 2 * 86_400_000;
        history.record(
            NOW_MS + two_days_ms,
            &sample(20),
            2000,
            DecisionSource::Postgres,
        );
        history.record(
            NOW_MS + two_days_ms + 2000,
            &sample(4),
            2000,
            DecisionSource::Postgres,
        );
        let (_dir, path) = temp_path("ahead");
        write_atomically(&path, &encode(&ahead)).unwrap();

        let mut loaded = load(&path, &workers(&["astro-worker-default"]), NOW_MS);
        let history = loaded.workers.get_mut("astro-worker-default").unwrap();
        let latest_ms = NOW_MS + FUTURE_TOLERANCE.as_millis() as u64;
        for range in HistoryRange::ALL {
            let window = history.window(range, NOW_MS + 3 * 86_400_000);
            assert!(
                window
                    .buckets
                    .iter()
                    .all(|b| u64::from(b.start_s) * 1000 <= latest_ms),
                "{range:?} keeps a bucket from the clock ahead"
            );
        }
        assert_eq!(history.decisions().since(latest_ms + 1).count(), 0);
        assert!(history.decisions().since(0).count() > 0, "the rest is kept");
        // Recording at now lands in every tier.
        history.record(NOW_MS, &sample(8), 2000, DecisionSource::Postgres);
        for range in HistoryRange::ALL {
            let window = history.window(range, NOW_MS);
            let last = window.buckets.last().expect("a bucket");
            assert!(
                u64::from(last.start_s) * 1000 > NOW_MS - 1_800_000,
                "{range:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn saves_every_minute_and_on_shutdown() {
        use super::super::clock::SystemClock;
        let (_dir, path) = temp_path("periodic");
        let history = Arc::new(History::new(Arc::new(SystemClock), "t".into(), data()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep_saved(history.clone(), path.clone(), stop.clone()));
        tokio::time::sleep(SAVE_INTERVAL - Duration::from_secs(1)).await;
        assert!(!path.exists(), "not before a minute");
        // The save runs on a blocking thread: wait for it by polling, time paused.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..500 {
            if path.exists() {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(path.exists(), "saved after a minute");
        std::fs::remove_file(&path).unwrap();
        stop.cancel();
        task.await.unwrap();
        assert_eq!(
            load(
                &path,
                &workers(&["astro-worker-default", "astro-worker-etl"]),
                NOW_MS
            ),
            data(),
            "saved on shutdown"
        );
    }
}
