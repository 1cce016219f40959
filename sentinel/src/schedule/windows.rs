//! The pre-warm windows: from `run_after − lead` until the run's work reaches the pool's queues
//! (or [`RUN_TIMEOUT`] after `run_after` when it never does), a worker's answer carries the
//! slots the run is expected to need, apart from the real backlog.
//!
//! Stepped once per backlog refresh by the refresh loop, which publishes the result with the
//! snapshot: every reader (metrics-api, the external scaler, `/metrics`, the history) sees the
//! same expected slots as the same backlog. "The run's work arrived" is the pool's real backlog
//! above 0 at or after `run_after`: the real backlog then takes over (KEDA reads the larger of
//! the two, never their sum). A window ends once; a plan read again later does not reopen it.

use super::demand::Basis;
use super::lead::pre_warm_lead;
use super::plan::Plan;
use crate::config::file::WorkerConfig;
use crate::config::pre_warm::PreWarmConfig;
use crate::history::pre_warm_log::{ms_of, PreWarmEntry, PreWarmLog, PreWarmOutcome};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

/// How long after `run_after` a run's work may take to reach the queues before pre-warm gives
/// up on it: the scheduler creates the run and queues its first tasks within seconds.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest stretch between two steps counted as idle time (a stalled loop is not).
const MAX_STEP: Duration = Duration::from_secs(30);
/// Ended windows are remembered this long after their `run_after`, so they stay ended.
const ENDED_MEMORY: Duration = Duration::from_secs(3600);

/// The expected slots of one worker, and the runs they are for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    pub slots: u64,
    pub runs: Vec<ExpectedRun>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedRun {
    pub dag: String,
    /// RFC 3339, UTC.
    pub run_after: String,
}

/// What a step needs to know of a pool right now.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolNow {
    /// The real backlog in slots; `None` when not fresh (no window ends on an unknown).
    pub backlog: Option<u64>,
    /// Workers up (for idle time); `None` when unknown.
    pub workers: Option<u32>,
}

/// A pre-warming worker.
#[derive(Debug, Clone)]
pub struct PreWarmPool {
    pub worker: WorkerConfig,
    pub config: PreWarmConfig,
}

impl PreWarmPool {
    /// The most slots pre-warm asks for: `maxSlots`, and never more than `maxReplicas` workers.
    fn cap(&self) -> u64 {
        let replicas = u64::from(self.worker.max_replicas) * u64::from(self.worker.sync_slots);
        self.config
            .max_slots
            .map_or(replicas, |m| u64::from(m).min(replicas))
    }

