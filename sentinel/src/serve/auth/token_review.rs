//! Kubernetes TokenReview for KEDA's bound service-account tokens.
//!
//! The presented token is sent in a TokenReview through the Sentinel's Kubernetes client
//! ([`crate::kubernetes_client::review_client`]), as its own service account. With `audiences`
//! configured the review asks for them (KEDA >= 2.21 mints its tokens for the audience mapped
//! in `KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES`), so a token minted for another service — or for
//! the API server itself — does not pass; without, the API server checks its own audience
//! (KEDA in `legacy` token mode, or before 2.21).
//! Only `status.authenticated == true` with `status.user.username` in the allow-list passes,
//! and, when audiences were asked for, `status.audiences` must name one of them: an API server
//! that ignored the audiences would answer without, and its "authenticated" proves nothing.
//!
//! Verdicts are cached by the token's SHA-256 for a short TTL (well under the one-hour life of
//! KEDA's tokens), so KEDA's polling costs the API server one review per token per TTL. A
//! refusal (401, 403) is cached for [`REFUSAL_TTL`] at most: long enough that repeating a
//! refused token costs no review per request, short enough that a token the API server did not
//! know yet (a token minted a moment ago, an allow-list being fixed) is not refused for a whole
//! TTL. A failed review (API server unreachable, our own credentials refused) is not cached.
//!
//! Unknown tokens cannot make the API server work for anyone who can reach the port: a token
//! that is not JWT-shaped is refused without a review; concurrent requests with one token share
//! one review; reviews of tokens never allowed before draw on a budget of
//! [`REVIEWS_PER_SECOND`] (bursts of [`REVIEW_BURST`]), and past it the request is answered
//! 503 with Retry-After — the token could not be checked, which says nothing against it. A
//! token allowed before is re-reviewed outside the budget when its verdict expires, so a flood
//! cannot lock KEDA out. Nor can it lock out a token KEDA has just been given (its bound tokens
//! are re-minted every hour, and after a restart no token is known): a token whose unverified
//! payload claims an allowed username (`claimed_username`) is reviewed on a budget of its own,
//! the same size, which the flood of tokens that claim nobody does not touch. The claim only
//! picks the lane; the review decides. The cache is bounded and evicts single entries (least
//! recently used, behind a frequency filter that keeps a token seen once from displacing one
//! read at every poll), never the whole cache.

use super::claimed_username::claimed_username;
use super::jwt_shape::is_jwt_shaped;
use super::static_tokens::{hash, TokenHash};
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::Api;
use moka::future::Cache;
use moka::Expiry;
use prometheus::IntCounterVec;
use std::collections::HashSet;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds the verdict cache (a flood of random tokens cannot grow memory).
const MAX_CACHED_VERDICTS: u64 = 4096;
/// Reviews per second for tokens never allowed before, once a burst is spent.
pub const REVIEWS_PER_SECOND: u32 = 20;
/// Reviews that may go out at once, e.g. for every ScaledObject's token when KEDA starts.
pub const REVIEW_BURST: u32 = 100;
/// How long a refusal (401, 403) is cached, at most.
pub const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// How many allowed tokens keep their place outside the budget, and for how long unused.
const MAX_VOUCHED_TOKENS: u64 = 1024;
const VOUCHED_IDLE: Duration = Duration::from_secs(3600);

/// What the API server said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, and the username is on the list.
    Allowed { username: String },
    /// Authenticated, but the username is not on the list (→ 403).
    NotAllowed { username: String },
    /// Not authenticated: expired, revoked, forged… (→ 401).
    Invalid { reason: String },
}

/// Why a token could not be checked (the caller answers 503; nothing is cached).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The review budget is spent; it allows another review after this long.
    #[error("too many unknown tokens to review; the budget allows another in {retry_after:?}")]
    Busy { retry_after: Duration },
    /// The review itself failed: API server unreachable, our own credentials refused...
    #[error("{0}")]
    Failed(String),
}

/// Counters of [`TokenReviewer`]'s work.
pub struct ReviewCounters {
    /// Reviews asked of the API server, by outcome.
    pub outcomes: IntCounterVec,
    /// Tokens answered without a review, by reason (`not_jwt`, `rate_limited`).
    pub skipped: IntCounterVec,
}

pub struct TokenReviewer {
    api: Api<TokenReview>,
    allowed: HashSet<String>,
    audiences: Vec<String>,
    verdicts: Cache<TokenHash, Verdict>,
    /// Tokens the last review allowed: their re-reviews skip the budgets.
    vouched: Cache<TokenHash, ()>,
    /// Reviews of tokens that claim no allowed username.
    budget: DefaultDirectRateLimiter,
    /// Reviews of tokens that claim an allowed username (unverified until reviewed).
    claimed_budget: DefaultDirectRateLimiter,
    counters: ReviewCounters,
}

