//! Clients that take every connection and never read their answers must not lock out the one
//! that does (KEDA, polling the Sentinel).

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SLOTS: usize = 4;

async fn server(limits: http_server::Limits) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Big answers fill the socket buffers of a client that does not read within a few requests.
    let handler = |_req| async { Response::new(Full::new(Bytes::from(vec![b'x'; 256 * 1024]))) };
    tokio::spawn(http_server::serve(
        listener,
        limits,
        handler,
        std::future::pending(),
    ));
    addr
}

/// One GET that reads its answer; `None` if the server closed the connection first.
async fn get(addr: std::net::SocketAddr) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /v1/workers/w HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    text.split(' ').nth(1)?.parse().ok()
}

/// Takes every connection slot with clients that pipeline requests and never read.
async fn take_every_slot(addr: std::net::SocketAddr) -> Vec<TcpStream> {
    let mut hogs = Vec::new();
    for _ in 0..SLOTS {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let requests = b"GET / HTTP/1.1\r\nHost: s\r\n\r\n".repeat(200);
        stream.write_all(&requests).await.unwrap();
        hogs.push(stream);
    }
    hogs
}

/// How long a reading client needs to get an answer while the slots are hogged.
async fn time_to_answer(limits: http_server::Limits) -> Option<Duration> {
    let addr = server(limits).await;
    let _hogs = take_every_slot(addr).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        if get(addr).await == Some(200) {
            return Some(started.elapsed());
        }
        // A refused connection: a client (KEDA) tries again at its next poll.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test]
async fn clients_that_never_read_lose_their_connections() {
    let limits = http_server::Limits {
        max_connections: SLOTS,
        write_stall_timeout: Duration::from_secs(1),
        ..http_server::Limits::default()
    };
    let waited = time_to_answer(limits).await.expect("answered within 15 s");
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
}

#[tokio::test]
async fn without_the_write_deadline_they_would_keep_every_slot() {
    // The control for the test above: a connection past its age is only asked to close after
    // its current answer, which a client that never reads never lets finish.
    let limits = http_server::Limits {
        max_connections: SLOTS,
        write_stall_timeout: Duration::from_secs(3600),
        max_connection_age: Duration::from_secs(1),
        ..http_server::Limits::default()
    };
    assert_eq!(time_to_answer(limits).await, None);
}
