//! The phases of a worker's cold start, in the order they happen, and how the Sentinel knows
//! the moment of each.

use serde::{Deserialize, Serialize};

/// One step from "work is waiting" to "the new worker runs it".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// The Sentinel's refresh first saw backlog that wants more workers than the pool has.
    BacklogSeen,
    /// The Deployment's `spec.replicas` rose (the autoscaler acted).
    ReplicasRaised,
    /// The scheduler placed the Pod on a node.
    PodScheduled,
    /// The agent container is running.
    ContainerStarted,
    /// The agent registered with Airflow (it is in Airflow's Edge worker list).
    AgentRegistered,
    /// The worker's first task instance is running.
    FirstTaskRunning,
}

impl Phase {
    /// Every phase, in order: what the Sentinel follows inside Kubernetes.
    pub const KUBERNETES: &'static [Phase] = &[
        Phase::BacklogSeen,
        Phase::ReplicasRaised,
        Phase::PodScheduled,
        Phase::ContainerStarted,
        Phase::AgentRegistered,
        Phase::FirstTaskRunning,
    ];

    /// What Airflow alone can tell (no `kubernetes` section): the Kubernetes phases are absent,
    /// not 0.
    pub const AIRFLOW_ONLY: &'static [Phase] = &[
        Phase::BacklogSeen,
        Phase::AgentRegistered,
        Phase::FirstTaskRunning,
    ];

    /// The name in the history API.
    pub fn json_name(self) -> &'static str {
        match self {
            Phase::BacklogSeen => "backlogSeen",
            Phase::ReplicasRaised => "replicasRaised",
            Phase::PodScheduled => "podScheduled",
            Phase::ContainerStarted => "containerStarted",
            Phase::AgentRegistered => "agentRegistered",
            Phase::FirstTaskRunning => "firstTaskRunning",
        }
    }

    /// The `phase` label of the histograms (Prometheus label values are snake case).
    pub fn label(self) -> &'static str {
        match self {
            Phase::BacklogSeen => "backlog_seen",
            Phase::ReplicasRaised => "replicas_raised",
            Phase::PodScheduled => "pod_scheduled",
            Phase::ContainerStarted => "container_started",
            Phase::AgentRegistered => "agent_registered",
            Phase::FirstTaskRunning => "first_task_running",
        }
    }
}

/// Whose clock and which record a moment comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Seen {
    /// The Sentinel's own observation: its refresh, or a watch event as it arrived
    /// (sub-second; at most the event's delivery late).
    Sentinel,
    /// The Kubernetes object's own timestamp (a condition's `lastTransitionTime`, a container's
    /// `startedAt`): 1-second resolution, used where the Sentinel did not see the moment
    /// happen (it started later, or its watch was re-listing).
    Kubernetes,
    /// Airflow's own record (`first_online` of the Edge worker, `start_date` of the task
    /// instance), on the Airflow database's clock.
    Airflow,
}

/// When a phase was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub at_ms: u64,
    pub seen: Seen,
}

impl Mark {
    pub fn sentinel(at_ms: u64) -> Mark {
        Mark {
            at_ms,
            seen: Seen::Sentinel,
        }
    }

    pub fn kubernetes(at_ms: u64) -> Mark {
        Mark {
            at_ms,
            seen: Seen::Kubernetes,
        }
    }

    pub fn airflow(at_ms: u64) -> Mark {
        Mark {
            at_ms,
            seen: Seen::Airflow,
        }
    }
}
