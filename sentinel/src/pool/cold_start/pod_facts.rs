//! What a worker Pod's object tells about its cold start: which Deployment it belongs to,
//! whether it is scheduled and its agent container started (with the objects' own
//! timestamps), whether it is Ready or being deleted.

use super::super::pod_state::{pod_state, PodState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The chart's name for the container that runs astro-agent (the tasks container is a
/// native sidecar among the init containers).
pub const AGENT_CONTAINER: &str = "agent";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    /// `lastTransitionTime` of `PodScheduled=True` (ms since the epoch).
    pub scheduled_ms: Option<u64>,
    /// `startedAt` of the agent container's running state.
    pub container_started_ms: Option<u64>,
    pub ready: bool,
    pub deleting: bool,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> PodFacts {
        let status = pod.status.as_ref();
        let scheduled_ms = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "True")
            .map(|c| c.last_transition_time.as_ref().map_or(0, time_ms));
        let containers = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        // The agent container by name; a Pod of another shape with one container: that one.
        let agent = containers
            .iter()
            .find(|c| c.name == AGENT_CONTAINER)
            .or(match containers {
                [only] => Some(only),
                _ => None,
            });
        let container_started_ms = agent
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.running.as_ref())
            .map(|r| r.started_at.as_ref().map_or(0, time_ms));
        let state = pod_state(pod);
        PodFacts {
            name: pod.metadata.name.clone().unwrap_or_default(),
            scheduled_ms,
            container_started_ms,
            ready: state == PodState::Running,
            deleting: state == PodState::Terminating,
        }
    }
}

/// The Deployment that owns `pod`: its ReplicaSet owner's name without the
/// `pod-template-hash` the Deployment controller appends (`<deployment>-<hash>`). Read from the
/// Pod alone, so that it works before the Deployments are listed.
pub fn deployment_of(pod: &Pod) -> Option<String> {
    let hash = pod.metadata.labels.as_ref()?.get("pod-template-hash")?;
    let owner = pod
        .metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.kind == "ReplicaSet")?;
    owner
        .name
        .strip_suffix(hash.as_str())?
        .strip_suffix('-')
        .map(str::to_string)
}

fn time_ms(t: &Time) -> u64 {
    u64::try_from(t.0.as_millisecond()).unwrap_or(0)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    /// A worker Pod of `deployment`, scheduled and started at the given seconds.
    pub fn worker_pod(
        deployment: &str,
        name: &str,
        scheduled: Option<i64>,
        started: Option<i64>,
    ) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some([("pod-template-hash".to_string(), "5d8f".to_string())].into());
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: format!("{deployment}-5d8f"),
            ..Default::default()
        }]);
        let mut status = PodStatus::default();
        if let Some(s) = scheduled {
            status.conditions = Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(at(s)),
                ..Default::default()
            }]);
        }
        if let Some(s) = started {
            status.container_statuses = Some(vec![
                ContainerStatus {
                    name: "other".into(),
                    ..Default::default()
                },
                ContainerStatus {
                    name: AGENT_CONTAINER.into(),
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(at(s)),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]);
        }
        pod.status = Some(status);
        pod
    }

    #[test]
    fn reads_the_phases_and_the_owning_deployment() {
        let pod = worker_pod(
            "astro-worker-default",
            "astro-worker-default-5d8f-x1",
            Some(100),
            Some(102),
        );
        assert_eq!(deployment_of(&pod).as_deref(), Some("astro-worker-default"));
        let facts = PodFacts::of(&pod);
        assert_eq!(facts.name, "astro-worker-default-5d8f-x1");
        assert_eq!(facts.scheduled_ms, Some(100_000));
        assert_eq!(facts.container_started_ms, Some(102_000));
        assert!(!facts.ready && !facts.deleting);

        let pending = PodFacts::of(&worker_pod("d", "d-5d8f-a", None, None));
        assert_eq!(
            (pending.scheduled_ms, pending.container_started_ms),
            (None, None)
        );

        let mut orphan = pod.clone();
        orphan.metadata.owner_references = None;
        assert_eq!(deployment_of(&orphan), None);
    }
}
