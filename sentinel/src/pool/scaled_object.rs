//! KEDA's ScaledObject, read only for what says a pool is paused: the annotations with which
//! KEDA stops scaling a workload (`autoscaling.keda.sh/paused-replicas: "<n>"` holds it at n
//! replicas, `autoscaling.keda.sh/paused: "true"` where it stands) and the Deployment it
//! scales. Only these fields are declared: the rest of the object is not read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::Deserialize;
use std::borrow::Cow;

const PAUSED_REPLICAS: &str = "autoscaling.keda.sh/paused-replicas";
const PAUSED: &str = "autoscaling.keda.sh/paused";
/// The annotations [`ScaledObject::paused`] reads: all a watch needs to keep.
pub const PAUSE_ANNOTATIONS: [&str; 2] = [PAUSED_REPLICAS, PAUSED];

#[derive(Debug, Clone, Deserialize)]
pub struct ScaledObject {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ScaledObjectSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaledObjectSpec {
    #[serde(default)]
    pub scale_target_ref: ScaleTargetRef,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ScaleTargetRef {
    #[serde(default)]
    pub name: String,
    /// `Deployment` when absent (KEDA's default).
    #[serde(default)]
    pub kind: Option<String>,
}

impl ScaledObject {
    /// Whether it scales the Deployment named `deployment`.
    pub fn scales(&self, deployment: &str) -> bool {
        let target = &self.spec.scale_target_ref;
        target.name == deployment && target.kind.as_deref().unwrap_or("Deployment") == "Deployment"
    }

    /// KEDA's own reading: `paused-replicas` pauses whatever its value (KEDA checks only that
    /// it is present), `paused` only when it says `true`.
    pub fn paused(&self) -> bool {
        let Some(annotations) = &self.metadata.annotations else {
            return false;
        };
        annotations.contains_key(PAUSED_REPLICAS)
            || annotations
                .get(PAUSED)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

impl kube::Resource for ScaledObject {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ScaledObject".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "keda.sh".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "scaledobjects".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaled_object(annotations: &[(&str, &str)]) -> ScaledObject {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "astro-worker-default",
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            },
            "spec": {"scaleTargetRef": {"name": "astro-worker-default"}, "triggers": []},
        }))
        .unwrap()
    }

    #[test]
    fn reads_kedas_pause_annotations_as_keda_does() {
        assert!(!scaled_object(&[]).paused());
        assert!(scaled_object(&[(PAUSED_REPLICAS, "0")]).paused());
        assert!(scaled_object(&[(PAUSED_REPLICAS, "3")]).paused());
        assert!(scaled_object(&[(PAUSED, "true")]).paused());
        assert!(!scaled_object(&[(PAUSED, "false")]).paused());
        assert!(!scaled_object(&[("autoscaling.keda.sh/other", "true")]).paused());
    }

    #[test]
    fn scales_its_target_deployment_only() {
        let so = scaled_object(&[]);
        assert!(so.scales("astro-worker-default"));
        assert!(!so.scales("astro-worker-gpu"));
        let mut stateful = so.clone();
        stateful.spec.scale_target_ref.kind = Some("StatefulSet".into());
        assert!(!stateful.scales("astro-worker-default"));
    }
}
