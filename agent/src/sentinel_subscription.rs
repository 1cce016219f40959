//! The subscription to the Sentinel's queue events (`GET /v1/queues/events?queue=…`): one
//! long-lived stream for this worker's queues that wakes the fetch loop the moment work is
//! queued on one of them, so that an idle agent may poll Airflow rarely.
//!
//! Safe by construction: the fetch loop waits the long subscribed interval only while the
//! subscription is up, and it is up only between the stream's `subscribed` event and the first
//! sign of trouble (an error status, an `unavailable` event, a broken or silent stream). The
//! moment it is lost the fetch loop is woken, fetches once and polls at the normal interval
//! again, while this loop reconnects with backoff. On every (re)connection the `subscribed`
//! event carries the queues' state, and anything queued is fetched: a rise missed while the
//! stream was being reopened is not lost.
//!
//! The token file is read at each connection: projected service-account tokens rotate, and the
//! Sentinel ends every stream after a few minutes (`reconnect`), so a new token is in use well
//! before the old one expires. A planned `reconnect` keeps the subscription up if the next
//! connection succeeds at once.

use crate::config::SentinelConfig;
use crate::context::Context;
use crate::sse::{Item, SseReader};
use airflow::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The Sentinel says it is alive every 10 s; three missed keep-alives mean the stream is dead.
const SILENCE_LIMIT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_secs(1);
/// Reconnection attempts are at most this far apart; the agent polls meanwhile.
const RETRY_CAP: Duration = Duration::from_secs(60);
/// Error bodies are cut to this length in logs.
const MAX_ERROR_TEXT: usize = 200;

/// How one stream ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The Sentinel closed it on purpose (`reconnect`): connect again at once.
    Planned,
    /// Airflow changed the worker's queues: subscribe to the new ones at once.
    QueuesChanged,
    /// Anything else: the agent polls until a new stream is up.
    Lost(String),
}

