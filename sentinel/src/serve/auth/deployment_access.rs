//! People with their own Kubernetes token: "anyone who can see the Deployment can open it".
//!
//! A token that no reader rule accepts (not KEDA's) may still be a person's: what `kubectl`
//! sends (`kubectl create token`, an OIDC id token). The API server says who it is (a
//! TokenReview for its own audience) and whether that user may `get` the worker's Deployment
//! in the workers' namespace (a LocalSubjectAccessReview, so the Sentinel needs `create` on
//! them in its own namespace only). A person so allowed reads that worker's backlog and
//! history, and sees only such workers in the list; never the queue-event stream.
//!
//! Identities and decisions are cached by the token's SHA-256 for the configured TTL
//! (refusals for [`REFUSAL_TTL`] at most, so a binding just granted is seen soon). Reviews of
//! tokens not yet known draw on a budget of their own: people are few, and a flood of made-up
//! tokens must neither make the API server work nor spend KEDA's review budget.

use super::static_tokens::{hash, TokenHash};
use super::token_review::{ReviewError, REFUSAL_TTL};
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, ResourceAttributes, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;
use moka::future::Cache;
use moka::Expiry;
use prometheus::IntCounterVec;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_CACHED: u64 = 4096;
/// TokenReviews per second for people's tokens not yet known, once the burst is spent.
pub const PERSON_REVIEWS_PER_SECOND: u32 = 5;
const PERSON_REVIEW_BURST: u32 = 20;

/// Who the API server says a token belongs to.
#[derive(Clone)]
enum Identity {
    Person(UserInfo),
    /// Not authenticated: expired, revoked, made up…
    Invalid(String),
}

pub struct DeploymentAccess {
    namespace: String,
    token_reviews: Api<TokenReview>,
    access_reviews: Api<LocalSubjectAccessReview>,
    identities: Cache<TokenHash, Identity>,
    decisions: Cache<(TokenHash, String), bool>,
    budget: DefaultDirectRateLimiter,
    /// Reviews asked of the API server, by kind (`token`, `access`) and outcome.
    outcomes: IntCounterVec,
}

impl DeploymentAccess {
    pub fn new(
        client: kube::Client,
        namespace: String,
        ttl: Duration,
        outcomes: IntCounterVec,
    ) -> Self {
        DeploymentAccess {
            token_reviews: Api::all(client.clone()),
            access_reviews: Api::namespaced(client, &namespace),
            namespace,
            identities: Cache::builder()
                .max_capacity(MAX_CACHED)
                .expire_after(RefusalsExpireSooner { ttl })
                .build(),
            decisions: Cache::builder()
                .max_capacity(MAX_CACHED)
                .expire_after(RefusalsExpireSooner { ttl })
                .build(),
            budget: RateLimiter::direct(
                Quota::per_second(NonZeroU32::new(PERSON_REVIEWS_PER_SECOND).expect("not zero"))
                    .allow_burst(NonZeroU32::new(PERSON_REVIEW_BURST).expect("not zero")),
            ),
            outcomes,
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The user the API server says `token` belongs to; `None`: nobody (401).
    pub async fn person(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let identity = self
            .identities
            .try_get_with(hash(token), self.review_token(token))
            .await
            .map_err(|shared| ReviewError::clone(&shared))?;
        Ok(match identity {
            Identity::Person(user) => Some(user),
            Identity::Invalid(reason) => {
                tracing::debug!(%reason, "refused a person's bearer token");
                None
            }
        })
    }

    /// Whether `user` (the person of `token`) may `get` the Deployment `deployment`.
    pub async fn may_get(
        &self,
        token: &str,
        user: &UserInfo,
        deployment: &str,
    ) -> Result<bool, ReviewError> {
        self.decisions
            .try_get_with(
                (hash(token), deployment.to_string()),
                self.ask_access(user, deployment),
            )
            .await
            .map_err(|shared| ReviewError::clone(&shared))
    }

    async fn review_token(&self, token: &str) -> Result<Identity, ReviewError> {
        if let Err(not_until) = self.budget.check() {
            return Err(ReviewError::Busy {
                retry_after: not_until.wait_time_from(self.budget.clock().now()),
            });
        }
        // No audiences: the API server's own, the audience of what kubectl sends.
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let review = self
            .ask(
                "token",
                self.token_reviews.create(&PostParams::default(), &request),
            )
            .await?;
        let status = review.status.unwrap_or_default();
        Ok(match status.user {
            Some(user) if status.authenticated == Some(true) => Identity::Person(user),
            _ => Identity::Invalid(
                status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "token not authenticated".into()),
            ),
        })
    }

    async fn ask_access(&self, user: &UserInfo, deployment: &str) -> Result<bool, ReviewError> {
        let request = LocalSubjectAccessReview {
            metadata: kube::api::ObjectMeta {
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(self.namespace.clone()),
                    verb: Some("get".into()),
                    group: Some("apps".into()),
                    resource: Some("deployments".into()),
                    name: Some(deployment.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let review = self
            .ask(
                "access",
                self.access_reviews.create(&PostParams::default(), &request),
            )
            .await?;
        Ok(review.status.is_some_and(|s| s.allowed))
    }

    /// Sends one review, bounded in time, and counts its outcome.
    async fn ask<T>(
        &self,
        kind: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReviewError> {
        let outcome = match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
            Err(_) => Err(format!("{kind} review unanswered after {REVIEW_TIMEOUT:?}")),
            // 401/403 here are about the Sentinel's own credentials or RBAC (it needs
            // `create` on tokenreviews and on localsubjectaccessreviews), not the person's.
            Ok(Err(kube::Error::Api(status))) => Err(format!(
                "{kind} review refused with HTTP {}: {}",
                status.code, status.message
            )),
            Ok(Err(other)) => Err(format!("{kind} review failed: {other}")),
            Ok(Ok(answer)) => Ok(answer),
        };
        let label = if outcome.is_ok() { "answered" } else { "error" };
        self.outcomes.with_label_values(&[kind, label]).inc();
        outcome.map_err(ReviewError::Failed)
    }
}

/// An identity or a granted access lives for the TTL; a refusal for [`REFUSAL_TTL`] at most
/// (a binding just granted is seen soon).
struct RefusalsExpireSooner {
    ttl: Duration,
}

impl RefusalsExpireSooner {
    fn after(&self, refused: bool) -> Option<Duration> {
        Some(if refused {
            self.ttl.min(REFUSAL_TTL)
        } else {
            self.ttl
        })
    }
}

impl Expiry<TokenHash, Identity> for RefusalsExpireSooner {
    fn expire_after_create(
        &self,
        _: &TokenHash,
        identity: &Identity,
        _: Instant,
    ) -> Option<Duration> {
        self.after(matches!(identity, Identity::Invalid(_)))
    }
}

impl Expiry<(TokenHash, String), bool> for RefusalsExpireSooner {
    fn expire_after_create(
        &self,
        _: &(TokenHash, String),
        granted: &bool,
        _: Instant,
    ) -> Option<Duration> {
        self.after(!granted)
    }
}
