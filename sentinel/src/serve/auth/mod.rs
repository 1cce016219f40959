//! Who may read `/v1/*`: static bearer tokens, Kubernetes TokenReview, or nobody checks at
//! all — but only when the configuration says `auth.disabled: true`.
//!
//! Two kinds of callers: the readers of backlogs (`auth`: KEDA, the page) may use every `/v1`
//! endpoint; the agents (`queueEvents.auth`: each worker Pod's projected token) only open the
//! queue-event stream ([`Scope::Subscribe`]). An agent's identity is never looked at for any
//! other endpoint, so its token gets what any unlisted identity gets there: 403 (or 401).
//!
//! A presented token is first compared with the static tokens (cheap, local); if it is not one
//! of them and TokenReview is configured, the API server decides. Tokens are never logged, and
//! a 401 never says why the token was refused (the reason goes to the debug log).
//!
//! A third kind of caller, people (`auth.kubernetesUsers`), reads the backlog and history of
//! the workers whose Deployment their own Kubernetes token may `get`
//! ([`deployment_access`]); see [`Authenticator::readable`].

mod claimed_username;
pub mod deployment_access;
mod jwt_shape;
pub mod static_tokens;
pub mod token_review;

use deployment_access::DeploymentAccess;
use static_tokens::StaticTokens;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use token_review::{ReviewError, TokenReviewer, Verdict};

const INVALID_TOKEN: &str = "invalid bearer token";

/// The outcome of checking a request's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: no token, or a token nobody vouches for.
    Unauthorized(String),
    /// 403: a valid identity that is not on the allow-list.
    Forbidden(String),
    /// 503: the token could not be checked right now; `retry_after` when it is known when it
    /// can be.
    Unavailable {
        message: String,
        retry_after: Option<Duration>,
    },
}

/// What a request asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Read backlogs and history: the `auth` identities only.
    Read,
    /// Open the queue-event stream: the agents' identities, and the readers'.
    Subscribe,
}

/// Who may open the queue-event stream besides the readers.
pub struct Subscribers {
    pub static_tokens: Option<Arc<StaticTokens>>,
    pub token_review: Option<TokenReviewer>,
}

pub struct Authenticator {
    disabled: bool,
    static_tokens: Option<Arc<StaticTokens>>,
    token_review: Option<TokenReviewer>,
    subscribers: Option<Subscribers>,
    deployment_access: Option<DeploymentAccess>,
}

/// The workers a caller may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readable {
    /// A reader (KEDA's token, a static token) or auth disabled: every worker.
    All,
    /// A person: the workers whose Deployment they may `get`, of those asked about.
    Only(BTreeSet<String>),
}

impl Readable {
    pub fn includes(&self, worker: &str) -> bool {
        match self {
            Readable::All => true,
            Readable::Only(workers) => workers.contains(worker),
        }
    }
}

impl Authenticator {
    pub fn disabled() -> Self {
        Authenticator {
            disabled: true,
            static_tokens: None,
            token_review: None,
            subscribers: None,
            deployment_access: None,
        }
    }

    pub fn new(
        static_tokens: Option<Arc<StaticTokens>>,
        token_review: Option<TokenReviewer>,
    ) -> Self {
        Authenticator {
            disabled: false,
            static_tokens,
            token_review,
            subscribers: None,
            deployment_access: None,
        }
    }

    /// Lets people read the workers whose Deployment their Kubernetes token may `get`.
    pub fn with_deployment_access(mut self, access: DeploymentAccess) -> Self {
        self.deployment_access = Some(access);
        self
    }

    /// Which of `workers` the caller may read: all of them for a reader; for a person (a token
    /// no reader rule accepts, when `auth.kubernetesUsers` is on), those whose Deployment the
    /// API server says the token's user may `get` — each asked about, cached. `Err`: the
    /// refusal (401, 403, 503) to answer.
    pub async fn readable(
        &self,
        authorization: Option<&[u8]>,
        workers: &[&str],
    ) -> Result<Readable, Decision> {
        if self.disabled {
            return Ok(Readable::All);
        }
        let Some(token) = authorization.and_then(bearer_token) else {
            return Err(Decision::Unauthorized(
                "missing bearer token (Authorization: Bearer <token>)".into(),
            ));
        };
        let refusal = match self.check_reader(token).await {
            Decision::Allow => return Ok(Readable::All),
            refusal @ (Decision::Unauthorized(_) | Decision::Forbidden(_)) => refusal,
            unavailable @ Decision::Unavailable { .. } => return Err(unavailable),
        };
        let Some(access) = &self.deployment_access else {
            return Err(refusal);
        };
        // Nobody vouches for the token: the readers' refusal says so (401 or 403).
        let user = match access.person(token).await {
            Ok(Some(user)) => user,
            Ok(None) => return Err(refusal),
            Err(error) => return Err(review_unavailable(error)),
        };
        let mut granted = BTreeSet::new();
        for &worker in workers {
            match access.may_get(token, &user, worker).await {
                Ok(true) => {
                    granted.insert(worker.to_string());
                }
                Ok(false) => {}
                Err(error) => return Err(review_unavailable(error)),
            }
        }
        if granted.is_empty() && !workers.is_empty() {
            let username = user.username.unwrap_or_default();
            tracing::info!(%username, "refused a person who may get none of the asked workers' Deployments");
            let what = match workers {
                [one] => format!("Deployment {one}"),
                _ => "any worker Deployment".into(),
            };
            return Err(Decision::Forbidden(format!(
                "user {username} may not get {what} in namespace {}",
                access.namespace()
            )));
        }
        Ok(Readable::Only(granted))
    }

