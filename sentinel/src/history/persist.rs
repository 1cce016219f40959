//! Keeping the history across restarts (`history.path`): saved every minute and on shutdown,
//! loaded at start.
//!
//! The file is `ASTROHST`, a format version (u32, little endian), the SHA-256 of the payload
//! and the payload: the tier layout and every worker's history in postcard (a compact serde
//! format with a stable, documented wire format, maintained; bincode's development has ceased,
//! RUSTSEC-2025-0141). Writing goes to a temporary file in the same folder, synced, then renamed over
//! the old one, so a crash leaves the old file or the new one, never half of one. A file that
//! is corrupt, from another format version or with another tier layout is logged and ignored:
//! the Sentinel starts with an empty history rather than a wrong one (and never fails to
//! start because of it).

use super::decisions::MAX_DECISIONS;
use super::store::{History, HistoryData};
use super::tier::{TierSpec, TIERS};
use super::worker_history::WorkerHistory;
use crate::config::file::WorkerConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const MAGIC: &[u8; 8] = b"ASTROHST";
/// Bumped whenever the payload's types change shape.
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = MAGIC.len() + 4 + 32;
pub const SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// The payload, written from a borrow of the data...
#[derive(Serialize)]
struct SavedRef<'a> {
    tiers: [TierSpec; 3],
    max_decisions: u32,
    workers: &'a BTreeMap<String, WorkerHistory>,
}

/// ...and read back owned (the same fields in the same order: the same encoding).
#[derive(Deserialize)]
struct Saved {
    tiers: [TierSpec; 3],
    max_decisions: u32,
    workers: BTreeMap<String, WorkerHistory>,
}

pub fn encode(data: &HistoryData) -> Vec<u8> {
    let payload = postcard::to_stdvec(&SavedRef {
        tiers: TIERS,
        max_decisions: MAX_DECISIONS as u32,
        workers: &data.workers,
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
    #[error("written in format version {0}, this Sentinel reads version {FORMAT_VERSION}")]
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
    if version != FORMAT_VERSION {
        return Err(DecodeError::OtherVersion(version));
    }
    let (digest, payload) = bytes[12..].split_at(32);
    if Sha256::digest(payload).as_slice() != digest {
        return Err(DecodeError::Corrupt);
    }
    let saved: Saved =
        postcard::from_bytes(payload).map_err(|e| DecodeError::Unreadable(e.to_string()))?;
    if saved.tiers != TIERS
        || saved.max_decisions as usize != MAX_DECISIONS
        || !saved.workers.values().all(WorkerHistory::fits)
    {
        return Err(DecodeError::OtherLayout);
    }
    Ok(HistoryData {
        workers: saved.workers,
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

/// The history saved at `path`, keeping only the configured workers; empty when there is no
/// file or it cannot be used (logged).
pub fn load(path: &Path, workers: &[WorkerConfig]) -> HistoryData {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
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

/// Encodes under the history's lock and writes outside it, off the async threads.
async fn save(history: &Arc<History>, path: &Path) -> Result<(), String> {
    let history = history.clone();
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let bytes = history.with_data(encode);
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
    use super::*;

    const T0_MS: u64 = 1_800_000_000_000;

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
        let loaded = load(&path, &workers(&["astro-worker-default"]));
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
        newer[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode(&newer).unwrap_err(), DecodeError::OtherVersion(2));

        // A payload with a sound checksum but another tier layout.
        let mut tiers = TIERS;
        tiers[0].width_s = 5;
        let payload = postcard::to_stdvec(&SavedRef {
            tiers,
            max_decisions: MAX_DECISIONS as u32,
            workers: &BTreeMap::new(),
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
    fn loading_a_corrupt_or_missing_file_starts_empty() {
        let (_dir, path) = temp_path("corrupt");
        let all = workers(&["astro-worker-default"]);
        assert_eq!(load(&path, &all), HistoryData::default(), "no file yet");
        let mut bytes = encode(&data());
        bytes[HEADER_LEN + 3] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&path, &all), HistoryData::default());
        // The next save replaces it.
        write_atomically(&path, &encode(&data())).unwrap();
        assert_eq!(load(&path, &all).workers.len(), 1);
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
                &workers(&["astro-worker-default", "astro-worker-etl"])
            ),
            data(),
            "saved on shutdown"
        );
    }
}
