//! Kubernetes TokenReview auth against an in-test HTTP server that answers like the API
//! server: allowed, not allowed (403), invalid (401), verdict cache and its expiry, review
//! failures (503, not cached), and the Sentinel's own rotating service-account token.

use crate::common::*;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use std::time::Duration;
use test_kit::fake_kubernetes::FakeKubernetes;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::{keda_get, value_at};
use test_kit::{eventually, TempDir, TestServer};

const KEDA_SA: &str = "system:serviceaccount:keda:astro-agent-keda";
const OTHER_SA: &str = "system:serviceaccount:default:nosy";

// Tokens shaped as every Kubernetes service-account token is (three base64url segments): only
// such tokens are worth a review.
const KEDA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.a2VkYS1ib3VuZA";
const OTHER_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJub3N5In0.b3RoZXItYm91bmQ";
const FORGED_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.Zm9yZ2Vk";
const KEDA_AUDIENCE_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJzZW50aW5lbCJ9.a2VkYS1hdWQ";
const API_AUDIENCE_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJhcGkifQ.YXBpLWF1ZA";

fn yaml(ttl: &str, static_tokens: Option<&std::path::Path>) -> String {
    yaml_with_audiences(ttl, static_tokens, "[]")
}

fn yaml_with_audiences(
    ttl: &str,
    static_tokens: Option<&std::path::Path>,
    audiences: &str,
) -> String {
    let static_line = static_tokens
        .map(|p| format!("  staticTokensFile: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "refreshInterval: 100ms
auth:
{static_line}  tokenReview:
    allowedUsernames: [\"{KEDA_SA}\"]
    audiences: {audiences}
    cacheTtl: {ttl}
workers:
  - {{name: astro-worker-default, queues: [default], syncSlots: 8}}
"
    )
}

struct Setup {
    fake_kube: std::sync::Arc<FakeKubernetes>,
    kube: TestServer,
    _airflow: TestServer,
    dir: TempDir,
    sentinel: astro_sentinel::app::Running,
}

async fn setup(ttl: &str, with_static: bool) -> Setup {
    setup_with_audiences(ttl, with_static, "[]").await
}

async fn setup_with_audiences(ttl: &str, with_static: bool, audiences: &str) -> Setup {
    let (fake, airflow) = fake_airflow().await;
    fake.set("default", 9, 0);
    let fake_kube = FakeKubernetes::with_users(
        "sentinel-own-sa-token",
        &[(KEDA_TOKEN, KEDA_SA), (OTHER_TOKEN, OTHER_SA)],
    );
    let kube = fake_kube.start().await;
    let dir = TempDir::new("tokenreview");
    let token_file = dir.file("token", "sentinel-own-sa-token");
    let static_file = with_static.then(|| dir.file("static", "static-token\n"));
    let access = KubernetesAccess {
        api_url: url::Url::parse(&format!("http://{}", kube.addr)).unwrap(),
        token_file,
        ca_file: dir.0.join("no-ca-needed-for-http"),
    };
    let sentinel = start_against(
        airflow.addr,
        &yaml_with_audiences(ttl, static_file.as_deref(), audiences),
        Some(access),
    )
    .await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;
    Setup {
        fake_kube,
        kube,
        _airflow: airflow,
        dir,
        sentinel,
    }
}

const PATH: &str = "/v1/workers/astro-worker-default";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_forbidden_invalid() {
    let s = setup("60s", false).await;
    let addr = s.sentinel.addr();

    let ok = keda_get(addr, PATH, Some(KEDA_TOKEN)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(value_at(&ok, "backlog"), 9.0);
    assert_eq!(s.fake_kube.seen.lock().unwrap().as_slice(), [KEDA_TOKEN]);

    let forbidden = keda_get(addr, PATH, Some(OTHER_TOKEN)).await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert!(forbidden.json()["error"]
        .as_str()
        .unwrap()
        .contains(OTHER_SA));
    assert!(forbidden.json().get("backlog").is_none());

    let invalid = keda_get(addr, PATH, Some(FORGED_TOKEN)).await;
    assert_eq!(invalid.status, 401, "{}", invalid.body);
    // The API server's reason (which may name the audiences asked for) stays in the log.
    assert_eq!(
        invalid.json(),
        serde_json::json!({"error": "invalid bearer token"})
    );

    let missing = keda_get(addr, PATH, None).await;
    assert_eq!(missing.status, 401);
    let not_a_jwt = keda_get(addr, PATH, Some("not-a-token")).await;
    assert_eq!(not_a_jwt.status, 401, "{}", not_a_jwt.body);
    assert_eq!(
        not_a_jwt.json(),
        serde_json::json!({"error": "invalid bearer token"})
    );
    assert_eq!(
        s.fake_kube.reviews(),
        3,
        "no review without a token, nor for one that is not a JWT"
    );
    assert!(
        s.fake_kube
            .asked_audiences
            .lock()
            .unwrap()
            .iter()
            .all(|a| a.is_empty()),
        "no audiences configured: the reviews name none (the API server's own)"
    );

    let m = keda_get(addr, "/metrics", None).await.body;
    for outcome in ["allowed", "not_allowed", "invalid"] {
        assert!(
            m.contains(&format!(
                "astro_sentinel_token_reviews_total{{outcome=\"{outcome}\"}} 1"
            )),
            "{m}"
        );
    }
    s.sentinel.stop().await;
}

/// KEDA >= 2.21 mints its token for the audience mapped in KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES:
/// the review asks for that audience, so a token for the API server (or anything else) fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audiences_are_asked_for_and_confirmed() {
    let s = setup_with_audiences("60s", false, "[astro-sentinel]").await;
    let addr = s.sentinel.addr();
    s.fake_kube
        .users
        .lock()
        .unwrap()
        .insert(KEDA_AUDIENCE_TOKEN.into(), KEDA_SA.into());
    s.fake_kube
        .token_audiences
        .lock()
        .unwrap()
        .insert(KEDA_AUDIENCE_TOKEN.into(), vec!["astro-sentinel".into()]);

    let ok = keda_get(addr, PATH, Some(KEDA_AUDIENCE_TOKEN)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        s.fake_kube.asked_audiences.lock().unwrap().as_slice(),
        [vec!["astro-sentinel".to_string()]]
    );

    // Same service account, but minted for the API server (KEDA in legacy mode): refused.
    let legacy = keda_get(addr, PATH, Some(KEDA_TOKEN)).await;
    assert_eq!(legacy.status, 401, "{}", legacy.body);

    // An API server that ignores the audiences authenticates the API-server token without
    // naming an audience: that proves nothing about ours, so it is refused too.
    s.fake_kube
        .ignores_audiences
        .store(true, std::sync::atomic::Ordering::SeqCst);
    s.fake_kube
        .users
        .lock()
        .unwrap()
        .insert(API_AUDIENCE_TOKEN.into(), KEDA_SA.into());
    let unconfirmed = keda_get(addr, PATH, Some(API_AUDIENCE_TOKEN)).await;
    assert_eq!(unconfirmed.status, 401, "{}", unconfirmed.body);
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_are_cached_until_the_ttl_ends() {
    let s = setup("700ms", false).await;
    let addr = s.sentinel.addr();
    for _ in 0..5 {
        assert_eq!(keda_get(addr, PATH, Some(KEDA_TOKEN)).await.status, 200);
        assert_eq!(keda_get(addr, PATH, Some(OTHER_TOKEN)).await.status, 403);
        assert_eq!(keda_get(addr, PATH, Some(FORGED_TOKEN)).await.status, 401);
    }
    assert_eq!(
        s.fake_kube.reviews(),
        3,
        "one review per token within the TTL"
    );

    // The API server revokes the KEDA token; once the cached verdict expires, it is refused.
    s.fake_kube.users.lock().unwrap().remove(KEDA_TOKEN);
    let answer = eventually(
        Duration::from_secs(5),
        "the cached verdict to expire",
        || async {
            let a = keda_get(addr, PATH, Some(KEDA_TOKEN)).await;
            (a.status != 200).then_some(a)
        },
    )
    .await;
    assert_eq!(answer.status, 401);
    assert_eq!(s.fake_kube.reviews(), 4);
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_review_is_503_and_not_cached() {
    let s = setup("60s", false).await;
    let addr = s.sentinel.addr();
    *s.fake_kube.broken.lock().unwrap() = Some(500);
    let a = keda_get(addr, PATH, Some(KEDA_TOKEN)).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.json()["error"].as_str().unwrap().contains("verify"));
    assert!(a.json().get("backlog").is_none());
    // Our own credentials refused (e.g. RBAC missing): also 503, never 401 for KEDA's token.
    *s.fake_kube.broken.lock().unwrap() = Some(403);
    assert_eq!(keda_get(addr, PATH, Some(KEDA_TOKEN)).await.status, 503);
    // An API server shedding load: one request, no retry piling onto it.
    *s.fake_kube.broken.lock().unwrap() = Some(429);
    assert_eq!(keda_get(addr, PATH, Some(KEDA_TOKEN)).await.status, 503);
    assert_eq!(s.fake_kube.reviews(), 3);
    *s.fake_kube.broken.lock().unwrap() = None;
    assert_eq!(keda_get(addr, PATH, Some(KEDA_TOKEN)).await.status, 200);
    let m = keda_get(addr, "/metrics", None).await.body;
    assert!(
        m.contains("astro_sentinel_token_reviews_total{outcome=\"error\"} 3"),
        "{m}"
    );
    s.sentinel.stop().await;
}

/// The Sentinel presents the token in its token file (every review in these tests needs it);
/// one the API server does not accept makes KEDA's token unverifiable (503), never invalid.
/// The client re-reads the file at least once a minute, as client-go does, which outpaces the
/// kubelet's rotation (the previous token stays valid for a fifth of its life at least).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_token_the_api_server_refuses_is_503() {
    let s = setup("60s", false).await;
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("default", 1, 0);
    let access = KubernetesAccess {
        api_url: url::Url::parse(&format!("http://{}", s.kube.addr)).unwrap(),
        token_file: s.dir.file("token2", "expired-own-token\n"),
        ca_file: s.dir.0.join("none"),
    };
    let sentinel = start_against(airflow_server.addr, &yaml("60s", None), Some(access)).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;
    let a = keda_get(addr, PATH, Some(KEDA_TOKEN)).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(
        s.fake_kube.seen.lock().unwrap().is_empty(),
        "refused before reading the review"
    );
    sentinel.stop().await;
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_tokens_are_checked_first_without_a_review() {
    let s = setup("60s", true).await;
    let addr = s.sentinel.addr();
    assert_eq!(keda_get(addr, PATH, Some("static-token")).await.status, 200);
    assert_eq!(s.fake_kube.reviews(), 0);
    assert_eq!(keda_get(addr, PATH, Some(KEDA_TOKEN)).await.status, 200);
    assert_eq!(s.fake_kube.reviews(), 1);
    s.sentinel.stop().await;
}
