//! Where a worker pod stands, from its status as the kubelet and the scheduler report it, and
//! which pods a Deployment's selector takes.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Ready and not being deleted: it takes tasks.
    Running,
    /// Placed on a node, not Ready yet (starting, or failing its probe).
    Starting,
    /// The scheduler found no node with room for it.
    WaitingForCapacity,
    /// Being deleted: its agent drains.
    Terminating,
}

pub fn pod_state(pod: &Pod) -> PodState {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Terminating;
    }
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let has = |kind: &str, status: &str, reason: Option<&str>| {
        conditions.iter().any(|c| {
            c.type_ == kind
                && c.status == status
                && reason.is_none_or(|r| c.reason.as_deref() == Some(r))
        })
    };
    if has("Ready", "True", None) {
        PodState::Running
    } else if has("PodScheduled", "False", Some("Unschedulable")) {
        PodState::WaitingForCapacity
    } else {
        PodState::Starting
    }
}

/// Whether `labels` satisfy `selector`, with the API server's semantics: every `matchLabels`
/// pair and every `matchExpressions` requirement must hold; an empty selector takes everything.
pub fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let pairs_hold = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_hold = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false, // an operator the API server would have refused
        }
    });
    pairs_hold && expressions_hold
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time};

    fn pod(conditions: &[(&str, &str, Option<&str>)], deleting: bool) -> Pod {
        let mut pod = Pod::default();
        if deleting {
            pod.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        pod.status = Some(PodStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(kind, status, reason)| PodCondition {
                        type_: kind.to_string(),
                        status: status.to_string(),
                        reason: reason.map(str::to_string),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn states_follow_conditions_and_deletion() {
        let ready = [("PodScheduled", "True", None), ("Ready", "True", None)];
        assert_eq!(pod_state(&pod(&ready, false)), PodState::Running);
        assert_eq!(pod_state(&pod(&ready, true)), PodState::Terminating);
        let unschedulable = [("PodScheduled", "False", Some("Unschedulable"))];
        assert_eq!(
            pod_state(&pod(&unschedulable, false)),
            PodState::WaitingForCapacity
        );
        // Not scheduled for another reason (e.g. a scheduling gate) is not "waiting for room".
        let gated = [("PodScheduled", "False", Some("SchedulingGated"))];
        assert_eq!(pod_state(&pod(&gated, false)), PodState::Starting);
        let starting = [("PodScheduled", "True", None), ("Ready", "False", None)];
        assert_eq!(pod_state(&pod(&starting, false)), PodState::Starting);
        assert_eq!(pod_state(&Pod::default()), PodState::Starting);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let pod_labels = labels(&[("app", "astro-agent"), ("worker", "a")]);
        let by_labels = LabelSelector {
            match_labels: Some(labels(&[("app", "astro-agent"), ("worker", "a")])),
            ..Default::default()
        };
        assert!(selects(&by_labels, Some(&pod_labels)));
        let other = LabelSelector {
            match_labels: Some(labels(&[("worker", "b")])),
            ..Default::default()
        };
        assert!(!selects(&other, Some(&pod_labels)));
        assert!(!selects(&by_labels, None));
        assert!(selects(&LabelSelector::default(), None));

        let expressions = |reqs: Vec<LabelSelectorRequirement>| LabelSelector {
            match_expressions: Some(reqs),
            ..Default::default()
        };
        assert!(selects(
            &expressions(vec![requirement("worker", "In", &["a", "c"])]),
            Some(&pod_labels)
        ));
        assert!(!selects(
            &expressions(vec![requirement("worker", "NotIn", &["a"])]),
            Some(&pod_labels)
        ));
        assert!(selects(
            &expressions(vec![requirement("zone", "NotIn", &["x"])]),
            Some(&pod_labels)
        ));
        assert!(selects(
            &expressions(vec![requirement("app", "Exists", &[])]),
            Some(&pod_labels)
        ));
        assert!(!selects(
            &expressions(vec![requirement("app", "DoesNotExist", &[])]),
            Some(&pod_labels)
        ));
        assert!(!selects(
            &expressions(vec![requirement("app", "Bogus", &[])]),
            Some(&pod_labels)
        ));
    }
}
