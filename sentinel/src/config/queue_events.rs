//! The `queueEvents` section: how many agents may hold the wake-up stream
//! (`GET /v1/queues/events`) at once, and who may open it besides the `/v1` readers.
//!
//! ```yaml
//! queueEvents:
//!   maxSubscribers: 500
//!   auth:                       # identities that open the stream and nothing else
//!     staticTokensFile: /etc/astro-sentinel/agent-tokens
//!     tokenReview:
//!       allowedUsernames: ["system:serviceaccount:airflow:astro-agent-worker-default"]
//!       audiences: [astro-sentinel]
//! ```
//!
//! The agents' identities live apart from `auth` on purpose: a worker Pod's token must open the
//! stream only, never the backlogs KEDA reads.

use super::file::{validate_token_review, RawTokenReview, TokenReviewConfig};
use super::ConfigError;
use serde::Deserialize;
use std::path::PathBuf;

/// Leaves most of the HTTP server's 1024 connections to KEDA, Prometheus and the page.
pub const DEFAULT_MAX_SUBSCRIBERS: usize = 500;
/// The HTTP server's own connection cap: more streams than that could never be open.
const MAX_MAX_SUBSCRIBERS: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEventsConfig {
    /// Streams open at once; one more is answered 503 (the agent polls Airflow instead).
    pub max_subscribers: usize,
    pub auth: SubscriberAuthConfig,
}

/// Identities that may open the stream and nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberAuthConfig {
    pub static_tokens_file: Option<PathBuf>,
    pub token_review: Option<TokenReviewConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawQueueEvents {
    max_subscribers: Option<usize>,
    #[serde(default)]
    auth: RawSubscriberAuth,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSubscriberAuth {
    static_tokens_file: Option<PathBuf>,
    token_review: Option<RawTokenReview>,
}

pub fn validate_queue_events(raw: RawQueueEvents) -> Result<QueueEventsConfig, ConfigError> {
    let max_subscribers = raw.max_subscribers.unwrap_or(DEFAULT_MAX_SUBSCRIBERS);
    if !(1..=MAX_MAX_SUBSCRIBERS).contains(&max_subscribers) {
        return Err(ConfigError::new(format!(
            "queueEvents.maxSubscribers: must be between 1 and {MAX_MAX_SUBSCRIBERS}, got {max_subscribers}"
        )));
    }
    let token_review = raw
        .auth
        .token_review
        .map(|tr| validate_token_review(tr, "queueEvents.auth.tokenReview"))
        .transpose()?;
    Ok(QueueEventsConfig {
        max_subscribers,
        auth: SubscriberAuthConfig {
            static_tokens_file: raw.auth.static_tokens_file,
            token_review,
        },
    })
}

#[cfg(test)]
mod tests {
    use crate::config::file::Config;

    const BASE: &str = "source: {type: airflow-api, airflowApi: {url: \"http://a:8080\"}}\nauth: {disabled: true}\n";

    fn parse(section: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{section}")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_without_the_section() {
        let c = parse("").unwrap();
        assert_eq!(
            c.queue_events.max_subscribers,
            super::DEFAULT_MAX_SUBSCRIBERS
        );
        assert_eq!(c.queue_events.auth, Default::default());
    }

    #[test]
    fn agents_identities_are_read() {
        let c = parse(
            "queueEvents:\n  maxSubscribers: 20\n  auth:\n    staticTokensFile: /t\n    tokenReview:\n      allowedUsernames: [\"system:serviceaccount:a:w\"]\n      audiences: [astro-sentinel]\n",
        )
        .unwrap();
        assert_eq!(c.queue_events.max_subscribers, 20);
        let tr = c.queue_events.auth.token_review.unwrap();
        assert_eq!(tr.allowed_usernames, ["system:serviceaccount:a:w"]);
        assert_eq!(tr.audiences, ["astro-sentinel"]);
        assert_eq!(
            c.queue_events.auth.static_tokens_file.unwrap().to_str(),
            Some("/t")
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (section, key) in [
            (
                "queueEvents: {maxSubscribers: 0}\n",
                "queueEvents.maxSubscribers",
            ),
            (
                "queueEvents: {maxSubscribers: 5000}\n",
                "queueEvents.maxSubscribers",
            ),
            (
                "queueEvents: {auth: {tokenReview: {allowedUsernames: []}}}\n",
                "queueEvents.auth.tokenReview.allowedUsernames",
            ),
            ("queueEvents: {maxSubscriber: 3}\n", "maxSubscriber"),
        ] {
            let e = parse(section).unwrap_err();
            assert!(e.contains(key), "{section}: {e}");
        }
    }
}
