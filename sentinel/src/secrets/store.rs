//! The Secrets `ensure-secrets` owns, read and written through the API server. Each is marked
//! `helm.sh/resource-policy: keep`: Helm reads that annotation on the live object before it
//! deletes what left the chart, so the Secrets an older chart rendered survive the upgrade that
//! hands them over to this command.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use std::collections::BTreeMap;

const RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// A Secret's data as text (PEM and tokens are text; anything else reads as absent).
pub type TextData = BTreeMap<String, String>;

pub struct SecretStore {
    api: Api<Secret>,
    namespace: String,
    labels: BTreeMap<String, String>,
}

/// One Secret as read: the object (to replace it at its resourceVersion) and its data.
pub struct Stored {
    object: Secret,
    pub data: TextData,
}

impl SecretStore {
    pub fn new(client: kube::Client, namespace: &str, labels: BTreeMap<String, String>) -> Self {
        SecretStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            labels,
        }
    }

    pub async fn read(&self, name: &str) -> Result<Option<Stored>, String> {
        let object = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read Secret {}/{name}: {e}", self.namespace))?;
        Ok(object.map(|object| {
            let data = object
                .data
                .iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
                .collect();
            Stored { object, data }
        }))
    }

    /// Creates the Secret, or replaces the data of the one read (a concurrent writer makes this
    /// fail with a conflict rather than be overwritten).
    pub async fn write(
        &self,
        name: &str,
        stored: Option<Stored>,
        data: TextData,
    ) -> Result<(), String> {
        let data = Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        );
        let result = match stored {
            Some(Stored { mut object, .. }) => {
                keep(&mut object.metadata);
                object.data = data;
                object.string_data = None;
                self.api
                    .replace(name, &PostParams::default(), &object)
                    .await
            }
            None => {
                let mut metadata = ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(self.labels.clone()),
                    ..ObjectMeta::default()
                };
                keep(&mut metadata);
                let object = Secret {
                    metadata,
                    type_: Some("Opaque".into()),
                    data,
                    ..Secret::default()
                };
                self.api.create(&PostParams::default(), &object).await
            }
        };
        result
            .map(drop)
            .map_err(|e| format!("cannot write Secret {}/{name}: {e}", self.namespace))
    }

    /// Marks a Secret kept as it is (an older chart's, whose data is still good).
    pub async fn mark_kept(&self, name: &str, stored: Stored) -> Result<(), String> {
        if is_kept(&stored.object.metadata) {
            return Ok(());
        }
        let Stored { mut object, .. } = stored;
        keep(&mut object.metadata);
        self.api
            .replace(name, &PostParams::default(), &object)
            .await
            .map(drop)
            .map_err(|e| format!("cannot mark Secret {}/{name} kept: {e}", self.namespace))
    }
}

fn keep(metadata: &mut ObjectMeta) {
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(RESOURCE_POLICY.into(), "keep".into());
}

fn is_kept(metadata: &ObjectMeta) -> bool {
    metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESOURCE_POLICY))
        .is_some_and(|v| v == "keep")
}
