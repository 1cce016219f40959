//! The API's answers: JSON, JSON errors and plain text, never cached (the page's files, in
//! [`ui`](super::ui), are revalidated instead). [`Body`] is every answer's body, the page's and
//! the queue-event streams' too.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// Boxed, so that a whole answer and an endless event stream share one type.
pub type Body = UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// A whole answer's body.
pub fn whole(bytes: Bytes) -> Body {
    Full::new(bytes).boxed_unsync()
}

const JSON: &str = "application/json";

pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).expect("plain structs serialise");
    respond(status, JSON, body.into())
}

/// Every error body is JSON `{"error": …}`.
pub fn error(status: StatusCode, message: String) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message }))
}

pub fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    respond(
        status,
        "text/plain; charset=utf-8",
        Bytes::from_static(body.as_bytes()),
    )
}

/// No answer is cached: each one is the state of the moment.
pub fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(whole(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
