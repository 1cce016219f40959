//! Watches (list once, then follow changes; never polls) the Deployments, pods and KEDA
//! ScaledObjects of the workers' namespace, keeping both in memory, so that each refresh can say per worker what the
//! autoscaler set and where its pods stand without a request to the API server.
//!
//! kube-runtime's watcher re-lists after a broken or expired watch and backs off (at most a few
//! seconds: [`WatchBackoff`]) while the API server is unreachable; until a first list has completed, or while the watch is failing, the
//! view is unknown rather than a count of what happens to be cached. The ScaledObjects only say
//! whether a pool is paused: without KEDA (or the permission to read them) that alone is unknown.
//!
//! With `kubernetes.workerLabels` the API server sends only the workers' objects, and each is
//! [trimmed](super::trimmed_objects) on arrival: a namespace shared with Airflow's own Pods
//! costs the Sentinel nothing for them.

use super::cluster_view::{ClusterSource, ClusterView};
use super::cold_start::watch_events::{deployment_event, pod_event};
use super::cold_start::ColdStarts;
use super::pod_state::{pod_state, selects, PodState};
use super::scaled_object::{ScaledObject, PAUSE_ANNOTATIONS};
use super::trimmed_objects::{trim_deployment, trim_metadata, trim_pod};
use super::watch_backoff::WatchBackoff;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::core::Selector;
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use prometheus::IntGaugeVec;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub struct WorkloadWatch {
    namespace: String,
    deployments: Store<Deployment>,
    pods: Store<Pod>,
    scaled_objects: Store<ScaledObject>,
    deployments_healthy: Arc<AtomicBool>,
    pods_healthy: Arc<AtomicBool>,
    scaled_objects_healthy: Arc<AtomicBool>,
}

impl WorkloadWatch {
    /// Starts the watches of the objects carrying `worker_labels` (all when empty), which also
    /// time the workers' cold starts in `cold_starts` and count what they hold in `cached`
    /// (by kind); they run until `shutdown` is cancelled.
    pub fn start(
        client: Client,
        namespace: &str,
        worker_labels: &BTreeMap<String, String>,
        cold_starts: Arc<ColdStarts>,
        cached: IntGaugeVec,
        shutdown: CancellationToken,
    ) -> Self {
        let selector: Selector = worker_labels.clone().into_iter().collect();
        let config = watcher::Config::default().labels_from(&selector);
        let starts = cold_starts.clone();
        let (deployments, deployments_healthy) = follow(
            Api::<Deployment>::namespaced(client.clone(), namespace),
            config.clone(),
            trim_deployment,
            move |event, store| deployment_event(&starts, event, store),
            cached.clone(),
            shutdown.clone(),
        );
        let (pods, pods_healthy) = follow(
            Api::<Pod>::namespaced(client.clone(), namespace),
            config.clone(),
            trim_pod,
            move |event, store| pod_event(&cold_starts, event, store),
            cached.clone(),
            shutdown.clone(),
        );
        let (scaled_objects, scaled_objects_healthy) = follow(
            Api::<ScaledObject>::namespaced(client, namespace),
            config,
            |so| trim_metadata(&mut so.metadata, &PAUSE_ANNOTATIONS),
            |_, _| {},
            cached,
            shutdown,
        );
        WorkloadWatch {
            namespace: namespace.to_string(),
            deployments,
            pods,
            scaled_objects,
            deployments_healthy,
            pods_healthy,
            scaled_objects_healthy,
        }
    }

