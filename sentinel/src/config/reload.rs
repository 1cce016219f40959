//! A changed configuration file, applied without a restart: what may change at run time, and
//! how a change is noticed.
//!
//! The file is read again every `--config-check-interval` and compared by content (SHA-256)
//! rather than watched with inotify (the `notify` crate): the kubelet updates a mounted
//! ConfigMap by writing a new hidden folder and swapping the `..data` symlink, so a watch on the
//! file's path sees nothing and a watch on the folder sees a burst of events for the kubelet's
//! own files; inotify also misses changes on some network and overlay filesystems. The kubelet
//! itself takes up to a minute to project a change, so reading one small file every few
//! seconds adds nothing noticeable and cannot miss a change, whatever the filesystem.

use super::file::Config;
use super::ConfigError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The SHA-256 of what the file holds.
type Digest32 = [u8; 32];

/// The configuration file, read every `interval` for a new content.
pub struct ConfigFileWatch {
    path: PathBuf,
    interval: Duration,
    /// What the file held when last read.
    last: Option<Digest32>,
}

impl ConfigFileWatch {
    /// Takes the file's content now as the running one (read once more after the start's
    /// read, so a change made in between is applied at the first check, not lost).
    pub fn new(path: PathBuf, interval: Duration) -> ConfigFileWatch {
        let last = digest_of(&path).ok();
        ConfigFileWatch {
            path,
            interval,
            last,
        }
    }

    /// Sends each new content, parsed, on `changes` (an invalid file as its error, once per
    /// content). Returns at `shutdown` or when the receiver is gone.
    pub async fn run(
        mut self,
        changes: mpsc::Sender<Result<Config, ConfigError>>,
        shutdown: CancellationToken,
    ) {
        let mut unreadable = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = shutdown.cancelled() => return,
            }
            let text = match std::fs::read_to_string(&self.path) {
                Ok(text) => {
                    unreadable = false;
                    text
                }
                // Logged once per stretch; the running configuration stays meanwhile.
                Err(e) if !unreadable => {
                    unreadable = true;
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot read the configuration file; keeping the running configuration");
                    continue;
                }
                Err(_) => continue,
            };
            let digest: Digest32 = Sha256::digest(text.as_bytes()).into();
            if self.last == Some(digest) {
                continue;
            }
            self.last = Some(digest);
            if changes.send(Config::parse(&text)).await.is_err() {
                return;
            }
        }
    }
}

fn digest_of(path: &Path) -> std::io::Result<Digest32> {
    Ok(Sha256::digest(std::fs::read(path)?).into())
}

/// `next` with the settings that cannot change at run time taken from `running`, each one
/// that differs logged. They are fixed because they were combined with the flags at start
/// (the source with its credentials, auth and `kubernetes` with access to the API server) or
/// because a running part holds them (the history file and its lock).
pub fn keep_fixed_settings(running: &Config, mut next: Config) -> Config {
    let mut kept = Vec::new();
    if next.source != running.source {
        kept.push("source");
        next.source = running.source.clone();
    }
    if next.auth != running.auth {
        kept.push("auth");
        next.auth = running.auth.clone();
    }
    if next.queue_events.auth != running.queue_events.auth {
        kept.push("queueEvents.auth");
        next.queue_events.auth = running.queue_events.auth.clone();
    }
    if next.history != running.history {
        kept.push("history");
        next.history = running.history.clone();
    }
    if next.kubernetes.is_some() != running.kubernetes.is_some() {
        kept.push("kubernetes");
        next.kubernetes = running.kubernetes.clone();
    }
    for setting in kept {
        tracing::warn!(
            setting,
            "configuration change: {setting} cannot change while the Sentinel runs; keeping the running value (restart the Sentinel to apply it)"
        );
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
source: {type: airflow-api, airflowApi: {url: 'http://airflow:8080'}}
auth: {staticTokensFile: /tokens}
workers:
  - {name: a, queues: [q], maxReplicas: 3}
";

    #[test]
    fn fixed_settings_keep_their_running_value_and_the_rest_changes() {
        let running = Config::parse(BASE).unwrap();
        let next = Config::parse(
            "
source: {type: airflow-api, airflowApi: {url: 'http://elsewhere:8080'}}
auth: {disabled: true}
history: {path: /data/history.bin}
kubernetes: {namespace: ns}
refreshInterval: 5s
workers:
  - {name: a, queues: [q], maxReplicas: 7}
  - {name: b, queues: [r]}
",
        )
        .unwrap();
        let applied = keep_fixed_settings(&running, next);
        assert_eq!(applied.source, running.source);
        assert_eq!(applied.auth, running.auth);
        assert_eq!(applied.history, running.history);
        assert_eq!(applied.kubernetes, None);
        assert_eq!(applied.refresh_interval, Duration::from_secs(5));
        assert_eq!(applied.workers.len(), 2);
        assert_eq!(applied.workers[0].max_replicas, 7);
    }

    #[tokio::test]
    async fn sends_each_new_content_once_and_an_invalid_one_as_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, BASE).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let stop = CancellationToken::new();
        let watch = ConfigFileWatch::new(path.clone(), Duration::from_millis(20));
        let task = tokio::spawn(watch.run(tx, stop.clone()));
        std::fs::write(&path, BASE.replace("maxReplicas: 3", "maxReplicas: 4")).unwrap();
        let changed = rx.recv().await.unwrap().unwrap();
        assert_eq!(changed.workers[0].max_replicas, 4);
        std::fs::write(&path, BASE.replace("maxReplicas: 3", "maxReplicas: many")).unwrap();
        let refused = rx.recv().await.unwrap().unwrap_err();
        assert!(refused.0.contains("maxReplicas"), "{refused}");
        // The same content again is no change.
        std::fs::write(&path, BASE.replace("maxReplicas: 3", "maxReplicas: many")).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err(),
            "an unchanged content is not sent again"
        );
        stop.cancel();
        task.await.unwrap();
    }
}
