//! The external scaler RPCs. A ScaledObject names its worker in the trigger's metadata
//! (`worker: <name>`); the metric is the worker's backlog (`queued + running`), or the slots
//! pre-warm expects when more, with `syncSlots` as the target per replica, so the HPA computes
//! the same `ceil(max(backlog, expectedSlots) / syncSlots)` as with the `metrics-api`
//! triggers.

use super::proto::external_scaler_server::ExternalScaler;
use super::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use crate::backlog::cache::{BacklogCache, Snapshot};
use crate::backlog::worker_view::{worker_answer, WorkerAnswer, WorkerBacklog};
use crate::config::file::WorkerConfig;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The trigger metadata key that names the worker.
pub const WORKER_KEY: &str = "worker";
/// The optional trigger metadata key: the backlog must exceed it for the worker to be active
/// (KEDA's `activationTargetValue`; default 0).
pub const ACTIVATION_KEY: &str = "activationTargetValue";
/// The metric's name (KEDA prefixes it with `s<trigger index>-`).
pub const METRIC_NAME: &str = "backlog";

/// How often an open stream re-checks its worker between refreshes: a value turns stale with
/// time alone, when refreshes stop arriving.
const RECHECK: Duration = Duration::from_secs(1);

pub struct ExternalScalerService {
    workers: HashMap<String, WorkerConfig>,
    cache: Arc<BacklogCache>,
    staleness_limit: Duration,
    /// Cancelled when the Sentinel stops: open streams end so that shutdown is not held.
    shutdown: CancellationToken,
}

/// The worker a request is about, and its activation threshold.
#[derive(Clone)]
struct Target {
    worker: WorkerConfig,
    activation: f64,
}

impl ExternalScalerService {
    pub fn new(
        workers: &[WorkerConfig],
        cache: Arc<BacklogCache>,
        staleness_limit: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        ExternalScalerService {
            workers: workers
                .iter()
                .map(|w| (w.name.clone(), w.clone()))
                .collect(),
            cache,
            staleness_limit,
            shutdown,
        }
    }

    fn target(&self, scaled_object: Option<&ScaledObjectRef>) -> Result<Target, Status> {
        let metadata = scaled_object.map(|r| &r.scaler_metadata);
        let name = metadata
            .and_then(|m| m.get(WORKER_KEY))
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "scalerMetadata.{WORKER_KEY}: missing: the trigger's metadata must name the Sentinel worker"
                ))
            })?;
        let worker = self
            .workers
            .get(name)
            .ok_or_else(|| Status::not_found(format!("unknown worker {name:?}")))?;
        let activation = match metadata.and_then(|m| m.get(ACTIVATION_KEY)) {
            None => 0.0,
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "scalerMetadata.{ACTIVATION_KEY}: must be a number >= 0, got {text:?}"
                    ))
                })?,
        };
        Ok(Target {
            worker: worker.clone(),
            activation,
        })
    }
}

/// The worker's backlog from `snapshot`, or `UNAVAILABLE` — never a made-up 0.
fn backlog(
    worker: &WorkerConfig,
    snapshot: &Snapshot,
    staleness_limit: Duration,
) -> Result<WorkerBacklog, Status> {
    match worker_answer(worker, snapshot, Instant::now(), staleness_limit) {
        WorkerAnswer::Ready(b) => Ok(b),
        WorkerAnswer::Unavailable(u) => Err(Status::unavailable(u.error)),
    }
}