    fn workers_for(&self, slots: u64) -> u32 {
        let n = slots
            .min(self.cap())
            .div_ceil(u64::from(self.worker.sync_slots.max(1)));
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The configured lead, else `measured` (this pool's typical cold start) plus a margin.
    fn lead(&self, measured: Option<Duration>) -> Duration {
        pre_warm_lead(self.config.lead, measured)
    }
}

type Key = (String, String, SystemTime);

struct Open {
    slots: u64,
    idle_worker_seconds: f64,
}

/// A pool's typical cold start as measured so far (`None` before any), by pool name.
pub type MeasuredColdStart = Box<dyn Fn(&str) -> Option<Duration> + Send + Sync>;

pub struct Windows {
    pools: Vec<PreWarmPool>,
    measured_cold_start: MeasuredColdStart,
    open: BTreeMap<Key, Open>,
    ended: HashSet<Key>,
    last_step: Option<SystemTime>,
}

impl Windows {
    /// Pre-warms the pools whose `preWarm.enabled` is true, each a lead ahead of its runs that
    /// follows its own measured cold starts unless configured.
    pub fn new(pools: Vec<PreWarmPool>, measured_cold_start: MeasuredColdStart) -> Self {
        Windows {
            pools: pools.into_iter().filter(|p| p.config.enabled).collect(),
            measured_cold_start,
            open: BTreeMap::new(),
            ended: HashSet::new(),
            last_step: None,
        }
    }

    pub fn pools(&self) -> &[PreWarmPool] {
        &self.pools
    }

    /// Opens and ends windows as of `now`; returns each pre-warming worker's expected slots.
    /// `plan` is `None` when no schedule is known (never read, or too old): open windows run
    /// to their end, no new one opens.
    pub fn step(
        &mut self,
        plan: Option<&Plan>,
        pool_now: &dyn Fn(&str) -> PoolNow,
        now: SystemTime,
        log: &PreWarmLog,
    ) -> HashMap<String, Expected> {
        let step = self
            .last_step
            .replace(now)
            .and_then(|last| now.duration_since(last).ok())
            .unwrap_or_default()
            .min(MAX_STEP);
        self.ended
            .retain(|(_, _, run_after)| *run_after + ENDED_MEMORY > now);
        let mut answers = HashMap::new();
        for pool in &self.pools {
            let name = pool.worker.name.as_str();
            let state = pool_now(name);
            if let Some(plan) = plan {
                let lead = pool.lead((self.measured_cold_start)(name));
                for run in plan.for_worker(name) {
                    let key = (name.to_owned(), run.dag.clone(), run.run_after);
                    let due = now + lead >= run.run_after;
                    if !due || self.ended.contains(&key) || self.open.contains_key(&key) {
                        continue;
                    }
                    let workers = pool.workers_for(run.demand.slots);
                    let text = format!(
                        "pre-warmed {workers} worker{} at {} for {} (runs at {}; {})",
                        if workers == 1 { "" } else { "s" },
                        clock(now),
                        run.dag,
                        clock(run.run_after),
                        describe(&run.demand.basis, pool),
                    );
                    log.push(
                        name,
                        entry(
                            pool,
                            &key,
                            run.demand.slots,
                            PreWarmOutcome::Opened,
                            None,
                            now,
                            text,
                        ),
                    );
                    self.open.insert(
                        key,
                        Open {
                            slots: run.demand.slots,
                            idle_worker_seconds: 0.0,
                        },
                    );
                }
            }
            let keys: Vec<Key> = self.open.keys().filter(|k| k.0 == name).cloned().collect();
            let share = step.as_secs_f64() / keys.len().max(1) as f64;
            for key in keys {
                let (_, dag, run_after) = &key;
                let arrived = now >= *run_after && state.backlog.is_some_and(|b| b > 0);
                let timed_out = now > *run_after + RUN_TIMEOUT;
                let dropped = !arrived
                    && now < *run_after
                    && plan.is_some_and(|p| {
                        !p.for_worker(name)
                            .iter()
                            .any(|r| &r.dag == dag && r.run_after == *run_after)
                    });
                let window = self.open.get_mut(&key).expect("listed above");
                if state.backlog == Some(0) {
                    window.idle_worker_seconds += f64::from(state.workers.unwrap_or(0)) * share;
                }
                let outcome = if arrived {
                    PreWarmOutcome::WorkArrived
                } else if timed_out {
                    PreWarmOutcome::TimedOut
                } else if dropped {
                    PreWarmOutcome::Dropped
                } else {
                    continue;
                };
                let window = self.open.remove(&key).expect("listed above");
                let idle = (window.idle_worker_seconds * 10.0).round() / 10.0;
                let text = match outcome {
                    PreWarmOutcome::WorkArrived => format!(
                        "{dag}'s run of {} brought work at {}; the pre-warmed pool stood idle {idle} worker-seconds before it",
                        clock(*run_after),
                        clock(now)
                    ),
                    PreWarmOutcome::TimedOut => format!(
                        "{dag}'s run of {} brought no work to this pool by {}; pre-warm ended after {idle} idle worker-seconds",
                        clock(*run_after),
                        clock(now)
                    ),
                    _ => format!(
                        "{dag}'s run of {} is no longer scheduled (paused or rescheduled); pre-warm ended after {idle} idle worker-seconds",
                        clock(*run_after)
                    ),
                };
                log.push(
                    name,
                    entry(pool, &key, window.slots, outcome, Some(idle), now, text),
                );
                self.ended.insert(key);
            }
            let mine: Vec<(&Key, &Open)> = self.open.iter().filter(|(k, _)| k.0 == name).collect();
            if !mine.is_empty() {
                let slots: u64 = mine.iter().map(|(_, o)| o.slots).sum();
                answers.insert(
                    name.to_owned(),
                    Expected {
                        slots: slots.min(pool.cap()),
                        runs: mine
                            .iter()
                            .map(|((_, dag, run_after), _)| ExpectedRun {
                                dag: dag.clone(),
                                run_after: rfc3339(*run_after),
                            })
                            .collect(),
                    },
                );
            }
        }
        answers
    }
}

fn describe(basis: &Basis, pool: &PreWarmPool) -> String {
    match basis {
        Basis::Declared { .. } => format!(
            "{}, counted up to one worker's {} slot{}",
            basis.describe(),
            pool.worker.sync_slots,
            if pool.worker.sync_slots == 1 { "" } else { "s" }
        ),
        Basis::Learned { .. } => basis.describe(),
    }
}

fn entry(
    pool: &PreWarmPool,
    key: &Key,
    slots: u64,
    outcome: PreWarmOutcome,
    idle: Option<f64>,
    now: SystemTime,
    text: String,
) -> PreWarmEntry {
    PreWarmEntry {
        t: rfc3339(now),
        at_ms: ms_of(now),
        outcome,
        dag: key.1.clone(),
        run_after: rfc3339(key.2),
        expected_slots: slots.min(pool.cap()),
        workers: pool.workers_for(slots),
        idle_worker_seconds: idle,
        text,
    }
}

/// `04:58:30` (UTC).
fn clock(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%H:%M:%S")
        .to_string()
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::demand::Demand;
    use crate::schedule::lead::{LEAD_MARGIN, UNMEASURED_COLD_START};
    use crate::schedule::plan::UpcomingRun;
    use std::time::UNIX_EPOCH;

    const LEAD: Duration = Duration::from_secs(30);

    fn pool(max_replicas: u32, max_slots: Option<u32>) -> PreWarmPool {
        PreWarmPool {
            worker: WorkerConfig {
                name: "w".into(),
                queues: vec!["q".into()],
                sync_slots: 2,
                min_replicas: 0,
                max_replicas,
                overprovision_slots: 0,
            },
            config: PreWarmConfig {
                enabled: true,
                lead: Some(LEAD),
                max_slots,
            },
        }
    }

    /// 05:00:00 on the first day of the epoch, plus `s` seconds.
    fn at(s: i64) -> SystemTime {
        let base = UNIX_EPOCH + Duration::from_secs(5 * 3600);
        if s >= 0 {
            base + Duration::from_secs(s as u64)
        } else {
            base - Duration::from_secs((-s) as u64)
        }
    }

    fn plan(dag: &str, run_after: SystemTime, slots: u64) -> Plan {
        let mut p = Plan::default();
        p.runs.insert(
            "w".into(),
            vec![UpcomingRun {
                dag: dag.into(),
                run_after,
                demand: Demand {
                    slots,
                    basis: Basis::Learned {
                        runs: 5,
                        peak: slots,
                    },
                },
            }],
        );
        p
    }

    fn unmeasured() -> MeasuredColdStart {
        Box::new(|_| None)
    }

    fn now(backlog: u64, workers: u32) -> impl Fn(&str) -> PoolNow {
        move |_| PoolNow {
            backlog: Some(backlog),
            workers: Some(workers),
        }
    }

    #[test]
    fn opens_at_run_after_minus_lead_and_ends_when_work_arrives() {
        let mut w = Windows::new(vec![pool(10, None)], unmeasured());
        let log = PreWarmLog::default();
        let p = plan("etl_daily", at(0), 6);
        assert!(w.step(Some(&p), &now(0, 0), at(-31), &log).is_empty());
        let open = w.step(Some(&p), &now(0, 0), at(-30), &log);
        assert_eq!(open["w"].slots, 6);
        assert_eq!(
            open["w"].runs,
            vec![ExpectedRun {
                dag: "etl_daily".into(),
                run_after: "1970-01-01T05:00:00Z".into()
            }]
        );
        // Work queued before run_after is someone else's: the window stays.
        assert_eq!(w.step(Some(&p), &now(1, 3), at(-10), &log)["w"].slots, 6);
        // Idle: 3 workers for 10 s with nothing to do.
        assert_eq!(w.step(Some(&p), &now(0, 3), at(0), &log)["w"].slots, 6);
        assert!(w.step(Some(&p), &now(4, 3), at(2), &log).is_empty());
        // The same run read again later does not reopen.
        assert!(w.step(Some(&p), &now(0, 3), at(3), &log).is_empty());
        let s = log.summary("w", 0);
        assert_eq!(s.entries.len(), 2);
        assert_eq!(
            s.entries[0].text,
            "pre-warmed 3 workers at 04:59:30 for etl_daily (runs at 05:00:00; last 5 runs needed 6 slots at start)"
        );
        assert_eq!(s.entries[1].outcome, PreWarmOutcome::WorkArrived);
        assert_eq!(s.idle_worker_seconds, 30.0);
        assert!(s.unused_worker_seconds.is_sign_positive() && s.unused_worker_seconds == 0.0);
    }

    #[test]
    fn without_a_configured_lead_the_pools_measured_cold_start_sets_it() {
        let log = PreWarmLog::default();
        let mut unconfigured = pool(10, None);
        unconfigured.config.lead = None;
        let p = plan("d", at(0), 2);
        // Measured 50 s: the window opens 50 s + the margin ahead.
        let ahead = -(50 + LEAD_MARGIN.as_secs() as i64);
        let measured: MeasuredColdStart =
            Box::new(|pool| (pool == "w").then_some(Duration::from_secs(50)));
        let mut w = Windows::new(vec![unconfigured.clone()], measured);
        assert!(w.step(Some(&p), &now(0, 0), at(ahead - 1), &log).is_empty());
        assert_eq!(w.step(Some(&p), &now(0, 0), at(ahead), &log)["w"].slots, 2);
        // Nothing measured yet: the unmeasured default, later.
        let default_ahead = -((UNMEASURED_COLD_START + LEAD_MARGIN).as_secs() as i64);
        let mut w = Windows::new(vec![unconfigured], unmeasured());
        assert!(w.step(Some(&p), &now(0, 0), at(ahead), &log).is_empty());
        assert!(w
            .step(Some(&p), &now(0, 0), at(default_ahead - 1), &log)
            .is_empty());
        assert_eq!(
            w.step(Some(&p), &now(0, 0), at(default_ahead), &log)["w"].slots,
            2
        );
    }

    #[test]
    fn never_above_max_replicas_nor_max_slots() {
        let log = PreWarmLog::default();
        let mut w = Windows::new(vec![pool(2, None)], unmeasured());
        assert_eq!(
            w.step(Some(&plan("d", at(0), 50)), &now(0, 0), at(-1), &log)["w"].slots,
            4
        );
        let mut w = Windows::new(vec![pool(10, Some(3))], unmeasured());
        assert_eq!(
            w.step(Some(&plan("d", at(0), 50)), &now(0, 0), at(-1), &log)["w"].slots,
            3
        );
    }

    #[test]
    fn a_run_that_never_comes_times_out_and_counts_as_unused() {
        let mut w = Windows::new(vec![pool(10, None)], unmeasured());
        let log = PreWarmLog::default();
        let p = plan("d", at(0), 2);
        w.step(Some(&p), &now(0, 1), at(-30), &log);
        assert!(!w.step(Some(&p), &now(0, 1), at(60), &log).is_empty());
        assert!(w.step(Some(&p), &now(0, 1), at(61), &log).is_empty());
        let s = log.summary("w", 0);
        assert_eq!(s.entries[1].outcome, PreWarmOutcome::TimedOut);
        assert!(s.unused_worker_seconds > 0.0);
        assert!(s
            .finding_text()
            .unwrap()
            .starts_with("Pre-warming kept workers idle for"));
    }

    #[test]
    fn a_run_no_longer_planned_before_it_comes_is_dropped() {
        let mut w = Windows::new(vec![pool(10, None)], unmeasured());
        let log = PreWarmLog::default();
        w.step(Some(&plan("d", at(0), 2)), &now(0, 0), at(-20), &log);
        // Paused: the next read lists nothing for it.
        assert!(w
            .step(Some(&Plan::default()), &now(0, 0), at(-10), &log)
            .is_empty());
        assert_eq!(
            log.summary("w", 0).entries[1].outcome,
            PreWarmOutcome::Dropped
        );
    }

    #[test]
    fn without_a_plan_nothing_opens_and_an_unknown_backlog_ends_nothing() {
        let mut w = Windows::new(vec![pool(10, None)], unmeasured());
        let log = PreWarmLog::default();
        assert!(w.step(None, &now(0, 0), at(-1), &log).is_empty());
        w.step(Some(&plan("d", at(0), 2)), &now(0, 0), at(-1), &log);
        let unknown = |_: &str| PoolNow::default();
        assert_eq!(w.step(None, &unknown, at(5), &log)["w"].slots, 2);
    }

    #[test]
    fn a_disabled_pool_is_not_pre_warmed() {
        let mut off = pool(10, None);
        off.config.enabled = false;
        let mut w = Windows::new(vec![off], unmeasured());
        assert!(w.pools().is_empty());
        let log = PreWarmLog::default();
        assert!(w
            .step(Some(&plan("d", at(0), 2)), &now(0, 0), at(-1), &log)
            .is_empty());
    }
}
