//! HTTP/1.x requests written and answers read byte for byte, without an HTTP client: the tests
//! control exactly what is sent (headers KEDA sends, none it does not) and see what came back.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP answer as a client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The answer in `buf`; `None` if it has no status line (e.g. the peer closed first).
    pub fn parse(buf: &[u8]) -> Option<Answer> {
        let text = String::from_utf8_lossy(buf).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Some(Answer {
            status,
            headers,
            body: body.to_string(),
        })
    }
}

/// Sends `request` (raw bytes) on a fresh connection and reads the whole answer.
pub async fn raw_request(addr: SocketAddr, request: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    parse_answer(&buf)
}

/// [`raw_request`] to a server that may not be up (yet, or any more): `None` when there is no
/// answer to read.
pub async fn try_raw_request(addr: SocketAddr, request: &str) -> Option<Answer> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.ok()?;
    Answer::parse(&buf)
}

/// The answer in `buf`, which must have a status line.
pub fn parse_answer(buf: &[u8]) -> Answer {
    Answer::parse(buf)
        .unwrap_or_else(|| panic!("no HTTP answer in {:?}", String::from_utf8_lossy(buf)))
}