fn is_active(
    target: &Target,
    snapshot: &Snapshot,
    staleness_limit: Duration,
) -> Result<bool, Status> {
    let b = backlog(&target.worker, snapshot, staleness_limit)?;
    // The work decides, not the headroom riding on it: the same wake-up as without headroom.
    Ok(b.work_slots() as f64 > target.activation)
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for ExternalScalerService {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        let result = is_active(&target, &self.cache.snapshot(), self.staleness_limit)?;
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = ActivityStream;

    /// Sends the worker's activity when the stream opens, then again at each refresh that
    /// changes it; ends with `UNAVAILABLE` when the worker's backlog becomes unknown (KEDA
    /// reopens the stream after a pause), and when the Sentinel stops.
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        let mut refreshes = self.cache.subscribe();
        let first = is_active(
            &target,
            &refreshes.borrow_and_update(),
            self.staleness_limit,
        )?;
        let (tx, rx) = mpsc::channel(1);
        let staleness_limit = self.staleness_limit;
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut last = first;
            if tx
                .send(Ok(IsActiveResponse { result: last }))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    changed = refreshes.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(RECHECK) => {}
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("the Sentinel is stopping"))).await;
                        return;
                    }
                    _ = tx.closed() => return,
                }
                let now = is_active(&target, &refreshes.borrow_and_update(), staleness_limit);
                match now {
                    Ok(active) if active == last => {}
                    Ok(active) => {
                        last = active;
                        tracing::debug!(worker = %target.worker.name, active, "pushing activity");
                        if tx
                            .send(Ok(IsActiveResponse { result: active }))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        let slots = target.worker.sync_slots.max(1);
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: METRIC_NAME.into(),
                target_size: i64::from(slots),
                target_size_float: f64::from(slots),
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let request = request.get_ref();
        let target = self.target(request.scaled_object_ref.as_ref())?;
        let b = backlog(&target.worker, &self.cache.snapshot(), self.staleness_limit)?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: METRIC_NAME.into(),
                metric_value: i64::try_from(b.scaling_slots).unwrap_or(i64::MAX),
                metric_value_float: b.scaling_slots as f64,
            }],
        }))
    }

    type StreamMetricSpecStream =
        Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

    /// The target per replica is fixed by the configuration: KEDA falls back to GetMetricSpec.
    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        Err(Status::unimplemented(
            "the metric spec changes only with the configuration; use GetMetricSpec",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::QueueBacklog;
    use std::time::SystemTime;
    use tokio_stream::StreamExt;
    use tonic::Code;

    const LIMIT: Duration = Duration::from_secs(30);

    fn worker(name: &str, queue: &str) -> WorkerConfig {
        WorkerConfig {
            name: name.into(),
            queues: vec![queue.into()],
            sync_slots: 4,
            min_replicas: 0,
            max_replicas: 10,
            overprovision_slots: 0,
        }
    }

    fn snapshot(queued: u64, age: Duration) -> Snapshot {
        let mut s = Snapshot::empty(&["q".to_string()]);
        let backlog = QueueBacklog {
            queued_tasks: queued,
            queued_slots: queued,
            ..QueueBacklog::default()
        };
        s.record("q", Ok(backlog), Instant::now() - age, SystemTime::now());
        s
    }

    struct Fixture {
        service: ExternalScalerService,
        cache: Arc<BacklogCache>,
        stop: CancellationToken,
    }

    fn fixture() -> Fixture {
        fixture_for(worker("w", "q"))
    }

    fn fixture_for(w: WorkerConfig) -> Fixture {
        let cache = Arc::new(BacklogCache::new(Snapshot::empty(&["q".to_string()])));
        let stop = CancellationToken::new();
        let service = ExternalScalerService::new(&[w], cache.clone(), LIMIT, stop.clone());
        Fixture {
            service,
            cache,
            stop,
        }
    }

    fn scaled_object(meta: &[(&str, &str)]) -> ScaledObjectRef {
        ScaledObjectRef {
            name: "so".into(),
            namespace: "ns".into(),
            scaler_metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn for_w() -> Request<ScaledObjectRef> {
        Request::new(scaled_object(&[(WORKER_KEY, "w")]))
    }

    async fn active(f: &Fixture, meta: &[(&str, &str)]) -> Result<bool, Status> {
        let r = f
            .service
            .is_active(Request::new(scaled_object(meta)))
            .await?;
        Ok(r.into_inner().result)
    }

    async fn metric(f: &Fixture) -> Result<f64, Status> {
        let request = GetMetricsRequest {
            scaled_object_ref: Some(scaled_object(&[(WORKER_KEY, "w")])),
            metric_name: METRIC_NAME.into(),
        };
        let r = f.service.get_metrics(Request::new(request)).await?;
        Ok(r.into_inner().metric_values[0].metric_value_float)
    }

    #[tokio::test]
    async fn pre_warm_activates_and_the_metric_is_the_larger_of_backlog_and_expected() {
        use crate::schedule::windows::Expected;
        let f = fixture();
        let w = [(WORKER_KEY, "w")];
        // Worker w's backlog, with 3 slots expected for a run about to be due.
        let pre_warmed = |backlog| {
            let mut s = snapshot(backlog, Duration::ZERO);
            let expected = Expected {
                slots: 3,
                runs: Vec::new(),
            };
            s.set_expected([("w".to_string(), expected)].into());
            s
        };
        f.cache.publish(pre_warmed(0));
        assert!(active(&f, &w).await.unwrap());
        assert_eq!(metric(&f).await.unwrap(), 3.0);
        f.cache.publish(pre_warmed(5));
        assert_eq!(metric(&f).await.unwrap(), 5.0, "max, not sum");
    }

    #[tokio::test]
    async fn headroom_is_in_the_metric_and_the_work_alone_decides_activity() {
        let mut spare = worker("w", "q");
        spare.overprovision_slots = 4;
        let f = fixture_for(spare);
        let threshold = [(WORKER_KEY, "w"), (ACTIVATION_KEY, "2")];
        f.cache.publish(snapshot(0, Duration::ZERO));
        assert!(!active(&f, &threshold).await.unwrap());
        assert_eq!(metric(&f).await.unwrap(), 0.0, "no work, no headroom");
        f.cache.publish(snapshot(2, Duration::ZERO));
        assert!(
            !active(&f, &threshold).await.unwrap(),
            "2 slots of work are not above 2"
        );
        assert_eq!(metric(&f).await.unwrap(), 6.0);
        f.cache.publish(snapshot(3, Duration::ZERO));
        assert!(active(&f, &threshold).await.unwrap());
        assert_eq!(metric(&f).await.unwrap(), 7.0);
    }

    #[tokio::test]
    async fn answers_the_backlog_and_activity_of_the_named_worker() {
        let f = fixture();
        let w = [(WORKER_KEY, "w")];
        f.cache.publish(snapshot(0, Duration::ZERO));
        assert!(!active(&f, &w).await.unwrap());
        assert_eq!(metric(&f).await.unwrap(), 0.0);
        f.cache.publish(snapshot(7, Duration::ZERO));
        assert!(active(&f, &w).await.unwrap());
        assert_eq!(metric(&f).await.unwrap(), 7.0);
        let threshold = [(WORKER_KEY, "w"), (ACTIVATION_KEY, "7")];
        assert!(!active(&f, &threshold).await.unwrap(), "7 is not above 7");

        let spec = f.service.get_metric_spec(for_w()).await.unwrap();
        let spec = &spec.get_ref().metric_specs[0];
        assert_eq!(
            (spec.metric_name.as_str(), spec.target_size_float),
            (METRIC_NAME, 4.0)
        );
    }

    #[tokio::test]
    async fn an_unknown_backlog_is_an_error_never_inactive() {
        let f = fixture();
        let w = [(WORKER_KEY, "w")];
        assert_eq!(
            active(&f, &w).await.unwrap_err().code(),
            Code::Unavailable,
            "not loaded"
        );
        f.cache.publish(snapshot(0, LIMIT + Duration::from_secs(1)));
        let stale = active(&f, &w).await.unwrap_err();
        assert_eq!(stale.code(), Code::Unavailable);
        assert!(stale.message().contains("stale"), "{}", stale.message());
        assert_eq!(metric(&f).await.unwrap_err().code(), Code::Unavailable);
        let stream = f.service.stream_is_active(for_w()).await;
        assert_eq!(stream.err().map(|s| s.code()), Some(Code::Unavailable));
    }

    #[tokio::test]
    async fn bad_metadata_names_the_field() {
        let f = fixture();
        f.cache.publish(snapshot(0, Duration::ZERO));
        let missing = active(&f, &[]).await.unwrap_err();
        assert_eq!(missing.code(), Code::InvalidArgument);
        assert!(missing.message().starts_with("scalerMetadata.worker:"));
        let unknown = active(&f, &[(WORKER_KEY, "x")]).await.unwrap_err();
        assert_eq!(unknown.code(), Code::NotFound);
        let bad = active(&f, &[(WORKER_KEY, "w"), (ACTIVATION_KEY, "-1")]).await;
        let bad = bad.unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
        assert!(bad
            .message()
            .starts_with("scalerMetadata.activationTargetValue:"));
    }

    /// With the clock paused, a 10 ms timeout fires long before the stream's 1 s re-check: an
    /// item that arrives within it was pushed by the publication itself.
    async fn next_pushed(stream: &mut ActivityStream) -> Option<Result<bool, Code>> {
        tokio::time::timeout(Duration::from_millis(10), stream.next())
            .await
            .ok()
            .flatten()
            .map(|r| r.map(|a| a.result).map_err(|s| s.code()))
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_pushes_each_change_at_the_refresh_that_sees_it() {
        let f = fixture();
        f.cache.publish(snapshot(0, Duration::ZERO));
        let mut stream = f
            .service
            .stream_is_active(for_w())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(next_pushed(&mut stream).await, Some(Ok(false)), "on open");
        f.cache.publish(snapshot(0, Duration::ZERO));
        assert!(
            next_pushed(&mut stream).await.is_none(),
            "no change, nothing sent"
        );
        f.cache.publish(snapshot(3, Duration::ZERO));
        assert_eq!(next_pushed(&mut stream).await, Some(Ok(true)));
        f.cache.publish(snapshot(5, Duration::ZERO));
        assert!(next_pushed(&mut stream).await.is_none(), "still active");
        f.cache.publish(snapshot(0, Duration::ZERO));
        assert_eq!(next_pushed(&mut stream).await, Some(Ok(false)));

        f.cache.publish(snapshot(0, LIMIT + Duration::from_secs(1)));
        let stale = next_pushed(&mut stream).await;
        assert_eq!(stale, Some(Err(Code::Unavailable)), "stale ends the stream");
        assert!(stream.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_stream_ends_when_the_sentinel_stops() {
        let f = fixture();
        f.cache.publish(snapshot(1, Duration::ZERO));
        let mut stream = f
            .service
            .stream_is_active(for_w())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(next_pushed(&mut stream).await, Some(Ok(true)));
        f.stop.cancel();
        assert_eq!(next_pushed(&mut stream).await, Some(Err(Code::Unavailable)));
        assert!(stream.next().await.is_none());
    }
}
