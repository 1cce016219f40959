//! A flood of unknown bearer tokens against TokenReview auth: tokens that are not JWTs never
//! reach the API server, JWT-shaped ones cost at most the review budget (the others get 503
//! with Retry-After, never 401), concurrent requests with one token share one review, and
//! KEDA's token is answered throughout — from the cache, and past its TTL through the lane
//! that tokens allowed before keep outside the budget; a token KEDA has just been given is
//! reviewed on the budget of tokens that claim an allowed identity, which the flood does not
//! spend; and a refusal is cached for moments, not for the whole TTL.

use crate::common::*;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use astro_sentinel::serve::auth::token_review::{REFUSAL_TTL, REVIEWS_PER_SECOND, REVIEW_BURST};
use futures_util::future::join_all;
use std::time::{Duration, Instant};
use test_kit::fake_kubernetes::{jwt_shaped, service_account_jwt, FakeKubernetes};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{eventually, Answer, TempDir, TestServer};

const KEDA_SA: &str = "system:serviceaccount:keda:astro-agent-keda";
const KEDA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.a2VkYS1ib3VuZA";
const PATH: &str = "/v1/workers/astro-worker-default";
const FLOOD: usize = 5000;
/// Flood requests in flight at once; KEDA's token is checked between two such rounds.
const ROUND: usize = 100;

struct Setup {
    fake_kube: std::sync::Arc<FakeKubernetes>,
    _kube: TestServer,
    _airflow: TestServer,
    _dir: TempDir,
    sentinel: astro_sentinel::app::Running,
}

