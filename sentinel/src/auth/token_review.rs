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

use super::static_tokens::{hash, TokenHash};
use crate::settings::KubernetesAccess;
use prometheus::IntCounterVec;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use url::Url;

const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds the cache: past this many entries, expired ones are dropped, and if that is not
/// enough the cache starts over (a flood of random tokens cannot grow memory).
const MAX_CACHED_VERDICTS: usize = 4096;

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

pub struct TokenReviewer {
    http: reqwest::Client,
    url: Url,
    token_file: std::path::PathBuf,
    allowed: HashSet<String>,
    audiences: Vec<String>,
    ttl: Duration,
    cache: Mutex<HashMap<TokenHash, (Verdict, Instant)>>,
    outcomes: IntCounterVec,
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
        outcomes: IntCounterVec,
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
            ttl,
            cache: Mutex::new(HashMap::new()),
            outcomes,
        })
    }

    /// The verdict on `token`, from the cache when a fresh one is there. `Err` means the
    /// review itself could not be done (the caller answers 503, and nothing is cached).
    pub async fn review(&self, token: &str) -> Result<Verdict, String> {
        let key = hash(token);
        if let Some(verdict) = self.cached(&key) {
            return Ok(verdict);
        }
        let verdict = match self.ask(token).await {
            Ok(v) => v,
            Err(e) => {
                self.outcomes.with_label_values(&["error"]).inc();
                return Err(e);
            }
        };
        let outcome = match &verdict {
            Verdict::Allowed { .. } => "allowed",
            Verdict::NotAllowed { .. } => "not_allowed",
            Verdict::Invalid { .. } => "invalid",
        };
        self.outcomes.with_label_values(&[outcome]).inc();
        self.remember(key, verdict.clone());
        Ok(verdict)
    }

    fn cached(&self, key: &TokenHash) -> Option<Verdict> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(key) {
            Some((verdict, at)) if at.elapsed() < self.ttl => Some(verdict.clone()),
            _ => None,
        }
    }

    fn remember(&self, key: TokenHash, verdict: Verdict) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED_VERDICTS {
            let ttl = self.ttl;
            cache.retain(|_, (_, at)| at.elapsed() < ttl);
            if cache.len() >= MAX_CACHED_VERDICTS {
                cache.clear();
            }
        }
        cache.insert(key, (verdict, Instant::now()));
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
