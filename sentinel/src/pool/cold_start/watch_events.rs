//! Hands the cold-start tracker what the workload watch sees: each Deployment's
//! `spec.replicas` and each worker Pod's phases, stamped with the moment the event arrived.
//! A (re-)list is no live event: it sets the baseline (replicas) or finds starts under way.

use super::pod_facts::{deployment_of, PodFacts};
use super::tracker::ColdStarts;
use crate::history::clock::unix_ms;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::Event;
use std::time::SystemTime;

pub fn deployment_event(starts: &ColdStarts, event: &Event<Deployment>, store: &Store<Deployment>) {
    let now = unix_ms(SystemTime::now());
    let replicas = |d: &Deployment| {
        let r = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        (d.metadata.name.clone().unwrap_or_default(), r.max(0) as u32)
    };
    match event {
        Event::Apply(d) => {
            let (name, r) = replicas(d);
            starts.replicas_seen(&name, now, r, true);
        }
        Event::InitDone => {
            for d in store.state() {
                let (name, r) = replicas(&d);
                starts.replicas_seen(&name, now, r, false);
            }
        }
        _ => {}
    }
}

pub fn pod_event(starts: &ColdStarts, event: &Event<Pod>, store: &Store<Pod>) {
    let now = unix_ms(SystemTime::now());
    match event {
        Event::Apply(pod) => {
            if let Some(pool) = deployment_of(pod) {
                starts.pod_seen(&pool, now, &PodFacts::of(pod), true, false);
            }
        }
        Event::Delete(pod) => {
            if let (Some(pool), Some(name)) = (deployment_of(pod), pod.metadata.name.as_deref()) {
                starts.pod_gone(&pool, name);
            }
        }
        Event::InitDone => {
            let listed: Vec<(String, PodFacts)> = store
                .state()
                .iter()
                .filter_map(|p| Some((deployment_of(p)?, PodFacts::of(p))))
                .collect();
            for (pool, facts) in &listed {
                let others_running = listed
                    .iter()
                    .any(|(other, f)| other == pool && f.name != facts.name && f.ready);
                starts.pod_seen(pool, now, facts, false, others_running);
            }
        }
        _ => {}
    }
}
