//! One worker's inputs at one refresh, and the states the findings count: paused, running, at
//! its maximum, waiting for capacity, wanting fewer workers than its minimum, a worker running
//! with other slots than the pool's.
//!
//! A fixed-size pool (min = max) is always at its count, so for it "at its maximum" means the
//! backlog wanted more workers than it has: the time its fixed size held work back.
//!
//! Paused time (KEDA's pause annotations, Airflow's maintenance) is nobody's shortfall: it
//! counts as paused and as none of the other states.

use crate::backlog::worker_view::{wanted_replicas, WorkerBacklog};
use crate::pool::{ClusterView, WorkerSlots};

/// What the Sentinel saw for one worker at one refresh. Task counts are stored as `u32`
/// (saturating): a queue with four billion task instances is not a case worth 4 bytes a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `ceil(backlog / syncSlots)`, not held within min..max.
    pub wanted: u32,
    /// What the Sentinel tells KEDA: `wanted` held within min..max.
    pub desired_replicas: u32,
    pub cluster: ClusterView,
    /// Task slots, as KEDA is told: `wanted` is computed from it.
    pub backlog: u32,
    /// Queued task instances (tasks, not slots: the slots are in `backlog`).
    pub queued: u32,
    /// Running task instances.
    pub running_tasks: u32,
    /// Task slots of the running task instances (part of `backlog`).
    pub running_slots: u32,
    /// How far the backlog fell since the worker's previous sample, while it ran; `None` for
    /// the first sample after a start or a gap. A lower bound of what drained: work that
    /// arrived meanwhile hides as much.
    pub drained: Option<u32>,
    /// Task instances Airflow holds in `scheduled` (0 when not counted): not in `backlog`.
    pub held_tasks: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub sync_slots: u32,
    /// Scaling stopped on purpose (unknown reads as not paused).
    pub paused: bool,
    /// The slots a worker of the pool reported running with, when one reported other than
    /// `sync_slots` (the first such by name).
    pub slot_drift: Option<u32>,
}

impl Sample {
    pub fn new(answer: &WorkerBacklog, cluster: ClusterView) -> Sample {
        Sample {
            wanted: wanted_replicas(answer.scaling_slots, answer.sync_slots),
            desired_replicas: answer.desired_replicas,
            cluster,
            backlog: saturate(answer.backlog),
            queued: saturate(answer.queued_tasks),
            running_tasks: saturate(answer.running_tasks),
            running_slots: saturate(answer.running),
            drained: None,
            held_tasks: saturate(answer.held_tasks.unwrap_or(0)),
            min_replicas: answer.min_replicas,
            max_replicas: answer.max_replicas,
            sync_slots: answer.sync_slots,
            paused: cluster.paused.unwrap_or(false),
            slot_drift: None,
        }
    }

    /// With the slots the pool's workers reported: the first that differs from `sync_slots`.
    pub fn with_worker_slots(mut self, slots: &[WorkerSlots]) -> Sample {
        self.slot_drift = drifting(slots, self.sync_slots).map(|w| w.slots);
        self
    }

    /// With the backlog of the worker's previous sample (`None` after a start or a gap): how far
    /// it fell since, counted only while the pool runs.
    pub fn after(mut self, previous_backlog: Option<u32>) -> Sample {
        self.drained = previous_backlog
            .filter(|_| self.is_running())
            .map(|before| before.saturating_sub(self.backlog));
        self
    }

    /// Min = max: the autoscaler never changes its count.
    pub fn is_fixed_size(&self) -> bool {
        self.min_replicas == self.max_replicas
    }

    /// The pool is doing something: a worker runs, or (without pod data) workers are set or
    /// wanted. A pool at 0 with nothing to do is not running.
    pub fn is_running(&self) -> bool {
        if self.paused {
            return false;
        }
        match self.cluster.running {
            Some(running) => running > 0,
            None => self.cluster.workers.unwrap_or(0) > 0 || self.wanted > 0,
        }
    }

    /// The count the autoscaler set equals the maximum; without that count, what the Sentinel
    /// asks for does. A pool whose maximum is 0 is switched off, not held back. A fixed-size
    /// pool is at its maximum when the backlog wanted more workers than it has.
    pub fn at_maximum(&self) -> bool {
        if self.paused || self.max_replicas == 0 {
            return false;
        }
        if self.is_fixed_size() {
            return self.wanted > self.max_replicas;
        }
        let count = self.cluster.workers.unwrap_or(self.desired_replicas);
        count == self.max_replicas
    }

