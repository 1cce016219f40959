//! Kubernetes TokenReview for KEDA's bound service-account tokens.
//!
//! The presented token is POSTed to `/apis/authentication.k8s.io/v1/tokenreviews` with the
//! Sentinel's own service-account token, which is re-read for every review because the kubelet
//! rotates it. With `audiences` configured the review asks for them (KEDA >= 2.21 mints its
//! tokens for the audience mapped in `KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES`), so a token minted
//! for another service — or for the API server itself — does not pass; without, the API
//! server checks its own audience (KEDA in `legacy` token mode, or before 2.21).
//! Only `status.authenticated == true` with `status.user.username` in the allow-list passes,
//! and, when audiences were asked for, `status.audiences` must name one of them: an API server
//! that ignored the audiences would answer without, and its "authenticated" proves nothing.
//!
//! Verdicts are cached by the token's SHA-256 for a short TTL (well under the one-hour life of
//! KEDA's tokens), so KEDA's polling costs the API server one review per token per TTL. A
//! failed review (API server unreachable, our own credentials refused) is not cached.
//!
//! Unknown tokens cannot make the API server work for anyone who can reach the port: a token
//! that is not JWT-shaped is refused without a review; concurrent requests with one token share
//! one review; reviews of tokens never allowed before draw on a budget of
//! [`REVIEWS_PER_SECOND`] (bursts of [`REVIEW_BURST`]), and past it the request is answered
//! 503 with Retry-After — the token could not be checked, which says nothing against it. A
//! token allowed before is re-reviewed outside the budget when its verdict expires, so a flood
//! cannot lock KEDA out. The cache is bounded and evicts single entries (least recently used,
//! behind a frequency filter that keeps a token seen once from displacing one read at every
//! poll), never the whole cache.

use super::jwt_shape::is_jwt_shaped;
use super::static_tokens::{hash, TokenHash};
use crate::settings::KubernetesAccess;
use governor::clock::Clock;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use moka::future::Cache;
use prometheus::IntCounterVec;
use serde::Deserialize;
use std::collections::HashSet;
use std::num::NonZeroU32;
use std::time::Duration;
use url::Url;

const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds the verdict cache (a flood of random tokens cannot grow memory).
const MAX_CACHED_VERDICTS: u64 = 4096;
/// Reviews per second for tokens never allowed before, once a burst is spent.
pub const REVIEWS_PER_SECOND: u32 = 20;
/// Reviews that may go out at once, e.g. for every ScaledObject's token when KEDA starts.
pub const REVIEW_BURST: u32 = 100;
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
    http: reqwest::Client,
    url: Url,
    token_file: std::path::PathBuf,
    allowed: HashSet<String>,
    audiences: Vec<String>,
    verdicts: Cache<TokenHash, Verdict>,
    /// Tokens the last review allowed: their re-reviews skip the budget.
    vouched: Cache<TokenHash, ()>,
    budget: DefaultDirectRateLimiter,
    counters: ReviewCounters,
}

#[derive(Deserialize)]
struct Review {
    #[serde(default)]
    status: ReviewStatus,
}

#[derive(Deserialize, Default)]
struct ReviewStatus {
    #[serde(default)]
    authenticated: bool,
    #[serde(default)]
    user: ReviewUser,
    #[serde(default)]
    error: String,
    #[serde(default)]
    audiences: Vec<String>,
}

#[derive(Deserialize, Default)]
struct ReviewUser {
    #[serde(default)]
    username: String,
}

impl TokenReviewer {
    pub fn new(
        access: &KubernetesAccess,
        allowed_usernames: &[String],
        audiences: &[String],
        ttl: Duration,
        counters: ReviewCounters,
    ) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(REVIEW_TIMEOUT)
            .connect_timeout(REVIEW_TIMEOUT)
            .user_agent(concat!("astro-sentinel/", env!("CARGO_PKG_VERSION")));
        if access.api_url.scheme() == "https" {
            let pem = std::fs::read(&access.ca_file)
                .map_err(|e| format!("--kubernetes-ca-file {}: {e}", access.ca_file.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("--kubernetes-ca-file {}: {e}", access.ca_file.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "--kubernetes-ca-file {}: no certificate in the file",
                    access.ca_file.display()
                ));
            }
            // Trust the cluster CA only, not the public roots.
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot build the Kubernetes API client: {e}"))?;
        let mut url = access.api_url.clone();
        url.path_segments_mut()
            .map_err(|_| format!("--kubernetes-api-url {}: not a base URL", access.api_url))?
            .pop_if_empty()
            .extend(["apis", "authentication.k8s.io", "v1", "tokenreviews"]);
        Ok(TokenReviewer {
            http,
            url,
            token_file: access.token_file.clone(),
            allowed: allowed_usernames.iter().cloned().collect(),
            audiences: audiences.to_vec(),
            verdicts: Cache::builder()
                .max_capacity(MAX_CACHED_VERDICTS)
                .time_to_live(ttl)
                .build(),
            vouched: Cache::builder()
                .max_capacity(MAX_VOUCHED_TOKENS)
                .time_to_idle(VOUCHED_IDLE)
                .build(),
            budget: RateLimiter::direct(
                Quota::per_second(NonZeroU32::new(REVIEWS_PER_SECOND).expect("not zero"))
                    .allow_burst(NonZeroU32::new(REVIEW_BURST).expect("not zero")),
            ),
            counters,
        })
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
            if let Err(not_until) = self.budget.check() {
                self.counters
                    .skipped
                    .with_label_values(&["rate_limited"])
                    .inc();
                return Err(ReviewError::Busy {
                    retry_after: not_until.wait_time_from(self.budget.clock().now()),
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
        let own_token = std::fs::read_to_string(&self.token_file).map_err(|e| {
            format!(
                "cannot read the Sentinel's service-account token {}: {e}",
                self.token_file.display()
            )
        })?;
        let mut spec = serde_json::json!({"token": token});
        if !self.audiences.is_empty() {
            spec["audiences"] = serde_json::json!(self.audiences);
        }
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
        });
        let response = self
            .http
            .post(self.url.clone())
            .bearer_auth(own_token.trim())
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("TokenReview request failed: {}", e.without_url()))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("TokenReview answer unreadable: {}", e.without_url()))?;
        if !status.is_success() {
            // 401/403 here are about the Sentinel's own credentials or RBAC (it needs
            // `create` on tokenreviews), not about the token under review.
            return Err(format!(
                "TokenReview refused with HTTP {}: {}",
                status.as_u16(),
                text.chars().take(300).collect::<String>()
            ));
        }
        let review: Review = serde_json::from_str(&text)
            .map_err(|e| format!("TokenReview answer is not a TokenReview: {e}"))?;
        let status = review.status;
        Ok(if !status.authenticated {
            Verdict::Invalid {
                reason: if status.error.is_empty() {
                    "token not authenticated".into()
                } else {
                    status.error
                },
            }
        } else if !self.audiences.is_empty()
            && !status.audiences.iter().any(|a| self.audiences.contains(a))
        {
            Verdict::Invalid {
                reason: format!(
                    "the review did not confirm audience {:?} (it answered {:?})",
                    self.audiences, status.audiences
                ),
            }
        } else if self.allowed.contains(&status.user.username) {
            Verdict::Allowed {
                username: status.user.username,
            }
        } else {
            Verdict::NotAllowed {
                username: status.user.username,
            }
        })
    }
}