/// Holds the subscription until `stop` (the drain) is cancelled.
pub async fn run(ctx: Arc<Context>, sentinel: SentinelConfig, stop: CancellationToken) {
    let client = match client(&sentinel) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the HTTP client for the Sentinel; polling Airflow only");
            return;
        }
    };
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_CAP);
    let mut last_loss: Option<String> = None;
    loop {
        let queues = ctx.status.queues();
        let ended = tokio::select! {
            _ = stop.cancelled() => break,
            ended = stream(&ctx, &client, &sentinel, &queues, &mut backoff) => ended,
        };
        match ended {
            Ended::Planned | Ended::QueuesChanged => continue,
            Ended::Lost(why) => {
                let was_up = ctx.wake.subscribed();
                set_state(&ctx, false);
                // Logged once per change: a Sentinel that stays away is not a log line a minute.
                if was_up || last_loss.as_deref() != Some(why.as_str()) {
                    tracing::warn!(reason = %why, "no Sentinel subscription: polling Airflow every {}", humantime::format_duration(ctx.config.idle_fetch_interval));
                }
                last_loss = Some(why);
                let delay = backoff.next_delay();
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    set_state(&ctx, false);
}

fn client(sentinel: &SentinelConfig) -> Result<reqwest::Client, reqwest::Error> {
    let builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(Duration::from_secs(15));
    match &sentinel.ca {
        Some(ca) => ca.add_to(builder),
        None => builder,
    }
    .build()
}

fn set_state(ctx: &Context, up: bool) {
    if ctx.wake.set_subscribed(up) {
        ctx.metrics.sentinel_subscribed.set(i64::from(up));
        if up {
            tracing::info!(queues = ?ctx.status.queues(), "subscribed to the Sentinel: idle fetches every {} unless woken", humantime::format_duration(ctx.config.subscribed_idle_fetch_interval));
        }
    }
}

/// The events URL for `queues`.
fn events_url(base: &url::Url, queues: &[String]) -> url::Url {
    let mut url = base.clone();
    let path = format!("{}/v1/queues/events", url.path().trim_end_matches('/'));
    url.set_path(&path);
    {
        let mut query = url.query_pairs_mut();
        query.clear();
        for queue in queues {
            query.append_pair("queue", queue);
        }
    }
    url
}

/// Opens one stream and follows it until it ends.
async fn stream(
    ctx: &Context,
    client: &reqwest::Client,
    sentinel: &SentinelConfig,
    queues: &[String],
    backoff: &mut Backoff,
) -> Ended {
    let mut request = client
        .get(events_url(&sentinel.url, queues))
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some(path) = &sentinel.token_file {
        match std::fs::read_to_string(path) {
            Ok(token) => request = request.bearer_auth(token.trim()),
            Err(e) => return Ended::Lost(format!("cannot read {}: {e}", path.display())),
        }
    }
    // A Sentinel that takes the connection and never answers is as good as none.
    let mut response = match tokio::time::timeout(SILENCE_LIMIT, request.send()).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Ended::Lost(airflow::error::with_causes(&e)),
        Err(_) => {
            return Ended::Lost(format!(
                "the Sentinel did not answer within {}",
                humantime::format_duration(SILENCE_LIMIT)
            ))
        }
    };
    if !response.status().is_success() {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let text: String = text.chars().take(MAX_ERROR_TEXT).collect();
        return Ended::Lost(format!("the Sentinel answered {status}: {text}"));
    }
    let mut reader = SseReader::default();
    let mut planned = false;
    loop {
        let chunk = tokio::select! {
            _ = ctx.wake.queues_changed_notified() => return Ended::QueuesChanged,
            chunk = tokio::time::timeout(SILENCE_LIMIT, response.chunk()) => chunk,
        };
        let bytes = match chunk {
            Err(_) => {
                return Ended::Lost(format!(
                    "the Sentinel sent nothing for {}",
                    humantime::format_duration(SILENCE_LIMIT)
                ))
            }
            Ok(Err(e)) => return Ended::Lost(airflow::error::with_causes(&e)),
            Ok(Ok(None)) if planned => return Ended::Planned,
            Ok(Ok(None)) => return Ended::Lost("the Sentinel closed the stream".into()),
            Ok(Ok(Some(bytes))) => bytes,
        };
        let items = match reader.feed(&bytes) {
            Ok(items) => items,
            Err(e) => return Ended::Lost(e),
        };
        for item in items {
            let Item::Event(event) = item else { continue };
            match event.name.as_str() {
                "subscribed" => {
                    backoff.reset();
                    set_state(ctx, true);
                    // Whatever is queued now may have been missed while not subscribed.
                    if anything_queued(&event.data) {
                        ctx.wake.fetch_now();
                    }
                }
                "rose" => {
                    ctx.metrics.wakeups.inc();
                    tracing::debug!(state = %event.data, "woken: work was queued");
                    ctx.wake.fetch_now();
                }
                "reconnect" => planned = true,
                "unavailable" => {
                    return Ended::Lost(format!(
                        "the Sentinel cannot see the queues: {}",
                        event.data
                    ))
                }
                _ => {}
            }
        }
    }
}

/// Whether a `subscribed` event's state has any queued task instance; an event that cannot be
/// read counts as "yes": one fetch too many is cheap, a missed one is a delay.
fn anything_queued(data: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct State {
        queues: std::collections::HashMap<String, Counts>,
    }
    #[derive(serde::Deserialize)]
    struct Counts {
        queued: u64,
    }
    serde_json::from_str::<State>(data)
        .map(|s| s.queues.values().any(|c| c.queued > 0))
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_every_queue() {
        let base = url::Url::parse("http://sentinel:39092/prefix/").unwrap();
        let url = events_url(&base, &["a".into(), "b c".into()]);
        assert_eq!(
            url.as_str(),
            "http://sentinel:39092/prefix/v1/queues/events?queue=a&queue=b+c"
        );
    }

    #[test]
    fn queued_work_in_the_first_state_is_fetched() {
        assert!(!anything_queued(
            r#"{"queues":{"a":{"queued":0,"running":3}}}"#
        ));
        assert!(anything_queued(
            r#"{"queues":{"a":{"queued":0,"running":0},"b":{"queued":2,"running":0}}}"#
        ));
        assert!(anything_queued("not json"));
    }
}
