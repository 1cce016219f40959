//! One Sentinel replica at a time sets the pods' deletion costs: the one holding a
//! `coordination.k8s.io/v1` Lease, as Kubernetes' own controllers elect their leader
//! (client-go's leaderelection). Two replicas patching from reads a moment apart would flip a
//! pod's cost back and forth; with the Lease the others only watch and take over when the
//! holder stops renewing.
//!
//! Expiry is judged on this replica's own clock, from when it last saw the record change
//! (holder or renew time), never by comparing the holder's timestamps with its own: clocks of two
//! nodes may disagree. Writes carry the `resourceVersion` read, so of two replicas taking over
//! at once the API server lets one win (409 for the other).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// How long a holder's Lease lasts without renewal (client-go's default for controllers).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews: a third of the duration leaves two renewals' room for a slow
/// API server before another replica may take over.
const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Who holds the Lease: the pod's name (the hostname) and when this process started, the same
/// for every configuration the process runs (a reload keeps the Lease), new for a restart.
fn process_identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "astro-sentinel".into());
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!("{host}_{}_{started}", std::process::id())
    })
}

/// The loops of this process that hold a [`LeaderLease`] (more than one only while a
/// configuration change hands over from one generation to the next).
static LIVE: AtomicUsize = AtomicUsize::new(0);

impl Drop for LeaderLease {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What to do with the Lease as last read (none yet: create it, held by us).
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Ours: renew it.
    Renew,
    /// Free, or its holder stopped renewing: take it.
    TakeOver,
    /// Another replica holds it.
    Follow,
}

pub struct LeaderLease {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The other holder's record as last seen, and since when it has not changed.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
    /// When we last wrote the Lease as its holder.
    renewed: Option<Instant>,
}

impl LeaderLease {
    /// The Lease `name`, held as this process: its Pod's name and its start.
    pub fn new(api: Api<Lease>, name: &str) -> Self {
        Self::with_identity(api, name, process_identity())
    }

    fn with_identity(api: Api<Lease>, name: &str, identity: &str) -> Self {
        LIVE.fetch_add(1, Ordering::SeqCst);
        LeaderLease {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            observed: None,
            renewed: None,
        }
    }

