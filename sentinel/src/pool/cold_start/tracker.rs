//! Follows every worker's cold start from what the Sentinel sees, phase by phase, and keeps
//! the last [`KEPT_PER_POOL`] finished starts of each pool.
//!
//! Inputs arrive from three places, in no guaranteed order: the refresh (backlog), the
//! Kubernetes watch (replicas, Pods) and Airflow (registrations, first tasks). Each is handed
//! in with the moment it was observed, so the tracker itself never reads a clock.
//!
//! * A rise of `spec.replicas` takes the pool's pending demand (the refresh that first saw
//!   backlog wanting more workers than the replicas) as its "backlog seen", and its new Pods as
//!   they appear. The Pod and the Deployment come through two watches with no order between
//!   them: a new Pod seen before its rise waits ten seconds for it, and one no rise claims
//!   (a replacement Pod, a rollout) is no scale-up and is dropped.
//! * A Pod the Sentinel finds already starting when it (re)lists — it restarted mid-start —
//!   is followed from its objects' own timestamps; the phases before it are absent.
//! * Outside Kubernetes, a worker that comes online in Airflow's list while backlog waits is a
//!   new worker of the pool; the Kubernetes phases are absent.
//!
//! A start ends complete at its first task, or incomplete when its Pod is deleted, its worker
//! leaves, or nothing ran within [`OPEN_LIMIT`]: a phase that did not happen has no time.

use super::histograms::ColdStartHistograms;
use super::phase::{Mark, Phase};
use super::pod_facts::PodFacts;
use super::record::{nearest_rank, ColdStart, Incomplete, Outcome, StartKind};
use super::saved::SavedColdStart;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Finished starts kept per pool (the oldest goes first).
pub const KEPT_PER_POOL: usize = 100;
/// A start with no first task this long after it began ends as incomplete.
pub const OPEN_LIMIT: Duration = Duration::from_secs(15 * 60);
/// How long a new Pod waits for the replicas rise that created it (they come through two
/// watches, in any order).
const RISE_MATCH_MS: u64 = 10_000;
/// How long a rise waits for its Pods (a quota or a broken template may keep them away).
const RISE_WAIT_MS: u64 = 60_000;
/// Airflow's clock against the Sentinel's: an Airflow time this much before the start began
/// still belongs to it; an older one (a worker name registered before) does not.
const CLOCK_SLACK_MS: u64 = 60_000;

/// The refresh saw backlog that wants more workers than the pool has.
#[derive(Debug, Clone, Copy)]
struct Demand {
    since: Mark,
    from_zero: bool,
}

/// A rise of `spec.replicas` whose new Pods have not all appeared yet.
#[derive(Debug, Clone, Copy)]
struct Rise {
    at_ms: u64,
    backlog_seen: Option<Mark>,
    from_zero: bool,
    unclaimed: u32,
}

#[derive(Debug)]
struct Open {
    start: ColdStart,
    /// When a Pod was seen before any rise claimed it (`None` once claimed).
    waiting_for_rise_since: Option<u64>,
    /// Watch events seen for the Pod: a phase first true in a later live event was observed
    /// as it happened.
    pod_events: u32,
}

#[derive(Debug, Default)]
struct PoolStarts {
    demand: Option<Demand>,
    replicas: Option<u32>,
    rises: VecDeque<Rise>,
    open: Vec<Open>,
    /// Pods that are no start (already running when seen, no rise, or finished), until deleted.
    untracked_pods: HashSet<String>,
    /// Outside Kubernetes: the workers online at the last look.
    online: Option<HashSet<String>>,
    finished: VecDeque<ColdStart>,
}

/// What Airflow must be asked about a pool's open starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Awaiting {
    /// The workers of the open starts.
    pub workers: Vec<String>,
    /// Some of them have not been seen registered.
    pub registration: bool,
    /// Task instances that started before this (ms since the epoch) are no first task of theirs.
    pub since_ms: u64,
}

pub struct ColdStarts {
    chain: &'static [Phase],
    pools: Mutex<BTreeMap<String, PoolStarts>>,
    histograms: Option<ColdStartHistograms>,
}

