//! The slow loop that reads Airflow's schedule (every `schedule.readInterval`) and publishes
//! the [`Plan`]. A failed read keeps the previous plan — until it is older than
//! [`plan_max_age`], then none: windows are never opened on a schedule long out of date.

use super::plan::Plan;
use super::reader::ScheduleReader;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The age past which a plan that could not be read again is dropped.
pub fn plan_max_age(read_interval: Duration) -> Duration {
    (read_interval * 3).max(Duration::from_secs(600))
}

pub struct ScheduleLoop {
    pub reader: ScheduleReader,
    pub interval: Duration,
    pub plan: watch::Sender<Option<Arc<Plan>>>,
}

impl ScheduleLoop {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut last_success: Option<Instant> = None;
        let mut failing = false;
        loop {
            let started = tokio::time::Instant::now();
            let read = tokio::select! {
                read = self.reader.read(Instant::now()) => read,
                _ = shutdown.cancelled() => return,
            };
            match read {
                Ok(plan) => {
                    if failing {
                        tracing::info!("schedule read recovered");
                    }
                    failing = false;
                    last_success = Some(Instant::now());
                    tracing::debug!(workers = plan.runs.len(), "schedule read");
                    self.plan.send_replace(Some(Arc::new(plan)));
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "schedule read failed; keeping the last plan while it is recent");
                    }
                    failing = true;
                    let too_old =
                        last_success.is_none_or(|at| at.elapsed() > plan_max_age(self.interval));
                    if too_old && self.plan.borrow().is_some() {
                        tracing::warn!(
                            "the schedule could not be read for too long: no pre-warm until it is"
                        );
                        self.plan.send_replace(None);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(started + self.interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