    /// Whether this replica leads now: renews (or takes) the Lease when due; false while
    /// another replica holds it, and once our own renewals have failed for most of the
    /// duration (another replica may take over from then on).
    pub async fn lead(&mut self) -> bool {
        if self.renewed.is_some_and(|at| at.elapsed() < RENEW_EVERY) {
            return true;
        }
        // Bounded: a hung API server must not hold the loop (or its shutdown) past a renewal.
        let attempt = tokio::time::timeout(RENEW_EVERY, self.try_hold()).await;
        match attempt.unwrap_or_else(|_| Err(format!("no answer in {RENEW_EVERY:?}"))) {
            Ok(true) => {
                self.renewed = Some(Instant::now());
                true
            }
            Ok(false) => {
                self.renewed = None;
                false
            }
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "cannot renew the deletion-cost Lease");
                let leading = self
                    .renewed
                    .is_some_and(|at| at.elapsed() < LEASE_DURATION - RENEW_EVERY);
                if !leading {
                    self.renewed = None;
                }
                leading
            }
        }
    }

    /// Gives the Lease up if we hold it, so that another replica takes over at once rather
    /// than after the duration (a rollout, the process stopping).
    pub async fn release(&mut self) {
        if self.renewed.take().is_none() {
            return;
        }
        // A configuration change starts the next generation's loop before it stops this one:
        // the Lease is the process's, and the next loop holds it on.
        if LIVE.load(Ordering::SeqCst) > 1 {
            return;
        }
        let read = tokio::time::timeout(RENEW_EVERY, self.api.get_opt(&self.name)).await;
        if let Ok(Ok(Some(mut lease))) = read {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                spec.holder_identity = None;
                spec.renew_time = None;
                let params = PostParams::default();
                let write = self.api.replace(&self.name, &params, &lease);
                match tokio::time::timeout(RENEW_EVERY, write).await {
                    Ok(Ok(_)) => tracing::info!(lease = %self.name, "deletion-cost Lease released"),
                    _ => {
                        tracing::debug!(lease = %self.name, "Lease not released; it expires instead")
                    }
                }
            }
        }
    }

    async fn try_hold(&mut self) -> Result<bool, String> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| e.to_string())?;
        let now = MicroTime(Timestamp::now());
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                let step = self.step(lease.spec.as_ref(), Instant::now());
                if step == Step::Follow {
                    return Ok(false);
                }
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if step == Step::TakeOver {
                    tracing::info!(lease = %self.name, from = ?spec.holder_identity, "taking over the deletion-cost Lease");
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
                spec.renew_time = Some(now);
                // `lease` carries the resourceVersion read: a concurrent writer makes this 409.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(true),
            // Another replica wrote first (created it, or took it over): it leads.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The step for the Lease's `spec` as read at `now`, remembering the other holder's record.
    fn step(&mut self, spec: Option<&LeaseSpec>, now: Instant) -> Step {
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let renew = spec.and_then(|s| s.renew_time.clone());
        let Some(other) = holder.as_deref() else {
            self.observed = None;
            return Step::TakeOver;
        };
        if other == self.identity {
            self.observed = None;
            return Step::Renew;
        }
        let record = (holder.clone(), renew.clone());
        let since = match &self.observed {
            Some((h, r, since)) if (h, r) == (&record.0, &record.1) => *since,
            _ => {
                self.observed = Some((record.0, record.1, now));
                now
            }
        };
        // The holder's own duration when it says one, so that a holder configured otherwise is
        // not cut short.
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .filter(|s| *s > 0)
            .map_or(LEASE_DURATION, |s| Duration::from_secs(s as u64));
        if now.duration_since(since) >= duration {
            Step::TakeOver
        } else {
            Step::Follow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(me: &str) -> LeaderLease {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        LeaderLease::with_identity(Api::namespaced(client, "ns"), "costs", me)
    }

    fn held_by(holder: &str, renewed_secs: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_secs).unwrap())),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[tokio::test]
    async fn ours_is_renewed_and_a_free_one_taken() {
        let mut me = lease("a");
        let t = Instant::now();
        assert_eq!(me.step(Some(&held_by("a", 100)), t), Step::Renew);
        assert_eq!(me.step(None, t), Step::TakeOver);
        let mut released = held_by("b", 100);
        released.holder_identity = None;
        assert_eq!(me.step(Some(&released), t), Step::TakeOver);
    }

    #[tokio::test]
    async fn another_holder_is_followed_until_its_record_stops_changing_for_the_duration() {
        let mut me = lease("a");
        let t = Instant::now();
        assert_eq!(me.step(Some(&held_by("b", 100)), t), Step::Follow);
        // Renewed: the clock starts again, whatever its renew time says about our clock.
        let later = t + Duration::from_secs(10);
        assert_eq!(me.step(Some(&held_by("b", 110)), later), Step::Follow);
        assert_eq!(
            me.step(Some(&held_by("b", 110)), later + Duration::from_secs(14)),
            Step::Follow
        );
        assert_eq!(
            me.step(Some(&held_by("b", 110)), later + Duration::from_secs(15)),
            Step::TakeOver
        );
    }

    #[tokio::test]
    async fn a_holder_with_a_longer_duration_is_not_cut_short() {
        let mut me = lease("a");
        let t = Instant::now();
        let mut long = held_by("b", 100);
        long.lease_duration_seconds = Some(60);
        assert_eq!(me.step(Some(&long), t), Step::Follow);
        assert_eq!(
            me.step(Some(&long), t + Duration::from_secs(30)),
            Step::Follow
        );
        assert_eq!(
            me.step(Some(&long), t + Duration::from_secs(60)),
            Step::TakeOver
        );
    }
}