    /// Lets `subscribers` open the queue-event stream as well.
    pub fn with_subscribers(mut self, subscribers: Subscribers) -> Self {
        self.subscribers = Some(subscribers);
        self
    }

    /// Checks the value of the request's `Authorization` header for `scope`.
    pub async fn check(&self, authorization: Option<&[u8]>, scope: Scope) -> Decision {
        if self.disabled {
            return Decision::Allow;
        }
        let Some(token) = authorization.and_then(bearer_token) else {
            return Decision::Unauthorized(
                "missing bearer token (Authorization: Bearer <token>)".into(),
            );
        };
        if scope == Scope::Subscribe {
            if let Some(subscribers) = &self.subscribers {
                if let Some(decision) = subscribers.allows(token).await {
                    return decision;
                }
            }
        }
        self.check_reader(token).await
    }

    /// Whether `token` is one of the readers'.
    async fn check_reader(&self, token: &str) -> Decision {
        if let Some(tokens) = &self.static_tokens {
            if tokens.contains(token) {
                return Decision::Allow;
            }
        }
        let Some(reviewer) = &self.token_review else {
            return Decision::Unauthorized(INVALID_TOKEN.into());
        };
        match reviewer.review(token).await {
            Ok(Verdict::Allowed { .. }) => Decision::Allow,
            Ok(Verdict::NotAllowed { username }) => {
                tracing::info!(%username, "refused a service account that is not on auth.tokenReview.allowedUsernames");
                Decision::Forbidden(format!(
                    "identity {username} is not allowed to read backlogs"
                ))
            }
            Ok(Verdict::Invalid { reason }) => {
                tracing::debug!(%reason, "refused a bearer token");
                Decision::Unauthorized(INVALID_TOKEN.into())
            }
            Err(error) => review_unavailable(error),
        }
    }
}

/// The 503 for a token that could not be checked right now.
fn review_unavailable(error: ReviewError) -> Decision {
    match error {
        ReviewError::Busy { retry_after } => {
            tracing::debug!(?retry_after, "the TokenReview budget is spent");
            Decision::Unavailable {
                message: "too many unknown tokens to verify right now; retry later".into(),
                retry_after: Some(retry_after),
            }
        }
        ReviewError::Failed(error) => {
            tracing::warn!(%error, "cannot verify a bearer token");
            Decision::Unavailable {
                message: "cannot verify the bearer token right now".into(),
                retry_after: None,
            }
        }
    }
}

impl Subscribers {
    /// `Some(Allow)` for an agent's token; `Some(Unavailable)` when the review could not be
    /// done; `None` when the token is not an agent's, so that the readers' rules decide.
    async fn allows(&self, token: &str) -> Option<Decision> {
        if self
            .static_tokens
            .as_ref()
            .is_some_and(|t| t.contains(token))
        {
            return Some(Decision::Allow);
        }
        match self.token_review.as_ref()?.review(token).await {
            Ok(Verdict::Allowed { .. }) => Some(Decision::Allow),
            Ok(Verdict::NotAllowed { .. } | Verdict::Invalid { .. }) => None,
            Err(ReviewError::Busy { retry_after }) => Some(Decision::Unavailable {
                message: "too many unknown tokens to verify right now; retry later".into(),
                retry_after: Some(retry_after),
            }),
            Err(ReviewError::Failed(error)) => {
                tracing::warn!(%error, "cannot verify an agent's bearer token");
                Some(Decision::Unavailable {
                    message: "cannot verify the bearer token right now".into(),
                    retry_after: None,
                })
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header_forms() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer   abc "), Some("abc"));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"abc"), None);
        assert_eq!(bearer_token(b"Bearer \xff"), None);
    }

    #[tokio::test]
    async fn disabled_allows_everything_and_enabled_needs_a_token() {
        for scope in [Scope::Read, Scope::Subscribe] {
            assert_eq!(
                Authenticator::disabled().check(None, scope).await,
                Decision::Allow
            );
            let a = Authenticator::new(None, None);
            assert!(matches!(
                a.check(None, scope).await,
                Decision::Unauthorized(_)
            ));
            assert!(matches!(
                a.check(Some(b"Bearer x"), scope).await,
                Decision::Unauthorized(_)
            ));
        }
    }

    #[tokio::test]
    async fn an_agents_token_opens_the_stream_only_and_a_readers_token_everything() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, token: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("{token}\n")).unwrap();
            Some(Arc::new(StaticTokens::load(&path).unwrap()))
        };
        let a = Authenticator::new(file("readers", "keda"), None).with_subscribers(Subscribers {
            static_tokens: file("agents", "agent"),
            token_review: None,
        });
        assert_eq!(
            a.check(Some(b"Bearer agent"), Scope::Subscribe).await,
            Decision::Allow
        );
        assert!(matches!(
            a.check(Some(b"Bearer agent"), Scope::Read).await,
            Decision::Unauthorized(_)
        ));
        for scope in [Scope::Read, Scope::Subscribe] {
            assert_eq!(a.check(Some(b"Bearer keda"), scope).await, Decision::Allow);
        }
    }
}