    /// The Deployment named `deployment` as the cluster sees it; all unknown while a watch
    /// has not listed yet or is failing, or when there is no such Deployment.
    fn cluster_view(&self, deployment: &str) -> ClusterView {
        if !self.ready() {
            return ClusterView::default();
        }
        let Some(found) = self.deployment(deployment) else {
            return ClusterView::default();
        };
        let mut view = ClusterView {
            workers: found
                .spec
                .as_ref()
                .map(|s| s.replicas.unwrap_or(1).max(0) as u32),
            running: Some(0),
            waiting: Some(0),
            terminating: Some(0),
            paused: self.paused(deployment),
        };
        for pod in self.pods_of(&found) {
            let count = match pod_state(&pod) {
                PodState::Running => &mut view.running,
                PodState::WaitingForCapacity => &mut view.waiting,
                PodState::Terminating => &mut view.terminating,
                PodState::Starting => continue,
            };
            *count = count.map(|n| n + 1);
        }
        view
    }

    /// The pods of `deployment` that take tasks (Ready, not being deleted); empty while the
    /// watches are not ready.
    pub fn running_pods(&self, deployment: &str) -> Vec<Arc<Pod>> {
        if !self.ready() {
            return Vec::new();
        }
        match self.deployment(deployment) {
            Some(found) => self
                .pods_of(&found)
                .into_iter()
                .filter(|p| pod_state(p) == PodState::Running)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Whether KEDA's annotations pause the ScaledObject that scales `deployment` (not paused
    /// when none does); unknown while that watch has not listed or is failing.
    fn paused(&self, deployment: &str) -> Option<bool> {
        if !self.scaled_objects_healthy.load(Ordering::Relaxed) {
            return None;
        }
        Some(
            self.scaled_objects
                .state()
                .iter()
                .any(|so| so.scales(deployment) && so.paused()),
        )
    }

    fn ready(&self) -> bool {
        self.deployments_healthy.load(Ordering::Relaxed)
            && self.pods_healthy.load(Ordering::Relaxed)
    }

    fn deployment(&self, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// What the Deployment's selector takes (the ReplicaSet controller's own rule).
    fn pods_of(&self, deployment: &Deployment) -> Vec<Arc<Pod>> {
        let Some(selector) = deployment.spec.as_ref().map(|s| &s.selector) else {
            return Vec::new();
        };
        self.pods
            .state_filter(|pod| selects(selector, pod.metadata.labels.as_ref()))
    }
}

impl ClusterSource for WorkloadWatch {
    fn view(&self, deployment: &str) -> ClusterView {
        self.cluster_view(deployment)
    }
}

/// A reflector over what `api` lists with `config`, each object passed through `trim` before
/// it is stored: its store, and whether it holds a complete, current picture (a first list done
/// and no error since the last successful event). `observe` sees each event as it arrives,
/// after the store took it in; `cached{kind}` says how many objects the store holds.
fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    observe: impl Fn(&watcher::Event<K>, &Store<K>) + Send + 'static,
    cached: IntGaugeVec,
    shutdown: CancellationToken,
) -> (Store<K>, Arc<AtomicBool>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let observed = store.clone();
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let kind = K::kind(&()).to_string();
    let held = cached.with_label_values(&[&kind]);
    let stream =
        reflector(writer, watcher(api, config).modify(trim)).backoff(WatchBackoff::default());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = shutdown.cancelled() => return,
            };
            if let Some(Ok(event)) = &event {
                observe(event, &observed);
                if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                    held.set(observed.len() as i64);
                }
            }
            match event {
                Some(Ok(watcher::Event::InitDone))
                | Some(Ok(watcher::Event::Apply(_)))
                | Some(Ok(watcher::Event::Delete(_))) => {
                    if failing {
                        tracing::info!(kind, "watch of worker {kind}s recovered");
                        failing = false;
                    }
                    // Complete once the first list is in (InitDone, the first event of this
                    // kind), and again after an error once the watcher resumed or re-listed.
                    flag.store(true, Ordering::Relaxed);
                }
                Some(Ok(_)) => {} // Init, InitApply: a (re-)list under way
                Some(Err(e)) => {
                    if !failing {
                        tracing::warn!(kind, error = %e, "watch of worker {kind}s failing; their counts are unknown until it recovers");
                        failing = true;
                    }
                    flag.store(false, Ordering::Relaxed);
                }
                None => return,
            }
        }
    });
    (store, healthy)
}