impl ColdStarts {
    /// Follows `pools` (worker names); `kubernetes` when the Sentinel watches the cluster.
    pub fn new(
        pools: impl IntoIterator<Item = String>,
        kubernetes: bool,
        histograms: Option<ColdStartHistograms>,
    ) -> ColdStarts {
        ColdStarts {
            chain: if kubernetes {
                Phase::KUBERNETES
            } else {
                Phase::AIRFLOW_ONLY
            },
            pools: Mutex::new(
                pools
                    .into_iter()
                    .map(|p| (p, PoolStarts::default()))
                    .collect(),
            ),
            histograms,
        }
    }

    /// Follows `pools` as well (the workers of a changed configuration); the pools already
    /// followed keep their starts.
    pub fn follow(&self, pools: impl IntoIterator<Item = String>) {
        let mut followed = self.lock();
        for pool in pools {
            followed.entry(pool).or_default();
        }
    }

    pub fn follows_kubernetes(&self) -> bool {
        self.chain == Phase::KUBERNETES
    }

    /// The phases this Sentinel can see, in order.
    pub fn chain(&self) -> &'static [Phase] {
        self.chain
    }

    /// One refresh of `pool`: its backlog (task slots) and the workers it wants, against the
    /// workers it has (`spec.replicas`, or the online workers outside Kubernetes; `None`:
    /// unknown right now, which changes nothing).
    pub fn backlog_read(
        &self,
        pool: &str,
        at_ms: u64,
        backlog: u64,
        wanted: u32,
        present: Option<u32>,
    ) {
        self.with_pool(pool, |p| {
            let Some(present) = present else { return };
            if backlog > 0 && wanted > present {
                p.demand.get_or_insert(Demand {
                    since: Mark::sentinel(at_ms),
                    from_zero: present == 0,
                });
            } else {
                p.demand = None;
            }
        });
    }

    /// The Deployment's `spec.replicas`; `live` for a watch event as it happened, not for a
    /// (re-)list, which only sets what the next rise is measured from.
    pub fn replicas_seen(&self, pool: &str, at_ms: u64, replicas: u32, live: bool) {
        self.with_pool(pool, |p| {
            let before = p.replicas.replace(replicas);
            let Some(old) = before else { return };
            if live && replicas > old {
                let mut rise = Rise {
                    at_ms,
                    backlog_seen: p.demand.take().map(|d| d.since),
                    from_zero: old == 0,
                    unclaimed: replicas - old,
                };
                // Pods that came through their watch first, oldest first.
                let mut early: Vec<&mut Open> = p
                    .open
                    .iter_mut()
                    .filter(|o| {
                        o.waiting_for_rise_since
                            .is_some_and(|t| at_ms.saturating_sub(t) <= RISE_MATCH_MS)
                    })
                    .collect();
                early.sort_by_key(|o| o.waiting_for_rise_since);
                for open in early.into_iter().take(rise.unclaimed as usize) {
                    claim(open, &rise);
                    rise.unclaimed -= 1;
                }
                if rise.unclaimed > 0 {
                    p.rises.push_back(rise);
                }
            } else if replicas < old {
                // Scaled back before every Pod came: the newest rises' Pods will not.
                let mut excess = old - replicas;
                for rise in p.rises.iter_mut().rev() {
                    let cut = excess.min(rise.unclaimed);
                    rise.unclaimed -= cut;
                    excess -= cut;
                }
                p.rises.retain(|r| r.unclaimed > 0);
            }
        });
    }

    /// A Pod of `pool` as a watch event or a (re-)list shows it. `others_running`: whether
    /// the pool had another Ready worker (decides from-zero for a start found under way).
    pub fn pod_seen(
        &self,
        pool: &str,
        at_ms: u64,
        pod: &PodFacts,
        live: bool,
        others_running: bool,
    ) {
        if pod.deleting {
            self.pod_gone(pool, &pod.name);
            return;
        }
        let chain = self.chain;
        self.with_pool(pool, |p| {
            if let Some(open) = p.open.iter_mut().find(|o| o.start.worker == pod.name) {
                apply(open, pod, at_ms, live);
                return;
            }
            if p.untracked_pods.contains(&pod.name) {
                return;
            }
            let mut open = if live {
                let mut open = Open {
                    start: ColdStart::new(&pod.name, StartKind::Additional, chain),
                    waiting_for_rise_since: Some(at_ms),
                    pod_events: 0,
                };
                if let Some(rise) = p.rises.iter_mut().find(|r| r.unclaimed > 0) {
                    claim(&mut open, rise);
                    rise.unclaimed -= 1;
                }
                p.rises.retain(|r| r.unclaimed > 0);
                open
            } else if pod.ready {
                // Already taking tasks when the Sentinel first saw it: no start to time.
                p.untracked_pods.insert(pod.name.clone());
                return;
            } else {
                // Starting when the Sentinel (re)started: what came before is unknown.
                let kind = if others_running {
                    StartKind::Additional
                } else {
                    StartKind::FromZero
                };
                Open {
                    start: ColdStart::new(&pod.name, kind, chain),
                    waiting_for_rise_since: None,
                    pod_events: 0,
                }
            };
            apply(&mut open, pod, at_ms, live);
            p.open.push(open);
        });
    }

    /// The Pod is gone (or being deleted): a start not yet complete ends incomplete.
    pub fn pod_gone(&self, pool: &str, name: &str) {
        self.with_pool_closing(pool, |p, closed| {
            p.untracked_pods.remove(name);
            if let Some(i) = p.open.iter().position(|o| o.start.worker == name) {
                let open = p.open.swap_remove(i);
                if open.waiting_for_rise_since.is_none() {
                    closed.push(finish(
                        open.start,
                        Outcome::Incomplete(Incomplete::PodDeleted),
                    ));
                }
            }
        });
    }

    /// The workers of `pool` online in Airflow's list right now, each with its `first_online`
    /// (ms since the epoch) when Airflow gave one.
    pub fn workers_listed(&self, pool: &str, at_ms: u64, online: &[(String, Option<u64>)]) {
        let kubernetes = self.follows_kubernetes();
        let chain = self.chain;
        self.with_pool_closing(pool, |p, closed| {
            for open in p.open.iter_mut() {
                if let Some((_, first)) = online.iter().find(|(n, _)| *n == open.start.worker) {
                    let mark = registration(*first, at_ms, open.start.began_ms());
                    open.start.mark(Phase::AgentRegistered, mark);
                }
            }
            if kubernetes {
                return;
            }
            let now: HashSet<String> = online.iter().map(|(n, _)| n.clone()).collect();
            if let (Some(before), Some(demand)) = (&p.online, p.demand) {
                for (name, first) in online {
                    if before.contains(name) || p.open.iter().any(|o| o.start.worker == *name) {
                        continue;
                    }
                    let kind = if demand.from_zero {
                        StartKind::FromZero
                    } else {
                        StartKind::Additional
                    };
                    let mut start = ColdStart::new(name, kind, chain);
                    start.mark(Phase::BacklogSeen, demand.since);
                    start.mark(
                        Phase::AgentRegistered,
                        registration(*first, at_ms, Some(demand.since.at_ms)),
                    );
                    p.open.push(Open {
                        start,
                        waiting_for_rise_since: None,
                        pod_events: 0,
                    });
                }
            }
            let (gone, stay): (Vec<Open>, Vec<Open>) =
                std::mem::take(&mut p.open).into_iter().partition(|o| {
                    o.start.has(Phase::AgentRegistered) && !now.contains(&o.start.worker)
                });
            p.open = stay;
            closed.extend(
                gone.into_iter()
                    .map(|o| finish(o.start, Outcome::Incomplete(Incomplete::WorkerGone))),
            );
            p.online = Some(now);
        });
    }

    /// When workers of `pool` started their first task (ms since the epoch, Airflow's clock).
    pub fn first_tasks(&self, pool: &str, started: &HashMap<String, u64>) {
        self.with_pool_closing(pool, |p, closed| {
            let (done, stay): (Vec<Open>, Vec<Open>) =
                std::mem::take(&mut p.open).into_iter().partition(|o| {
                    o.waiting_for_rise_since.is_none() && started.contains_key(&o.start.worker)
                });
            p.open = stay;
            for mut open in done {
                let at = started[&open.start.worker];
                open.start.mark(Phase::FirstTaskRunning, Mark::airflow(at));
                p.untracked_pods.insert(open.start.worker.clone());
                closed.push(finish(open.start, Outcome::Complete));
            }
        });
    }

    /// What Airflow must be asked about `pool`'s open starts; `None` when nothing is open
    /// (a pool at rest costs Airflow nothing).
    pub fn awaiting(&self, pool: &str) -> Option<Awaiting> {
        let pools = self.lock();
        let p = pools.get(pool)?;
        let open: Vec<&Open> = p
            .open
            .iter()
            .filter(|o| o.waiting_for_rise_since.is_none())
            .collect();
        let began = open.iter().filter_map(|o| o.start.began_ms()).min()?;
        Some(Awaiting {
            workers: open.iter().map(|o| o.start.worker.clone()).collect(),
            registration: open.iter().any(|o| !o.start.has(Phase::AgentRegistered)),
            since_ms: began.saturating_sub(CLOCK_SLACK_MS),
        })
    }

    /// Ends what waited too long: Pods no rise claimed (dropped: no scale-up), rises whose
    /// Pods never came, starts with no first task within [`OPEN_LIMIT`].
    pub fn expire(&self, at_ms: u64) {
        let names: Vec<String> = self.lock().keys().cloned().collect();
        for pool in names {
            self.with_pool_closing(&pool, |p, closed| {
                p.rises
                    .retain(|r| at_ms.saturating_sub(r.at_ms) <= RISE_WAIT_MS);
                let limit = OPEN_LIMIT.as_millis() as u64;
                for open in std::mem::take(&mut p.open) {
                    match open.waiting_for_rise_since {
                        Some(t) if at_ms.saturating_sub(t) > RISE_MATCH_MS => {
                            p.untracked_pods.insert(open.start.worker);
                        }
                        None if open
                            .start
                            .began_ms()
                            .is_some_and(|b| at_ms.saturating_sub(b) > limit) =>
                        {
                            closed.push(finish(
                                open.start,
                                Outcome::Incomplete(Incomplete::TimedOut),
                            ));
                        }
                        _ => p.open.push(open),
                    }
                }
            });
        }
    }

    /// `pool`'s starts that began at or after `from_ms`, finished and under way, oldest first.
    pub fn starts_since(&self, pool: &str, from_ms: u64) -> Vec<ColdStart> {
        let pools = self.lock();
        let Some(p) = pools.get(pool) else {
            return Vec::new();
        };
        let mut starts: Vec<ColdStart> = p
            .finished
            .iter()
            .chain(
                p.open
                    .iter()
                    .filter(|o| o.waiting_for_rise_since.is_none())
                    .map(|o| &o.start),
            )
            .filter(|s| s.began_ms().is_some_and(|b| b >= from_ms))
            .cloned()
            .collect();
        starts.sort_by_key(|s| s.began_ms());
        starts
    }

    /// The typical time `pool` takes from zero to its first task running: the p90 of backlog
    /// seen → first task running over its last complete starts from zero (at most
    /// [`KEPT_PER_POOL`] of them); `None` while none has been measured (a new pool, or one
    /// that never went to zero since the Sentinel started).
    ///
    /// Pre-warming reads this as the lead a pool at zero needs to be ready when a scheduled
    /// run's tasks are queued.
    pub fn typical_cold_start(&self, pool: &str) -> Option<Duration> {
        let pools = self.lock();
        let mut totals: Vec<Duration> = pools
            .get(pool)?
            .finished
            .iter()
            .filter(|s| s.kind == StartKind::FromZero && s.outcome == Outcome::Complete)
            .filter_map(ColdStart::total)
            .collect();
        nearest_rank(&mut totals, 0.9)
    }

    /// Each followed pool's finished starts, oldest first, to save with the history.
    pub fn saved(&self) -> BTreeMap<String, Vec<SavedColdStart>> {
        self.lock()
            .iter()
            .filter(|(_, p)| !p.finished.is_empty())
            .map(|(pool, p)| {
                (
                    pool.clone(),
                    p.finished.iter().map(SavedColdStart::from).collect(),
                )
            })
            .collect()
    }

    /// Files starts saved by an earlier Sentinel ahead of this one's (those that began before
    /// this one's first), for the pools followed
    /// (at most [`KEPT_PER_POOL`] a pool, the latest). They are history: the histograms,
    /// which count this process's observations, do not see them again.
    pub fn restore(&self, saved: BTreeMap<String, Vec<SavedColdStart>>) {
        let mut pools = self.lock();
        for (pool, starts) in saved {
            let Some(p) = pools.get_mut(&pool) else {
                continue;
            };
            // Starts this Sentinel timed itself from some moment on stand: the saved ones of
            // that time (another replica's, on a take-over) would repeat them.
            let own_from = p
                .finished
                .iter()
                .filter_map(ColdStart::began_ms)
                .min()
                .unwrap_or(u64::MAX);
            let mut restored: VecDeque<ColdStart> = starts
                .into_iter()
                .filter(|s| s.began_ms().is_some_and(|b| b < own_from))
                .map(ColdStart::from)
                .collect();
            restored.extend(p.finished.drain(..));
            while restored.len() > KEPT_PER_POOL {
                restored.pop_front();
            }
            p.finished = restored;
        }
    }

    fn with_pool(&self, pool: &str, f: impl FnOnce(&mut PoolStarts)) {
        if let Some(p) = self.lock().get_mut(pool) {
            f(p);
        }
    }

    /// Runs `f`, then files the starts it closed (and feeds them to the histograms).
    fn with_pool_closing(&self, pool: &str, f: impl FnOnce(&mut PoolStarts, &mut Vec<ColdStart>)) {
        let mut closed = Vec::new();
        let mut pools = self.lock();
        let Some(p) = pools.get_mut(pool) else { return };
        f(p, &mut closed);
        for start in closed {
            if let Some(h) = &self.histograms {
                h.observe(pool, &start);
            }
            if p.finished.len() == KEPT_PER_POOL {
                p.finished.pop_front();
            }
            p.finished.push_back(start);
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PoolStarts>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn claim(open: &mut Open, rise: &Rise) {
    open.start.kind = if rise.from_zero {
        StartKind::FromZero
    } else {
        StartKind::Additional
    };
    if let Some(seen) = rise.backlog_seen {
        open.start.mark(Phase::BacklogSeen, seen);
    }
    open.start
        .mark(Phase::ReplicasRaised, Mark::sentinel(rise.at_ms));
    open.waiting_for_rise_since = None;
}

/// Marks the Pod phases that are true now: at the event's arrival when the Sentinel saw the
/// Pod before it (it happened just now), from the object's own timestamp otherwise.
fn apply(open: &mut Open, pod: &PodFacts, at_ms: u64, live: bool) {
    for (phase, object_ms) in [
        (Phase::PodScheduled, pod.scheduled_ms),
        (Phase::ContainerStarted, pod.container_started_ms),
    ] {
        let Some(object_ms) = object_ms else { continue };
        let mark = if live && open.pod_events > 0 {
            Mark::sentinel(at_ms)
        } else {
            Mark::kubernetes(object_ms)
        };
        open.start.mark(phase, mark);
    }
    open.pod_events += 1;
}

/// Airflow's `first_online` when it belongs to this start; otherwise (a worker name that
/// registered long before, or no date) the moment the Sentinel saw the worker online.
fn registration(first_online: Option<u64>, seen_ms: u64, began_ms: Option<u64>) -> Mark {
    match (first_online, began_ms) {
        (Some(t), Some(began)) if t + CLOCK_SLACK_MS >= began => Mark::airflow(t),
        (Some(t), None) => Mark::airflow(t),
        _ => Mark::sentinel(seen_ms),
    }
}

fn finish(mut start: ColdStart, outcome: Outcome) -> ColdStart {
    start.outcome = outcome;
    start
}

#[cfg(test)]
mod tests {
    use super::super::phase::Seen;
    use super::*;
    use prometheus::Registry;

    const POOL: &str = "astro-worker-default";
    const T: u64 = 1_800_000_000_000;

    fn kubernetes() -> (ColdStarts, Registry) {
        let registry = Registry::new();
        let h = ColdStartHistograms::register(&registry);
        (ColdStarts::new([POOL.to_string()], true, Some(h)), registry)
    }

    fn pod(name: &str, scheduled: Option<u64>, started: Option<u64>) -> PodFacts {
        PodFacts {
            name: name.into(),
            scheduled_ms: scheduled,
            container_started_ms: started,
            ready: false,
            deleting: false,
        }
    }

    fn marks(s: &ColdStart) -> Vec<(Phase, u64, Seen)> {
        s.marks().map(|(p, m)| (p, m.at_ms, m.seen)).collect()
    }

    fn sample_count(registry: &Registry, name: &str, label: (&str, &str)) -> u64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == label.0 && l.value() == label.1)
            })
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }

    /// Backlog at T, replicas 0 → 1 at T+0.5 s, the Pod through its phases, Airflow's times.
    fn a_start_from_zero(starts: &ColdStarts, name: &str) {
        starts.replicas_seen(POOL, T - 60_000, 0, false);
        starts.backlog_read(POOL, T, 1, 1, Some(0));
        starts.backlog_read(POOL, T + 400, 1, 1, Some(0)); // still waiting: still since T
        starts.replicas_seen(POOL, T + 500, 1, true);
        starts.pod_seen(POOL, T + 520, &pod(name, None, None), true, false);
        starts.pod_seen(
            POOL,
            T + 700,
            &pod(name, Some(T / 1000 * 1000), None),
            true,
            false,
        );
        starts.pod_seen(
            POOL,
            T + 1_300,
            &pod(name, Some(T), Some(T + 1_000)),
            true,
            false,
        );
        assert_eq!(
            starts.awaiting(POOL).unwrap().workers,
            vec![name.to_string()]
        );
        starts.workers_listed(POOL, T + 2_000, &[(name.into(), Some(T + 1_450))]);
        starts.first_tasks(POOL, &[(name.to_string(), T + 2_600)].into());
    }

    #[test]
    fn a_start_from_zero_goes_through_every_phase_in_order() {
        let (starts, registry) = kubernetes();
        a_start_from_zero(&starts, "w-a");
        let all = starts.starts_since(POOL, 0);
        assert_eq!(all.len(), 1);
        let s = &all[0];
        assert_eq!(
            (s.kind, s.outcome),
            (StartKind::FromZero, Outcome::Complete)
        );
        assert_eq!(
            marks(s),
            vec![
                (Phase::BacklogSeen, T, Seen::Sentinel),
                (Phase::ReplicasRaised, T + 500, Seen::Sentinel),
                (Phase::PodScheduled, T + 700, Seen::Sentinel),
                (Phase::ContainerStarted, T + 1_300, Seen::Sentinel),
                (Phase::AgentRegistered, T + 1_450, Seen::Airflow),
                (Phase::FirstTaskRunning, T + 2_600, Seen::Airflow),
            ]
        );
        assert_eq!(s.segments().len(), 5);
        assert_eq!(s.total(), Some(Duration::from_millis(2_600)));
        assert_eq!(starts.awaiting(POOL), None, "nothing left to ask Airflow");
        assert_eq!(
            starts.typical_cold_start(POOL),
            Some(Duration::from_millis(2_600))
        );
        let phases = "astro_sentinel_cold_start_phase_seconds";
        assert_eq!(
            sample_count(&registry, phases, ("phase", "replicas_raised")),
            1
        );
        assert_eq!(
            sample_count(&registry, phases, ("phase", "first_task_running")),
            1
        );
        let totals = "astro_sentinel_cold_start_seconds";
        assert_eq!(sample_count(&registry, totals, ("start", "from_zero")), 1);
        // Later events of the finished worker's Pod start nothing new.
        starts.pod_seen(POOL, T + 9_000, &pod("w-a", Some(T), Some(T)), true, false);
        assert_eq!(starts.starts_since(POOL, 0).len(), 1);
    }

    #[test]
    fn a_pod_seen_before_its_rise_is_claimed_by_it_and_a_second_rise_is_additional() {
        let (starts, _) = kubernetes();
        starts.replicas_seen(POOL, T, 1, false);
        starts.backlog_read(POOL, T, 8, 3, Some(1));
        // The Pod watch delivers the new Pods before the Deployment watch delivers the rise.
        starts.pod_seen(POOL, T + 100, &pod("w-b", None, None), true, false);
        starts.pod_seen(POOL, T + 110, &pod("w-c", None, None), true, false);
        assert_eq!(
            starts.awaiting(POOL),
            None,
            "not a start until a rise claims it"
        );
        starts.replicas_seen(POOL, T + 150, 3, true);
        let all = starts.starts_since(POOL, 0);
        assert_eq!(all.len(), 2);
        for s in &all {
            assert_eq!(s.kind, StartKind::Additional);
            assert_eq!(
                marks(s)[..2],
                [
                    (Phase::BacklogSeen, T, Seen::Sentinel),
                    (Phase::ReplicasRaised, T + 150, Seen::Sentinel)
                ]
            );
        }
        // Registered seen before the watch tells the container started: both are kept as
        // seen; the segment between them counts 0, not a negative time.
        starts.workers_listed(POOL, T + 900, &[("w-b".into(), Some(T + 800))]);
        starts.pod_seen(POOL, T + 950, &pod("w-b", Some(T), Some(T)), true, false);
        starts.first_tasks(POOL, &[("w-b".to_string(), T + 1_200)].into());
        let b = &starts.starts_since(POOL, 0)[0];
        assert_eq!(b.worker, "w-b");
        let registered = b
            .segments()
            .into_iter()
            .find(|g| g.to == Phase::AgentRegistered)
            .unwrap();
        assert_eq!(registered.duration, Duration::ZERO);
        assert_eq!(
            starts.typical_cold_start(POOL),
            None,
            "additional starts only"
        );
    }

    #[test]
    fn a_pod_deleted_before_its_first_task_ends_incomplete_without_made_up_phases() {
        let (starts, registry) = kubernetes();
        starts.replicas_seen(POOL, T, 0, false);
        starts.backlog_read(POOL, T, 1, 1, Some(0));
        starts.replicas_seen(POOL, T + 300, 1, true);
        starts.pod_seen(POOL, T + 320, &pod("w-d", None, None), true, false);
        starts.pod_seen(POOL, T + 600, &pod("w-d", Some(T), None), true, false);
        let mut deleting = pod("w-d", Some(T), None);
        deleting.deleting = true;
        starts.pod_seen(POOL, T + 5_000, &deleting, true, false);
        let s = &starts.starts_since(POOL, 0)[0];
        assert_eq!(s.outcome, Outcome::Incomplete(Incomplete::PodDeleted));
        assert!(!s.has(Phase::ContainerStarted) && !s.has(Phase::FirstTaskRunning));
        assert_eq!(s.total(), None);
        assert_eq!(starts.typical_cold_start(POOL), None);
        let totals = "astro_sentinel_cold_start_seconds";
        assert_eq!(sample_count(&registry, totals, ("worker", POOL)), 0);
        let phases = "astro_sentinel_cold_start_phase_seconds";
        assert_eq!(
            sample_count(&registry, phases, ("phase", "pod_scheduled")),
            1
        );
        // A rise whose Pod never comes, and a Pod no rise claims, leave no start behind.
        starts.replicas_seen(POOL, T + 6_000, 0, true);
        starts.pod_seen(
            POOL,
            T + 7_000,
            &pod("replacement", None, None),
            true,
            false,
        );
        starts.expire(T + 7_000 + RISE_MATCH_MS + 1);
        assert_eq!(starts.starts_since(POOL, 0).len(), 1);
        starts.pod_seen(
            POOL,
            T + 30_000,
            &pod("replacement", Some(T), None),
            true,
            false,
        );
        assert_eq!(starts.awaiting(POOL), None);
    }

    #[test]
    fn a_sentinel_restarted_mid_start_times_the_rest_from_the_objects() {
        let (starts, _) = kubernetes();
        // The (re)list: replicas 2, one worker Ready, one scheduled but not started.
        starts.replicas_seen(POOL, T, 2, false);
        let mut ready = pod("w-old", Some(T - 90_000), Some(T - 89_000));
        ready.ready = true;
        starts.pod_seen(POOL, T, &ready, false, true);
        starts.pod_seen(POOL, T, &pod("w-new", Some(T - 2_000), None), false, true);
        starts.backlog_read(POOL, T + 100, 6, 2, Some(2));
        // Then live: its container starts.
        starts.pod_seen(
            POOL,
            T + 700,
            &pod("w-new", Some(T - 2_000), Some(T)),
            true,
            false,
        );
        starts.workers_listed(POOL, T + 900, &[("w-new".into(), Some(T + 800))]);
        starts.first_tasks(
            POOL,
            &[
                ("w-new".to_string(), T + 1_000),
                ("w-old".to_string(), T - 80_000),
            ]
            .into(),
        );
        let all = starts.starts_since(POOL, 0);
        assert_eq!(all.len(), 1, "the Ready worker is no start");
        let s = &all[0];
        assert_eq!(
            (s.kind, s.outcome),
            (StartKind::Additional, Outcome::Complete)
        );
        assert_eq!(
            marks(s),
            vec![
                (Phase::PodScheduled, T - 2_000, Seen::Kubernetes),
                (Phase::ContainerStarted, T + 700, Seen::Sentinel),
                (Phase::AgentRegistered, T + 800, Seen::Airflow),
                (Phase::FirstTaskRunning, T + 1_000, Seen::Airflow),
            ]
        );
        assert_eq!(
            s.total(),
            None,
            "backlog seen before the restart is unknown"
        );
        // Without another Ready worker a start found under way is one from zero.
        let (alone, _) = kubernetes();
        alone.pod_seen(POOL, T, &pod("w-z", Some(T), None), false, false);
        assert_eq!(alone.starts_since(POOL, 0)[0].kind, StartKind::FromZero);
    }

    #[test]
    fn outside_kubernetes_airflow_alone_times_backlog_registration_and_first_task() {
        let starts = ColdStarts::new([POOL.to_string()], false, None);
        assert_eq!(starts.chain(), Phase::AIRFLOW_ONLY);
        starts.workers_listed(POOL, T - 1_000, &[]); // nobody online
        starts.backlog_read(POOL, T, 2, 1, Some(0));
        // A worker name used before registered long ago: the Sentinel's sighting counts.
        starts.workers_listed(
            POOL,
            T + 1_500,
            &[
                ("w-1".into(), Some(T + 1_200)),
                ("w-2".into(), Some(T - 3_600_000)),
            ],
        );
        let awaiting = starts.awaiting(POOL).unwrap();
        assert_eq!(awaiting.workers, vec!["w-1".to_string(), "w-2".to_string()]);
        assert!(!awaiting.registration);
        assert_eq!(awaiting.since_ms, T - CLOCK_SLACK_MS);
        starts.first_tasks(POOL, &[("w-1".to_string(), T + 2_000)].into());
        // w-2 leaves before any task.
        starts.workers_listed(POOL, T + 3_000, &[("w-1".into(), Some(T + 1_200))]);
        let all = starts.starts_since(POOL, 0);
        assert_eq!(all.len(), 2);
        assert_eq!(
            marks(&all[0]),
            vec![
                (Phase::BacklogSeen, T, Seen::Sentinel),
                (Phase::AgentRegistered, T + 1_200, Seen::Airflow),
                (Phase::FirstTaskRunning, T + 2_000, Seen::Airflow),
            ]
        );
        assert_eq!(all[0].kind, StartKind::FromZero);
        assert_eq!(all[0].segments().len(), 2);
        assert_eq!(all[1].outcome, Outcome::Incomplete(Incomplete::WorkerGone));
        assert_eq!(
            marks(&all[1])[1],
            (Phase::AgentRegistered, T + 1_500, Seen::Sentinel)
        );
        assert_eq!(
            starts.typical_cold_start(POOL),
            Some(Duration::from_millis(2_000))
        );
        // A worker that comes while no backlog waits is no cold start.
        starts.backlog_read(POOL, T + 4_000, 0, 0, Some(1));
        starts.workers_listed(
            POOL,
            T + 5_000,
            &[("w-1".into(), None), ("w-3".into(), None)],
        );
        assert_eq!(starts.starts_since(POOL, 0).len(), 2);
    }

    #[test]
    fn memory_is_bounded_and_open_starts_time_out() {
        let (starts, _) = kubernetes();
        for i in 0..(KEPT_PER_POOL + 20) {
            a_start_from_zero(&starts, &format!("w-{i}"));
            starts.replicas_seen(POOL, T + 3_000, 0, true);
        }
        assert_eq!(starts.starts_since(POOL, 0).len(), KEPT_PER_POOL);
        assert_eq!(starts.starts_since(POOL, 0)[0].worker, "w-20");
        starts.backlog_read(POOL, T, 1, 1, Some(0));
        starts.replicas_seen(POOL, T + 10, 1, true);
        starts.pod_seen(POOL, T + 20, &pod("w-late", None, None), true, false);
        starts.expire(T + OPEN_LIMIT.as_millis() as u64 + 1_000);
        let last = starts.starts_since(POOL, 0).pop().unwrap();
        assert_eq!(last.worker, "w-late");
        assert_eq!(last.outcome, Outcome::Incomplete(Incomplete::TimedOut));
        assert_eq!(starts.awaiting(POOL), None);
        // The typical cold start is the p90 over the kept complete starts from zero.
        assert_eq!(
            starts.typical_cold_start(POOL),
            Some(Duration::from_millis(2_600))
        );
    }
}
