//! Outside Kubernetes the history's Running and Terminating lines come from what Airflow
//! itself knows: its list of Edge workers, counted per worker pool by the queues each serves.
//! Workers (the autoscaler's count) and Waiting for capacity have no such source: they stay
//! unknown, and the history names them as missing rather than drawing 0.
//!
//! The census is taken on the refresh cadence, in its own loop so that a slow list never
//! delays the backlog KEDA reads. When the list cannot be read, every pool's lines are unknown
//! until it can (a gap, never a made-up count).

use super::cluster_view::{ClusterSource, ClusterView};
use super::cold_start::airflow_phases::online_since;
use super::cold_start::ColdStarts;
use crate::history::clock::unix_ms;
use crate::sources::BacklogSource;
use airflow::edge_worker_list::{ListedEdgeWorker, Presence};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub struct EdgeWorkerCensus {
    source: Arc<dyn BacklogSource>,
    /// Each worker pool (its name) with the queues it serves.
    pools: Vec<(String, Vec<String>)>,
    interval: Duration,
    views: RwLock<HashMap<String, ClusterView>>,
    /// Told of each pool's online workers: a new one is a cold start under way.
    cold_starts: Arc<ColdStarts>,
}

impl EdgeWorkerCensus {
    pub fn new(
        source: Arc<dyn BacklogSource>,
        pools: Vec<(String, Vec<String>)>,
        interval: Duration,
        cold_starts: Arc<ColdStarts>,
    ) -> EdgeWorkerCensus {
        EdgeWorkerCensus {
            source,
            pools,
            interval,
            views: RwLock::new(HashMap::new()),
            cold_starts,
        }
    }

    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            let views = match self.source.edge_workers().await {
                Ok(listed) => {
                    if failing {
                        tracing::info!("Airflow's list of Edge workers readable again");
                        failing = false;
                    }
                    self.time_cold_starts(&listed);
                    self.pools
                        .iter()
                        .map(|(pool, queues)| (pool.clone(), count(&listed, queues)))
                        .collect()
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "cannot read Airflow's list of Edge workers; running workers unknown until it can be read");
                        failing = true;
                    }
                    HashMap::new()
                }
            };
            *self.views.write().unwrap_or_else(|p| p.into_inner()) = views;
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

impl EdgeWorkerCensus {
    /// Before the counts change: the tracker sees a new worker before the refresh sees the
    /// pool's demand met.
    fn time_cold_starts(&self, listed: &[ListedEdgeWorker]) {
        let seen_ms = unix_ms(std::time::SystemTime::now());
        for (pool, queues) in &self.pools {
            let online: Vec<(String, Option<u64>)> = listed
                .iter()
                .filter(|w| w.serves_any(queues))
                .filter_map(online_since)
                .collect();
            self.cold_starts.workers_listed(pool, seen_ms, &online);
        }
    }
}

impl ClusterSource for EdgeWorkerCensus {
    fn view(&self, pool: &str) -> ClusterView {
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        views.get(pool).copied().unwrap_or_default()
    }
}

/// Running and leaving Edge workers among `listed` that serve any of `queues`.
fn count(listed: &[ListedEdgeWorker], queues: &[String]) -> ClusterView {
    let serving = || listed.iter().filter(|w| w.serves_any(queues));
    let with = |presence| serving().filter(|w| w.presence() == presence).count() as u32;
    ClusterView {
        workers: None,
        running: Some(with(Presence::Online)),
        waiting: None,
        terminating: Some(with(Presence::Leaving)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str, state: &str, queues: &[&str]) -> ListedEdgeWorker {
        ListedEdgeWorker {
            worker_name: name.into(),
            state: state.into(),
            queues: Some(queues.iter().map(|q| q.to_string()).collect()),
            first_online: None,
        }
    }

    #[test]
    fn counts_the_pools_online_and_leaving_workers_by_queue() {
        let listed = [
            worker("a", "idle", &["default"]),
            worker("b", "running", &["default", "gpu"]),
            worker("c", "terminating", &["default"]),
            worker("d", "offline", &["default"]),
            worker("e", "running", &["gpu"]),
            ListedEdgeWorker {
                worker_name: "f".into(),
                state: "idle".into(),
                queues: None,
                first_online: None,
            },
        ];
        let view = count(&listed, &["default".to_string()]);
        assert_eq!(
            view,
            ClusterView {
                workers: None,
                running: Some(3),
                waiting: None,
                terminating: Some(1),
            }
        );
        let none = count(&listed[..1], &["other".to_string()]);
        assert_eq!((none.running, none.terminating), (Some(0), Some(0)));
    }
}