    /// Some worker waits for room on the cluster; `None` when nothing reports pending pods.
    pub fn waiting_for_capacity(&self) -> Option<bool> {
        self.cluster
            .waiting
            .map(|waiting| !self.paused && waiting > 0)
    }

    /// Airflow holds tasks back while the pool is below its maximum and not paused: room the
    /// autoscaler would use, had Airflow queued them.
    pub fn held_below_maximum(&self) -> bool {
        self.held_tasks > 0 && !self.paused && !self.at_maximum()
    }

    /// Running while the backlog calls for fewer workers than the minimum keeps.
    pub fn below_minimum_while_running(&self) -> bool {
        self.is_running() && self.wanted < self.min_replicas
    }
}

/// The first worker (by name) of `slots` that runs with other than `sync_slots`.
pub fn drifting(slots: &[WorkerSlots], sync_slots: u32) -> Option<&WorkerSlots> {
    slots.iter().find(|w| w.slots != sync_slots)
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A sample of a 1..5 worker with 4 slots and `backlog` tasks, without cluster data.
    pub(crate) fn sample(backlog: u32) -> Sample {
        let (min, max, slots) = (1, 5, 4);
        let wanted = backlog.div_ceil(slots);
        Sample {
            wanted,
            desired_replicas: wanted.clamp(min, max),
            cluster: ClusterView::default(),
            backlog,
            queued: backlog / 2,
            running_tasks: backlog - backlog / 2,
            running_slots: backlog - backlog / 2,
            drained: None,
            held_tasks: 0,
            min_replicas: min,
            max_replicas: max,
            sync_slots: slots,
            paused: false,
            slot_drift: None,
        }
    }

    pub(crate) fn with_cluster(mut s: Sample, workers: u32, running: u32, waiting: u32) -> Sample {
        s.cluster = ClusterView {
            workers: Some(workers),
            running: Some(running),
            waiting: Some(waiting),
            terminating: Some(0),
            paused: Some(false),
        };
        s
    }

    #[test]
    fn paused_time_is_none_of_the_other_states() {
        let mut s = with_cluster(sample(20), 5, 4, 1);
        (s.min_replicas, s.wanted) = (2, 1);
        assert!(s.at_maximum() && s.is_running() && s.waiting_for_capacity() == Some(true));
        s.paused = true;
        assert!(!s.at_maximum());
        assert!(!s.is_running());
        assert!(!s.below_minimum_while_running());
        assert_eq!(
            s.waiting_for_capacity(),
            Some(false),
            "known, and not waiting"
        );
        let mut view = s.cluster;
        view.paused = Some(true);
        let answer_paused = Sample::new(&answer(), view);
        assert!(answer_paused.paused);
        view.paused = None;
        assert!(
            !Sample::new(&answer(), view).paused,
            "unknown is not paused"
        );
    }

    #[test]
    fn held_back_counts_below_the_maximum_only() {
        let mut s = sample(4);
        assert!(!s.held_below_maximum(), "nothing held");
        s.held_tasks = 3;
        assert!(s.held_below_maximum());
        assert!(Sample::new(&answer(), ClusterView::default()).held_tasks == 7);
        let mut at_max = sample(20);
        at_max.held_tasks = 3;
        assert!(
            !at_max.held_below_maximum(),
            "at its maximum: nothing more to add"
        );
        s.paused = true;
        assert!(!s.held_below_maximum());
    }

    #[test]
    fn the_first_worker_with_other_slots_is_the_drift() {
        let slots = |list: &[(&str, u32)]| -> Vec<WorkerSlots> {
            list.iter()
                .map(|(w, n)| WorkerSlots {
                    worker: w.to_string(),
                    slots: *n,
                })
                .collect()
        };
        assert_eq!(
            sample(4)
                .with_worker_slots(&slots(&[("a", 4), ("b", 4)]))
                .slot_drift,
            None
        );
        assert_eq!(
            sample(4)
                .with_worker_slots(&slots(&[("a", 4), ("b", 8), ("c", 2)]))
                .slot_drift,
            Some(8)
        );
        assert_eq!(sample(4).with_worker_slots(&[]).slot_drift, None);
    }

    fn answer() -> WorkerBacklog {
        WorkerBacklog {
            worker: "w".into(),
            queues: vec!["q".into()],
            queued: 60,
            running: 10,
            backlog: 70,
            expected_slots: 0,
            expected_for: Vec::new(),
            headroom_slots: 0,
            scaling_slots: 70,
            queued_tasks: 30,
            running_tasks: 10,
            oldest_queued_age_seconds: 0.0,
            held_tasks: Some(7),
            sync_slots: 4,
            desired_replicas: 5,
            min_replicas: 1,
            max_replicas: 5,
            updated_at: String::new(),
            age_seconds: 0.0,
        }
    }

    #[test]
    fn built_from_the_answer_keda_gets() {
        let s = Sample::new(&answer(), ClusterView::default());
        assert_eq!(
            (s.wanted, s.desired_replicas),
            (18, 5),
            "wanted is ceil(70 slots / 4), not clamped"
        );
        assert_eq!(
            (s.queued, s.running_tasks, s.backlog, s.running_slots),
            (30, 10, 70, 10),
            "task counts beside the backlog in slots"
        );
    }

    #[test]
    fn running_uses_pods_when_known_else_workers_or_wanted() {
        assert!(
            !sample(0).is_running(),
            "idle at its minimum without pod data"
        );
        assert!(sample(1).is_running());
        assert!(
            !with_cluster(sample(0), 0, 0, 0).is_running(),
            "at 0, nothing to do"
        );
        assert!(
            with_cluster(sample(0), 1, 1, 0).is_running(),
            "its minimum runs"
        );
        assert!(
            !with_cluster(sample(8), 2, 0, 2).is_running(),
            "only pending pods: nothing runs"
        );
        let mut only_workers = sample(0);
        only_workers.cluster.workers = Some(2);
        assert!(only_workers.is_running());
    }

    #[test]
    fn at_maximum_is_the_autoscalers_count_or_else_the_desired_count() {
        assert!(sample(20).at_maximum(), "desired 5 of max 5");
        assert!(!sample(16).at_maximum());
        assert!(
            !with_cluster(sample(20), 4, 4, 0).at_maximum(),
            "the autoscaler set 4"
        );
        assert!(with_cluster(sample(0), 5, 5, 0).at_maximum());
        let mut off = sample(0);
        (off.min_replicas, off.max_replicas, off.desired_replicas) = (0, 0, 0);
        assert!(!off.at_maximum());
    }

    #[test]
    fn a_fixed_size_pool_is_at_its_maximum_only_when_the_backlog_wants_more() {
        let fixed = |backlog| {
            let mut s = with_cluster(sample(backlog), 5, 5, 0);
            s.min_replicas = 5;
            s
        };
        assert!(fixed(20).is_fixed_size());
        assert!(!fixed(20).at_maximum(), "5 wanted of 5: enough");
        assert!(fixed(21).at_maximum(), "6 wanted of 5");
        assert!(!fixed(0).at_maximum());
        assert!(with_cluster(sample(0), 5, 5, 0).at_maximum(), "1..5 at 5");
    }

    #[test]
    fn drained_is_the_backlogs_fall_while_running() {
        let running = |backlog| with_cluster(sample(backlog), 2, 2, 0);
        assert_eq!(running(6).after(None).drained, None, "no previous sample");
        assert_eq!(running(6).after(Some(10)).drained, Some(4));
        assert_eq!(running(12).after(Some(10)).drained, Some(0), "it grew");
        let idle = with_cluster(sample(0), 0, 0, 0);
        assert_eq!(idle.after(Some(3)).drained, None, "nothing ran");
    }

    #[test]
    fn waiting_is_unknown_without_pod_data() {
        assert_eq!(sample(8).waiting_for_capacity(), None);
        assert_eq!(
            with_cluster(sample(8), 2, 1, 1).waiting_for_capacity(),
            Some(true)
        );
        assert_eq!(
            with_cluster(sample(8), 2, 2, 0).waiting_for_capacity(),
            Some(false)
        );
    }

    #[test]
    fn below_minimum_counts_only_while_running() {
        let mut s = with_cluster(sample(0), 2, 2, 0);
        s.min_replicas = 2;
        assert!(s.below_minimum_while_running());
        s.cluster.running = Some(0);
        assert!(!s.below_minimum_while_running());
        assert!(!sample(4).below_minimum_while_running(), "wanted 1 = min 1");
    }
}
