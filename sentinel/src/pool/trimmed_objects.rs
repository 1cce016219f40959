//! What the workload watch keeps of each object: only the fields the pool view, the
//! cold-start timing and the deletion-cost loop read. A worker Pod as the API server sends it
//! is mostly spec, managed fields and container details (several KiB each); trimmed on
//! arrival, the cache of a large pool stays a small fraction of the Sentinel's memory limit.

use super::deletion_cost::DELETION_COST;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Name, labels (the selector and `pod-template-hash`), owner, deletion mark, the
/// deletion-cost annotation, and the status conditions and container states.
pub fn trim_pod(pod: &mut Pod) {
    trim_metadata(&mut pod.metadata, &[DELETION_COST]);
    pod.spec = None;
    pod.status = pod.status.take().map(|status| PodStatus {
        conditions: status.conditions,
        container_statuses: status.container_statuses.map(|all| {
            all.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    ready: c.ready,
                    state: c.state,
                    ..ContainerStatus::default()
                })
                .collect()
        }),
        phase: status.phase,
        ..PodStatus::default()
    });
}

/// Name, labels, `spec.replicas` and `spec.selector`; the Pod template is dropped.
pub fn trim_deployment(deployment: &mut Deployment) {
    trim_metadata(&mut deployment.metadata, &[]);
    deployment.spec = deployment.spec.take().map(|spec| DeploymentSpec {
        replicas: spec.replicas,
        selector: spec.selector,
        ..DeploymentSpec::default()
    });
    deployment.status = None;
}

/// Drops what no reader needs from any object's metadata: managed fields (often the largest
/// part) and every annotation but `keep`.
pub fn trim_metadata(metadata: &mut ObjectMeta, keep: &[&str]) {
    metadata.managed_fields = None;
    metadata.annotations = metadata.annotations.take().and_then(|mut all| {
        all.retain(|k, _| keep.contains(&k.as_str()));
        (!all.is_empty()).then_some(all)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::cold_start::pod_facts::{deployment_of, PodFacts};
    use crate::pool::pod_state::pod_state;

    /// A worker Pod as kube-apiserver returns it (abridged from a real one), Ready, with a
    /// deletion cost, a kubectl annotation and managed fields.
    fn full_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "w-5d8f-abcde", "namespace": "airflow",
                "labels": {"app": "astro-agent", "component": "worker", "pod-template-hash": "5d8f"},
                "annotations": {
                    DELETION_COST: "2",
                    "kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-5d8f", "uid": "u"}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"containers": [{"name": "agent", "image": "astro-agent:1", "env": [{"name": "A", "value": "x".repeat(4096)}]}]},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T00:00:01Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:05Z"}
                ],
                "containerStatuses": [{
                    "name": "agent", "ready": true, "restartCount": 0,
                    "image": "astro-agent:1", "imageID": "sha256:0123",
                    "state": {"running": {"startedAt": "2026-12-01T00:00:03Z"}}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_trimmed_pod_reads_the_same_and_keeps_no_spec() {
        let full = full_pod();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        assert_eq!(PodFacts::of(&trimmed), PodFacts::of(&full));
        assert_eq!(pod_state(&trimmed), pod_state(&full));
        assert_eq!(deployment_of(&trimmed).as_deref(), Some("w"));
        let annotations = trimmed.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations[DELETION_COST], "2");
        assert!(trimmed.spec.is_none() && trimmed.metadata.managed_fields.is_none());
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(
            size(&trimmed) * 4 < size(&full),
            "{} of {} bytes kept",
            size(&trimmed),
            size(&full)
        );
    }

    #[test]
    fn a_trimmed_deployment_keeps_replicas_and_selector() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "annotations": {"deployment.kubernetes.io/revision": "3"}},
            "spec": {
                "replicas": 4,
                "selector": {"matchLabels": {"component": "worker"}},
                "template": {"spec": {"containers": [{"name": "agent", "image": "astro-agent:1"}]}}
            },
            "status": {"replicas": 4}
        }))
        .unwrap();
        trim_deployment(&mut d);
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(4));
        assert_eq!(
            spec.selector.match_labels.unwrap()["component"],
            "worker".to_string()
        );
        assert!(spec.template.spec.is_none() && d.metadata.annotations.is_none());
    }
}
