//! People with their own Kubernetes token (`auth.kubernetesUsers`) read the workers whose
//! Deployment they may `get`, and only those: the list is filtered, another worker's history
//! is a 403 naming the user, a token nobody vouches for is a 401, KEDA's token still reads
//! everything, and the API server's answers are cached.

use crate::common::*;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use std::sync::atomic::Ordering;
use std::time::Duration;
use test_kit::fake_kubernetes::{service_account_jwt, FakeKubernetes};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{eventually, TempDir};

const NAMESPACE: &str = "astro";
const ALICE: &str = "oidc:alice@example.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_reads_the_workers_whose_deployment_they_may_get() {
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("a", 3, 0);
    airflow.set("b", 1, 0);
    let alice = service_account_jwt(ALICE, "alice");
    let stranger = service_account_jwt("someone", "unknown to the API server");
    let fake_kube = FakeKubernetes::with_users("sentinel-own-sa-token", &[(&alice, ALICE)]);
    fake_kube.grant_deployment(ALICE, NAMESPACE, "astro-worker-a");
    let kube = fake_kube.start().await;
    let dir = TempDir::new("kubernetes-users");
    let access = KubernetesAccess {
        api_url: url::Url::parse(&format!("http://{}", kube.addr)).unwrap(),
        token_file: dir.file("token", "sentinel-own-sa-token"),
        ca_file: dir.0.join("no-ca-needed-for-http"),
    };
    let tokens = dir.file("tokens", "keda-static-token\n");
    let yaml = format!(
        "refreshInterval: 100ms
auth:
  staticTokensFile: {}
  kubernetesUsers: {{cacheTtl: 1m}}
kubernetes: {{namespace: {NAMESPACE}}}
workers:
  - {{name: astro-worker-a, queues: [a], syncSlots: 2}}
  - {{name: astro-worker-b, queues: [b], syncSlots: 2}}
",
        tokens.display()
    );
    let sentinel = start_against(airflow_server.addr, &yaml, Some(access)).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;

    // The list holds only what Alice may get.
    let list = keda_get(addr, "/v1/workers", Some(&alice)).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let names: Vec<String> = list.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["astro-worker-a"]);

    let history = keda_get(
        addr,
        "/v1/workers/astro-worker-a/history?range=15m",
        Some(&alice),
    )
    .await;
    assert_eq!(history.status, 200, "{}", history.body);
    assert_eq!(
        keda_get(addr, "/v1/workers/astro-worker-a", Some(&alice))
            .await
            .status,
        200
    );

    let refused = keda_get(addr, "/v1/workers/astro-worker-b/history", Some(&alice)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(
        refused.json()["error"],
        format!("user {ALICE} may not get Deployment astro-worker-b in namespace {NAMESPACE}")
    );
    // An unknown worker: the person is authenticated, then told it does not exist.
    assert_eq!(
        keda_get(addr, "/v1/workers/nope/history", Some(&alice))
            .await
            .status,
        404
    );
    // A person never opens the agents' wake-up stream.
    assert_eq!(
        keda_get(addr, "/v1/queues/events?queue=a", Some(&alice))
            .await
            .status,
        401
    );

    // A token nobody vouches for, and no token at all.
    let unknown = keda_get(addr, "/v1/workers", Some(&stranger)).await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);
    assert_eq!(keda_get(addr, "/v1/workers", None).await.status, 401);

    // KEDA's token reads every worker, without asking the API server.
    let reviews_before = fake_kube.reviews();
    let keda = keda_get(addr, "/v1/workers", Some("keda-static-token")).await;
    assert_eq!(keda.json()["workers"].as_array().unwrap().len(), 2);
    assert_eq!(
        keda_get(
            addr,
            "/v1/workers/astro-worker-b/history",
            Some("keda-static-token")
        )
        .await
        .status,
        200
    );
    assert_eq!(fake_kube.reviews(), reviews_before);

    // Cached: Alice's next requests ask the API server nothing more.
    let (reviews, access_reviews) = (
        fake_kube.reviews(),
        fake_kube.access_reviews.load(Ordering::SeqCst),
    );
    for _ in 0..5 {
        assert_eq!(
            keda_get(addr, "/v1/workers", Some(&alice)).await.status,
            200
        );
    }
    assert_eq!(fake_kube.reviews(), reviews);
    assert_eq!(
        fake_kube.access_reviews.load(Ordering::SeqCst),
        access_reviews
    );
    // One identity review and one access review per worker, so far.
    assert_eq!((reviews, access_reviews), (2, 2));
}
