//! Who may read `/v1/*`: static bearer tokens, Kubernetes TokenReview, or nobody checks at
//! all — but only when the configuration says `auth.disabled: true`.
//!
//! A presented token is first compared with the static tokens (cheap, local); if it is not one
//! of them and TokenReview is configured, the API server decides. Tokens are never logged, and
//! a 401 never says why the token was refused (the reason goes to the debug log).

mod jwt_shape;
pub mod static_tokens;
pub mod token_review;

use static_tokens::StaticTokens;
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

pub struct Authenticator {
    disabled: bool,
    static_tokens: Option<Arc<StaticTokens>>,
    token_review: Option<TokenReviewer>,
}

impl Authenticator {
    pub fn disabled() -> Self {
        Authenticator {
            disabled: true,
            static_tokens: None,
            token_review: None,
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
        }
    }

    /// Checks the value of the request's `Authorization` header.
    pub async fn check(&self, authorization: Option<&[u8]>) -> Decision {
        if self.disabled {
            return Decision::Allow;
        }
        let Some(token) = authorization.and_then(bearer_token) else {
            return Decision::Unauthorized(
                "missing bearer token (Authorization: Bearer <token>)".into(),
            );
        };
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
            Err(ReviewError::Busy { retry_after }) => {
                tracing::debug!(?retry_after, "the TokenReview budget is spent");
                Decision::Unavailable {
                    message: "too many unknown tokens to verify right now; retry later".into(),
                    retry_after: Some(retry_after),
                }
            }
            Err(ReviewError::Failed(error)) => {
                tracing::warn!(%error, "cannot verify a bearer token");
                Decision::Unavailable {
                    message: "cannot verify the bearer token right now".into(),
                    retry_after: None,
                }
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
        assert_eq!(Authenticator::disabled().check(None).await, Decision::Allow);
        let a = Authenticator::new(None, None);
        assert!(matches!(a.check(None).await, Decision::Unauthorized(_)));
        assert!(matches!(
            a.check(Some(b"Bearer x")).await,
            Decision::Unauthorized(_)
        ));
    }
}