impl TokenReviewer {
    pub fn new(
        client: kube::Client,
        allowed_usernames: &[String],
        audiences: &[String],
        ttl: Duration,
        counters: ReviewCounters,
    ) -> Self {
        TokenReviewer {
            api: Api::all(client),
            allowed: allowed_usernames.iter().cloned().collect(),
            audiences: audiences.to_vec(),
            verdicts: Cache::builder()
                .max_capacity(MAX_CACHED_VERDICTS)
                .expire_after(VerdictExpiry { ttl })
                .build(),
            vouched: Cache::builder()
                .max_capacity(MAX_VOUCHED_TOKENS)
                .time_to_idle(VOUCHED_IDLE)
                .build(),
            budget: review_budget(),
            claimed_budget: review_budget(),
            counters,
        }
    }

    /// The verdict on `token`: from the cache when a fresh one is there, else from one review
    /// shared by every request that asks meanwhile.
    pub async fn review(&self, token: &str) -> Result<Verdict, ReviewError> {
        if !is_jwt_shaped(token) {
            self.counters.skipped.with_label_values(&["not_jwt"]).inc();
            return Ok(Verdict::Invalid {
                reason: "not a JWT".into(),
            });
        }
        let key = hash(token);
        self.verdicts
            .try_get_with(key, self.review_now(key, token))
            .await
            .map_err(|shared| ReviewError::clone(&shared))
    }

    async fn review_now(&self, key: TokenHash, token: &str) -> Result<Verdict, ReviewError> {
        if self.vouched.get(&key).await.is_none() {
            let budget = match claimed_username(token) {
                Some(claimed) if self.allowed.contains(&claimed) => &self.claimed_budget,
                _ => &self.budget,
            };
            if let Err(not_until) = budget.check() {
                self.counters
                    .skipped
                    .with_label_values(&["rate_limited"])
                    .inc();
                return Err(ReviewError::Busy {
                    retry_after: not_until.wait_time_from(budget.clock().now()),
                });
            }
        }
        let verdict = match self.ask(token).await {
            Ok(v) => v,
            Err(e) => {
                self.counters.outcomes.with_label_values(&["error"]).inc();
                return Err(ReviewError::Failed(e));
            }
        };
        let outcome = match &verdict {
            Verdict::Allowed { .. } => "allowed",
            Verdict::NotAllowed { .. } => "not_allowed",
            Verdict::Invalid { .. } => "invalid",
        };
        self.counters.outcomes.with_label_values(&[outcome]).inc();
        if matches!(verdict, Verdict::Allowed { .. }) {
            self.vouched.insert(key, ()).await;
        } else {
            self.vouched.invalidate(&key).await;
        }
        Ok(verdict)
    }

    async fn ask(&self, token: &str) -> Result<Verdict, String> {
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let review = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.api.create(&PostParams::default(), &request),
        )
        .await
        .map_err(|_| format!("TokenReview unanswered after {REVIEW_TIMEOUT:?}"))?
        .map_err(|e| match e {
            // 401/403 here are about the Sentinel's own credentials or RBAC (it needs
            // `create` on tokenreviews), not about the token under review.
            kube::Error::Api(status) => format!(
                "TokenReview refused with HTTP {}: {}",
                status.code, status.message
            ),
            other => format!("TokenReview request failed: {other}"),
        })?;
        let status = review.status.unwrap_or_default();
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        let confirmed = status.audiences.unwrap_or_default();
        Ok(if status.authenticated != Some(true) {
            Verdict::Invalid {
                reason: status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "token not authenticated".into()),
            }
        } else if !self.audiences.is_empty()
            && !confirmed.iter().any(|a| self.audiences.contains(a))
        {
            Verdict::Invalid {
                reason: format!(
                    "the review did not confirm audience {:?} (it answered {confirmed:?})",
                    self.audiences
                ),
            }
        } else if self.allowed.contains(&username) {
            Verdict::Allowed { username }
        } else {
            Verdict::NotAllowed { username }
        })
    }
}

fn review_budget() -> DefaultDirectRateLimiter {
    RateLimiter::direct(
        Quota::per_second(NonZeroU32::new(REVIEWS_PER_SECOND).expect("not zero"))
            .allow_burst(NonZeroU32::new(REVIEW_BURST).expect("not zero")),
    )
}

/// An allowed verdict lives for the TTL; a refusal for [`REFUSAL_TTL`] at most.
struct VerdictExpiry {
    ttl: Duration,
}

impl Expiry<TokenHash, Verdict> for VerdictExpiry {
    fn expire_after_create(
        &self,
        _token: &TokenHash,
        verdict: &Verdict,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(match verdict {
            Verdict::Allowed { .. } => self.ttl,
            Verdict::NotAllowed { .. } | Verdict::Invalid { .. } => self.ttl.min(REFUSAL_TTL),
        })
    }
}
