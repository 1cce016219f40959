//! One writer for the history file when two Sentinels share its folder (two replicas on one
//! volume, or a Pod still stopping while its successor starts).
//!
//! The writer holds an advisory lock on a file beside the history (`<file>.lock`: the history
//! file itself is replaced by a rename at every save, so a lock on it would not outlive the
//! first save). The replica that holds the lock loads the file and saves to it; another keeps
//! its history in memory and tries again every [`TAKE_OVER_INTERVAL`]. When the lock frees —
//! the writer stopped, after its last save — it loads the file (the writer's record, the
//! fuller one), continues it and becomes the writer.
//!
//! The lock is the operating system's (`flock` on Linux) through std's `File::try_lock`, no
//! extra crate: the kernel releases it when the process ends, however it ends, so a crashed
//! writer never leaves a stale lock behind.

use super::clock::{unix_ms, SystemClock, WallClock};
use super::persist;
use super::store::History;
use crate::config::file::WorkerConfig;
use prometheus::IntGauge;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a replica that does not write the history file tries to take it over.
pub const TAKE_OVER_INTERVAL: Duration = Duration::from_secs(5);

/// The right to write the history file, for as long as it is held.
#[derive(Debug)]
pub struct HistoryFileLock {
    _file: File,
}

impl HistoryFileLock {
    /// The lock of the history file `path`; `None` while another process holds it.
    pub fn try_acquire(path: &Path) -> std::io::Result<Option<HistoryFileLock>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path(path))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(HistoryFileLock { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

/// `history.bin` → `history.bin.lock`, in the same folder.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

/// Keeps the history saved at `path` while this replica holds its lock (`lock`, taken at
/// start, if it was free), otherwise waits for the lock, continues the file's record (of the
/// workers `configured` then) and saves from then on. `owner` is 1 while this replica writes.
/// Returns at `shutdown`, after the last save, and only then frees the lock.
pub async fn write_when_free(
    history: Arc<History>,
    path: PathBuf,
    lock: Option<HistoryFileLock>,
    configured: impl Fn() -> Vec<WorkerConfig> + Send,
    owner: IntGauge,
    shutdown: CancellationToken,
) {
    let lock = match lock {
        Some(lock) => lock,
        None => match take_over(&history, &path, configured, &shutdown).await {
            Some(lock) => lock,
            None => return,
        },
    };
    owner.set(1);
    persist::keep_saved(history, path, shutdown).await;
    owner.set(0);
    drop(lock);
}

/// Waits for the lock to free, then loads the file into `history`; `None` at shutdown.
async fn take_over(
    history: &History,
    path: &Path,
    configured: impl Fn() -> Vec<WorkerConfig>,
    shutdown: &CancellationToken,
) -> Option<HistoryFileLock> {
    tracing::info!(path = %path.display(), "another Sentinel writes the history file; this one keeps its history in memory until the file is free");
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TAKE_OVER_INTERVAL) => {}
            _ = shutdown.cancelled() => return None,
        }
        match HistoryFileLock::try_acquire(path) {
            Ok(Some(lock)) => {
                let saved = persist::load(path, &configured(), unix_ms(SystemClock.now()));
                tracing::info!(path = %path.display(), workers = saved.workers.len(), "the history file is free: continuing its record and writing it from now on");
                history.continue_from(saved);
                return Some(lock);
            }
            Ok(None) => {}
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(path = %path.display(), %error, "cannot open the history file's lock; the history stays in memory");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_free_again_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.bin");
        let first = HistoryFileLock::try_acquire(&path).unwrap();
        assert!(first.is_some());
        // A second open file description conflicts as another process's would.
        assert!(HistoryFileLock::try_acquire(&path).unwrap().is_none());
        drop(first);
        assert!(HistoryFileLock::try_acquire(&path).unwrap().is_some());
        assert!(dir.path().join("history.bin.lock").exists());
    }
}
