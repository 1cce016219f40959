//! The phases only Airflow knows: when a starting worker registered (its `first_online` in
//! Airflow's Edge worker list) and when it started its first task (the earliest `start_date`
//! of the task instances whose hostname is the worker's name: the exact moment Airflow marked
//! it running, read in one query or listing bounded by the start's beginning).
//!
//! Asked on the refresh cadence only while a start is open, so a pool at rest costs Airflow
//! nothing, and in one request or query for all pools. Outside Kubernetes the Edge worker
//! census, which reads the list anyway, hands it to the tracker; here only the first tasks are
//! asked.

use super::tracker::ColdStarts;
use crate::history::clock::unix_ms;
use crate::sources::BacklogSource;
use airflow::edge_worker_list::{ListedEdgeWorker, Presence};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

pub struct AirflowPhases {
    pub tracker: Arc<ColdStarts>,
    pub source: Arc<dyn BacklogSource>,
    /// Each worker pool with the queues it serves.
    pub pools: Vec<(String, Vec<String>)>,
    pub interval: Duration,
}

impl AirflowPhases {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            self.tracker.expire(unix_ms(SystemTime::now()));
            match self.look_once().await {
                Ok(()) if failing => {
                    tracing::info!("cold starts: Airflow readable again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) => {
                    // The phases wait: a later look still finds the same registration and task.
                    if !failing {
                        tracing::warn!(error = %e, "cold starts: cannot read Airflow; their registration and first task wait for the next look");
                        failing = true;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    async fn look_once(&self) -> Result<(), String> {
        let awaiting: Vec<_> = self
            .pools
            .iter()
            .filter_map(|(pool, queues)| Some((pool, queues, self.tracker.awaiting(pool)?)))
            .collect();
        if awaiting.is_empty() {
            return Ok(());
        }
        if self.tracker.follows_kubernetes() && awaiting.iter().any(|(_, _, a)| a.registration) {
            let listed = self.source.edge_workers().await?;
            let seen_ms = unix_ms(SystemTime::now());
            for (pool, _, a) in &awaiting {
                let online: Vec<(String, Option<u64>)> = listed
                    .iter()
                    .filter(|w| a.workers.contains(&w.worker_name))
                    .filter_map(online_since)
                    .collect();
                self.tracker.workers_listed(pool, seen_ms, &online);
            }
        }
        // One question for every pool at once, as for the backlog: the union of their queues
        // and workers, since the oldest open start.
        let mut queues: Vec<String> = awaiting.iter().flat_map(|(_, q, _)| q.to_vec()).collect();
        let mut hosts: Vec<String> = awaiting
            .iter()
            .flat_map(|(_, _, a)| a.workers.clone())
            .collect();
        for list in [&mut queues, &mut hosts] {
            list.sort();
            list.dedup();
        }
        let since_ms = awaiting.iter().map(|(_, _, a)| a.since_ms).min();
        let since = UNIX_EPOCH + Duration::from_millis(since_ms.unwrap_or_default());
        let started: HashMap<String, u64> = self
            .source
            .first_task_starts(&queues, &hosts, since)
            .await?
            .into_iter()
            .map(|(host, at)| (host, unix_ms(at)))
            .collect();
        for (pool, _, _) in &awaiting {
            self.tracker.first_tasks(pool, &started);
        }
        Ok(())
    }
}

/// An online worker's name with its `first_online` (ms since the epoch); `None` for a worker
/// that is not online (starting, leaving, gone).
pub fn online_since(worker: &ListedEdgeWorker) -> Option<(String, Option<u64>)> {
    if worker.presence() != Presence::Online {
        return None;
    }
    let first = worker
        .first_online
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok());
    Some((worker.worker_name.clone(), first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn online_workers_with_their_first_online() {
        let w = |state: &str, first: Option<&str>| ListedEdgeWorker {
            worker_name: "w-1".into(),
            state: state.into(),
            queues: None,
            first_online: first.map(str::to_string),
            sysinfo: None,
        };
        assert_eq!(
            online_since(&w("idle", Some("2026-01-01T00:00:01.250000Z"))),
            Some(("w-1".to_string(), Some(1_767_225_601_250)))
        );
        assert_eq!(
            online_since(&w("running", None)),
            Some(("w-1".to_string(), None))
        );
        assert_eq!(online_since(&w("starting", None)), None);
        assert_eq!(
            online_since(&w("offline", Some("2026-01-01T00:00:00Z"))),
            None
        );
    }
}
