use std::time::Duration;

/// Why a call to Airflow did not produce the expected answer.
///
/// Every variant carries enough to log one clear line; [`ApiError::is_retryable`] tells the
/// caller whether trying again can help.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server could not be reached or the connection broke (includes timeouts, and TLS
    /// failures such as an unknown certificate issuer: the causes are part of the message).
    #[error("{call}: transport error: {}", with_causes(source))]
    Transport {
        call: &'static str,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a non-success status.
    #[error("{call}: HTTP {status}: {body}")]
    Status {
        call: &'static str,
        status: u16,
        body: String,
    },
    /// The server answered 2xx but the body is not what the protocol says.
    #[error("{call}: malformed answer: {reason}")]
    Malformed { call: &'static str, reason: String },
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Transport failures, 5xx, 429 and malformed answers are worth retrying; other 4xx are
    /// answers about the request itself and would come back the same.
    pub fn is_retryable(&self) -> bool {
        match self {
            ApiError::Transport { .. } | ApiError::Malformed { .. } => true,
            ApiError::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
        }
    }
}

/// Timeouts for every Airflow call: a hung api-server must not hang a worker loop.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `request` and reads the whole answer; only transport failures are errors here.
pub(crate) async fn send(
    call: &'static str,
    request: reqwest::RequestBuilder,
) -> Result<(reqwest::StatusCode, String), ApiError> {
    let transport = |source| ApiError::Transport { call, source };
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let text = response.text().await.map_err(transport)?;
    Ok((status, text))
}

/// Turns a non-success status into [`ApiError::Status`].
pub(crate) fn check_status(
    call: &'static str,
    status: reqwest::StatusCode,
    text: &str,
) -> Result<(), ApiError> {
    if status.is_success() {
        return Ok(());
    }
    Err(ApiError::Status {
        call,
        status: status.as_u16(),
        body: truncate_body(text),
    })
}

/// A 2xx body that is not what `call` expects. The parser's message is cut like the body: it
/// quotes what it could not read, which may be a string of any size.
pub(crate) fn malformed(call: &'static str, error: &serde_json::Error, body: &str) -> ApiError {
    ApiError::Malformed {
        call,
        reason: format!(
            "{}; body: {}",
            truncate_body(&error.to_string()),
            truncate_body(body)
        ),
    }
}

/// Body texts in errors are cut so that one misbehaving server cannot flood the log.
pub(crate) fn truncate_body(body: &str) -> String {
    const MAX: usize = 300;
    if body.len() <= MAX {
        return body.trim().to_string();
    }
    let mut end = MAX;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", body[..end].trim())
}

/// An error with its causes, `: `-separated: reqwest's own message ("error sending request
/// for url …") leaves out the cause that matters, such as an unknown certificate issuer.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}