async fn setup(ttl: &str) -> Setup {
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("default", 3, 0);
    let fake_kube = FakeKubernetes::with_users("sentinel-own-sa-token", &[(KEDA_TOKEN, KEDA_SA)]);
    let kube = fake_kube.start().await;
    let dir = TempDir::new("flood");
    let access = KubernetesAccess {
        api_url: url::Url::parse(&format!("http://{}", kube.addr)).unwrap(),
        token_file: dir.file("token", "sentinel-own-sa-token"),
        ca_file: dir.0.join("no-ca-needed-for-http"),
    };
    let yaml = format!(
        "refreshInterval: 100ms
auth:
  tokenReview:
    allowedUsernames: [\"{KEDA_SA}\"]
    cacheTtl: {ttl}
workers:
  - {{name: astro-worker-default, queues: [default], syncSlots: 8}}
"
    );
    let sentinel = start_against(airflow_server.addr, &yaml, Some(access)).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;
    Setup {
        fake_kube,
        _kube: kube,
        _airflow: airflow_server,
        _dir: dir,
        sentinel,
    }
}

impl Setup {
    fn keda_reviews(&self) -> usize {
        let seen = self.fake_kube.seen.lock().unwrap();
        seen.iter().filter(|t| t.as_str() == KEDA_TOKEN).count()
    }

    async fn keda_is_answered(&self) {
        let a = keda_get(self.sentinel.addr(), PATH, Some(KEDA_TOKEN)).await;
        assert_eq!(a.status, 200, "KEDA's token during the flood: {}", a.body);
    }

    async fn metric(&self, series: &str) -> u64 {
        let m = keda_get(self.sentinel.addr(), "/metrics", None).await.body;
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// How a round of flood requests was answered.
#[derive(Default)]
struct Tally {
    unauthorized: usize,
    unavailable: usize,
}

impl Tally {
    fn count(&mut self, answers: Vec<Answer>) {
        for a in answers {
            match a.status {
                401 => {
                    assert_eq!(
                        a.json(),
                        serde_json::json!({"error": "invalid bearer token"})
                    );
                    self.unauthorized += 1;
                }
                503 => {
                    let retry_after: u64 = a
                        .header("retry-after")
                        .unwrap_or_else(|| panic!("503 without Retry-After: {a:?}"))
                        .parse()
                        .unwrap();
                    assert!(retry_after >= 1, "{a:?}");
                    self.unavailable += 1;
                }
                _ => panic!("a flood token answered {}: {}", a.status, a.body),
            }
        }
    }
}

async fn round(addr: std::net::SocketAddr, tokens: &[String]) -> Vec<Answer> {
    join_all(tokens.iter().map(|t| keda_get(addr, PATH, Some(t)))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_shaped_flood_costs_bounded_reviews_and_keda_stays_cached() {
    let s = setup("10m").await;
    let addr = s.sentinel.addr();
    s.keda_is_answered().await;
    assert_eq!(s.fake_kube.reviews(), 1);

    let tokens: Vec<String> = (0..FLOOD)
        .map(|i| jwt_shaped(&format!("flood {i}")))
        .collect();
    let mut tally = Tally::default();
    let started = Instant::now();
    for chunk in tokens.chunks(ROUND) {
        tally.count(round(addr, chunk).await);
        s.keda_is_answered().await;
    }
    let elapsed = started.elapsed();
    let flood_reviews = s.fake_kube.reviews() - s.keda_reviews();
    eprintln!(
        "{FLOOD} JWT-shaped tokens in {elapsed:.2?}: {flood_reviews} reviews, {} answered 401, \
         {} answered 503; KEDA's token reviewed {} time(s), answered 200 {} times",
        tally.unauthorized,
        tally.unavailable,
        s.keda_reviews(),
        FLOOD / ROUND
    );
    assert_eq!(
        s.keda_reviews(),
        1,
        "KEDA's verdict stays cached through the flood"
    );
    assert_eq!(
        tally.unauthorized, flood_reviews,
        "401 only for the tokens the API server refused"
    );
    let budget = (REVIEW_BURST + REVIEWS_PER_SECOND * elapsed.as_secs_f64().ceil() as u32) as usize;
    assert!(
        flood_reviews <= budget,
        "{flood_reviews} reviews in {elapsed:?}, over the budget of {budget}"
    );
    assert_eq!(
        s.metric("astro_sentinel_token_reviews_skipped_total{reason=\"rate_limited\"}")
            .await,
        tally.unavailable as u64
    );
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_are_not_jwts_cost_no_review() {
    let s = setup("10m").await;
    let addr = s.sentinel.addr();
    s.keda_is_answered().await;

    let mut tokens: Vec<String> = (0..FLOOD).map(|i| format!("flood-{i}")).collect();
    // Near misses: a segment too few or too many, an empty one, padding, non-base64url bytes.
    tokens.extend(
        [
            "a.b",
            "a.b.c.d",
            "a..c",
            "a.b.",
            "YQ==.Yg.Yw",
            "a.b+c.d",
            "a.b.c/d",
        ]
        .map(String::from),
    );
    let mut tally = Tally::default();
    let started = Instant::now();
    for chunk in tokens.chunks(ROUND) {
        tally.count(round(addr, chunk).await);
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{} tokens that are not JWTs in {elapsed:.2?}: {} reviews, {} answered 401",
        tokens.len(),
        s.fake_kube.reviews() - 1,
        tally.unauthorized
    );
    assert_eq!(tally.unauthorized, tokens.len());
    assert_eq!(s.fake_kube.reviews(), 1, "only KEDA's token was reviewed");
    assert_eq!(
        s.metric("astro_sentinel_token_reviews_skipped_total{reason=\"not_jwt\"}")
            .await,
        tokens.len() as u64
    );
    s.keda_is_answered().await;
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_one_token_share_a_review() {
    let s = setup("10m").await;
    let addr = s.sentinel.addr();
    s.fake_kube.answering.send_replace(false);
    let requests = tokio::spawn(join_all(
        (0..20).map(move |_| keda_get(addr, PATH, Some(KEDA_TOKEN))),
    ));
    eventually(Duration::from_secs(5), "the first review", || async {
        (s.fake_kube.reviews() >= 1).then_some(())
    })
    .await;
    // Unmerged, the other requests' reviews arrive within moments of the first; merged, none
    // ever does, so this can only wait a bounded time for it not to happen.
    let second = tokio::time::timeout(
        Duration::from_millis(500),
        eventually(Duration::from_secs(5), "a second review", || async {
            (s.fake_kube.reviews() > 1).then_some(())
        }),
    )
    .await;
    assert!(
        second.is_err(),
        "{} reviews for one token",
        s.fake_kube.reviews()
    );
    s.fake_kube.answering.send_replace(true);
    for a in requests.await.unwrap() {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    assert_eq!(s.fake_kube.reviews(), 1);
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_is_reviewed_past_its_ttl_while_the_flood_spends_the_budget() {
    let s = setup("1s").await;
    let addr = s.sentinel.addr();
    s.keda_is_answered().await;
    let mut flood_round = flood_rounds();
    spend_the_budget(addr, &mut flood_round).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Keep it spent until KEDA's verdict has expired and been renewed.
    while s.keda_reviews() < 2 {
        let mut tally = Tally::default();
        tally.count(round(addr, &flood_round()).await);
        assert!(
            tally.unavailable > 0,
            "the budget recovered during the flood"
        );
        s.keda_is_answered().await;
        assert!(
            Instant::now() < deadline,
            "KEDA's verdict was never renewed"
        );
    }
    s.sentinel.stop().await;
}

/// Flood rounds of fresh JWT-shaped tokens, each round different.
fn flood_rounds() -> impl FnMut() -> Vec<String> {
    let mut next = 0;
    move || {
        next += 1;
        (0..ROUND)
            .map(|i| jwt_shaped(&format!("round {next} token {i}")))
            .collect()
    }
}

/// Sends flood rounds until one is answered 503: the budget of unknown tokens is spent.
async fn spend_the_budget(
    addr: std::net::SocketAddr,
    flood_round: &mut impl FnMut() -> Vec<String>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut tally = Tally::default();
        tally.count(round(addr, &flood_round()).await);
        if tally.unavailable > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the review budget was never spent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_keda_was_just_given_is_reviewed_ahead_of_the_flood() {
    let s = setup("10m").await;
    let addr = s.sentinel.addr();
    s.keda_is_answered().await;
    let mut flood_round = flood_rounds();
    spend_the_budget(addr, &mut flood_round).await;

    // KEDA's token is re-minted (or KEDA restarted): a token nobody vouched for yet.
    for rotation in 0..3 {
        let new_token = service_account_jwt(KEDA_SA, &format!("rotation {rotation}"));
        s.fake_kube
            .users
            .lock()
            .unwrap()
            .insert(new_token.clone(), KEDA_SA.into());
        let flood_tokens = flood_round();
        let mut tally = Tally::default();
        let (flood, keda) = tokio::join!(
            round(addr, &flood_tokens),
            keda_get(addr, PATH, Some(&new_token))
        );
        tally.count(flood);
        assert!(
            tally.unavailable > 0,
            "the budget recovered during the flood"
        );
        assert_eq!(
            keda.status, 200,
            "KEDA's new token during the flood, at once: {}",
            keda.body
        );
    }
    s.sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_cached_for_moments_not_for_the_ttl() {
    let s = setup("10m").await;
    let addr = s.sentinel.addr();
    // A token the API server does not know yet, say one minted a moment ago.
    let early = service_account_jwt(KEDA_SA, "minted just now");
    for _ in 0..3 {
        let a = keda_get(addr, PATH, Some(&early)).await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    assert_eq!(s.fake_kube.reviews(), 1, "the refusal is cached");
    let refused = Instant::now();
    s.fake_kube
        .users
        .lock()
        .unwrap()
        .insert(early.clone(), KEDA_SA.into());
    eventually(REFUSAL_TTL * 3, "the refusal to expire", || async {
        (keda_get(addr, PATH, Some(&early)).await.status == 200).then_some(())
    })
    .await;
    let waited = refused.elapsed();
    eprintln!("refused, then accepted {waited:.2?} later (TTL 10m)");
    assert!(
        waited >= REFUSAL_TTL - Duration::from_millis(500),
        "{waited:?}"
    );
    assert_eq!(s.fake_kube.reviews(), 2);
    s.sentinel.stop().await;
}
