//! Outside Kubernetes the history's Running and Terminating lines come from what Airflow
//! itself knows: its list of Edge workers, counted per worker pool by the queues each serves.
//! Workers (the autoscaler's count) and Waiting for capacity have no such source: they stay
//! unknown, and the history names them as missing rather than drawing 0.
//!
//! The same list says which workers are in Airflow's maintenance (a pool whose every online
//! worker is, is paused) and the task slots each worker reported running with — inside
//! Kubernetes too, where the census answers only for those slots.
//!
//! The census is taken on the refresh cadence, in its own loop so that a slow list never
//! delays the backlog KEDA reads. When the list cannot be read, every pool's lines are unknown
//! until it can (a gap, never a made-up count).

use super::cluster_view::{ClusterSource, ClusterView, WorkerSlots};
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
    pools_seen: RwLock<HashMap<String, PoolCensus>>,
    /// Told of each pool's online workers: a new one is a cold start under way. `None` inside
    /// Kubernetes, where the pods time them.
    cold_starts: Option<Arc<ColdStarts>>,
}

/// One pool as the last census saw it.
#[derive(Debug, Default, PartialEq, Eq)]
struct PoolCensus {
    view: ClusterView,
    slots: Vec<WorkerSlots>,
}

impl EdgeWorkerCensus {
    pub fn new(
        source: Arc<dyn BacklogSource>,
        pools: Vec<(String, Vec<String>)>,
        interval: Duration,
        cold_starts: Option<Arc<ColdStarts>>,
    ) -> EdgeWorkerCensus {
        EdgeWorkerCensus {
            source,
            pools,
            interval,
            pools_seen: RwLock::new(HashMap::new()),
            cold_starts,
        }
    }

    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            let seen = match self.source.edge_workers().await {
                Ok(listed) => {
                    if failing {
                        tracing::info!("Airflow's list of Edge workers readable again");
                        failing = false;
                    }
                    self.time_cold_starts(&listed);
                    self.pools
                        .iter()
                        .map(|(pool, queues)| (pool.clone(), census(&listed, queues)))
                        .collect()
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "cannot read Airflow's list of Edge workers; the workers it tells of are unknown until it can be read");
                        failing = true;
                    }
                    HashMap::new()
                }
            };
            *self.pools_seen.write().unwrap_or_else(|p| p.into_inner()) = seen;
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
        let Some(cold_starts) = &self.cold_starts else {
            return;
        };
        let seen_ms = unix_ms(std::time::SystemTime::now());
        for (pool, queues) in &self.pools {
            let online: Vec<(String, Option<u64>)> = listed
                .iter()
                .filter(|w| w.serves_any(queues))
                .filter_map(online_since)
                .collect();
            cold_starts.workers_listed(pool, seen_ms, &online);
        }
    }
}

impl ClusterSource for EdgeWorkerCensus {
    fn view(&self, pool: &str) -> ClusterView {
        let seen = self.pools_seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(pool).map(|p| p.view).unwrap_or_default()
    }

    fn worker_slots(&self, pool: &str) -> Vec<WorkerSlots> {
        let seen = self.pools_seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(pool).map(|p| p.slots.clone()).unwrap_or_default()
    }
}

/// Running and leaving Edge workers among `listed` that serve any of `queues`; paused when
/// some are online and every one of them is in maintenance; the slots each online one reported.
fn census(listed: &[ListedEdgeWorker], queues: &[String]) -> PoolCensus {
    let serving = || listed.iter().filter(|w| w.serves_any(queues));
    let online = || serving().filter(|w| w.presence() == Presence::Online);
    let running = online().count() as u32;
    let leaving = serving()
        .filter(|w| w.presence() == Presence::Leaving)
        .count() as u32;
    let mut slots: Vec<WorkerSlots> = online()
        .filter_map(|w| {
            w.concurrency().map(|slots| WorkerSlots {
                worker: w.worker_name.clone(),
                slots,
            })
        })
        .collect();
    slots.sort_by(|a, b| a.worker.cmp(&b.worker));
    PoolCensus {
        view: ClusterView {
            workers: None,
            running: Some(running),
            waiting: None,
            terminating: Some(leaving),
            paused: Some(running > 0 && online().all(|w| w.in_maintenance())),
        },
        slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airflow::edge_worker_list::ReportedSysInfo;

    fn worker(name: &str, state: &str, queues: &[&str]) -> ListedEdgeWorker {
        ListedEdgeWorker {
            worker_name: name.into(),
            state: state.into(),
            queues: Some(queues.iter().map(|q| q.to_string()).collect()),
            first_online: None,
            sysinfo: None,
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
                sysinfo: None,
            },
        ];
        let view = census(&listed, &["default".to_string()]).view;
        assert_eq!(
            view,
            ClusterView {
                workers: None,
                running: Some(3),
                waiting: None,
                terminating: Some(1),
                paused: Some(false),
            }
        );
        let none = census(&listed[..1], &["other".to_string()]).view;
        assert_eq!(
            (none.running, none.terminating, none.paused),
            (Some(0), Some(0), Some(false)),
            "no worker online is not a pause"
        );
    }

    #[test]
    fn a_pool_whose_every_online_worker_is_in_maintenance_is_paused() {
        let default = ["default".to_string()];
        let listed = [
            worker("a", "maintenance mode", &["default"]),
            worker("b", "maintenance pending", &["default"]),
            worker("c", "offline", &["default"]),
            worker("d", "idle", &["gpu"]),
        ];
        assert_eq!(census(&listed, &default).view.paused, Some(true));
        let mut one_takes_jobs = listed.to_vec();
        one_takes_jobs.push(worker("e", "idle", &["default"]));
        assert_eq!(census(&one_takes_jobs, &default).view.paused, Some(false));
    }

    #[test]
    fn the_slots_each_online_worker_reported() {
        let with_slots = |name: &str, state: &str, sysinfo: &str| ListedEdgeWorker {
            sysinfo: ReportedSysInfo::from_json_text(sysinfo),
            ..worker(name, state, &["default"])
        };
        let listed = [
            with_slots("b", "idle", r#"{"concurrency": 8}"#),
            with_slots("a", "running", r#"{"concurrency": 16}"#),
            with_slots("c", "offline", r#"{"concurrency": 2}"#),
            with_slots("d", "idle", "{}"),
        ];
        let slots = census(&listed, &["default".to_string()]).slots;
        let read: Vec<(&str, u32)> = slots.iter().map(|s| (s.worker.as_str(), s.slots)).collect();
        assert_eq!(
            read,
            vec![("a", 16), ("b", 8)],
            "online ones that reported, by name"
        );
    }
}
