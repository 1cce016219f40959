//! The refresh loop's hook: after each backlog refresh, step the pre-warm windows with the
//! latest plan and the pools' real backlog, and put each worker's expected slots into the
//! snapshot about to be published.

use super::plan::Plan;
use super::windows::{PoolNow, Windows};
use crate::backlog::cache::Snapshot;
use crate::backlog::worker_view::{worker_answer, WorkerAnswer};
use crate::history::pre_warm_log::PreWarmLog;
use crate::pool::ClusterSource;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

pub struct PreWarm {
    pub windows: Mutex<Windows>,
    pub plan: watch::Receiver<Option<Arc<Plan>>>,
    pub cluster: Arc<dyn ClusterSource>,
    pub log: Arc<PreWarmLog>,
    pub staleness_limit: Duration,
}

impl PreWarm {
    /// Sets the expected slots of every pre-warming worker in `snapshot`, as of `now`.
    pub fn annotate(&self, snapshot: &mut Snapshot, now: Instant, wall: SystemTime) {
        let plan = self.plan.borrow().clone();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let configs: Vec<_> = windows.pools().iter().map(|p| p.worker.clone()).collect();
        let pool_now = |name: &str| {
            let backlog =
                configs.iter().find(|w| w.name == name).and_then(|w| {
                    match worker_answer(w, snapshot, now, self.staleness_limit) {
                        WorkerAnswer::Ready(b) => Some(b.backlog),
                        WorkerAnswer::Unavailable(_) => None,
                    }
                });
            let view = self.cluster.view(name);
            PoolNow {
                backlog,
                workers: view.running.or(view.workers),
            }
        };
        let expected = windows.step(plan.as_deref(), &pool_now, wall, &self.log);
        snapshot.set_expected(expected);
    }
}
