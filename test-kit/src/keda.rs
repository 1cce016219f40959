//! Calling the Sentinel as KEDA's metrics-api scaler does, and reading what it reads.

use crate::raw_http::{raw_request, Answer};
use std::net::SocketAddr;

/// `GET path` exactly as KEDA's metrics-api scaler sends it: Go's default User-Agent, a
/// bearer token, gzip accepted, and no Accept header.
pub async fn keda_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Answer {
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    raw_request(
        addr,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Go-http-client/1.1\r\n{auth}Accept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}

/// The value at a GJSON-style dotted path (what KEDA's `valueLocation` is), as KEDA would
/// take it: a JSON number.
pub fn value_at(answer: &Answer, path: &str) -> f64 {
    let mut v = answer.json();
    for part in path.split('.') {
        v = v[part].take();
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {}", answer.body))
}
