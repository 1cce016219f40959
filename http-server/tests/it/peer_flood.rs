//! A client that holds every connection it can get and opens new ones at 500/s must not fail
//! another peer's liveness probe (the kubelet's, restarting the container after a few misses).
//!
//! Every 127.0.0.0/8 address is loopback on Linux: binding the clients' sockets to 127.0.0.x
//! gives each "peer" its own source address, as distinct Pods would have.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

/// The agent's admin server defaults (`--admin-max-connections` and the two after it).
const AGENT: http_server::Limits = agent_limits(32, 4, 8);

const fn agent_limits(max: usize, per_peer: usize, reserved: usize) -> http_server::Limits {
    http_server::Limits {
        max_connections: max,
        max_connections_per_peer: per_peer,
        reserved_connections: reserved,
        header_read_timeout: Duration::from_secs(5),
        max_header_bytes: 16 * 1024,
        write_stall_timeout: Duration::from_secs(10),
        max_connection_age: Duration::from_secs(300),
        drain_timeout: Duration::from_secs(5),
    }
}

const FLOOD_EVERY: Duration = Duration::from_millis(2);
const PROBES: usize = 10;
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const PROBE_PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 100);

/// The server on a thread and a single-threaded runtime of its own, as in the agent; stopped
/// and joined on drop.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(limits: http_server::Limits) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let handler =
                    |_req| async { Response::new(Full::new(Bytes::from_static(b"ok\n"))) };
                http_server::serve(listener, limits, handler, async {
                    let _ = stopped.await;
                })
                .await;
            });
        });
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn connect_from(source: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    socket.connect(server).await
}

/// From each of `sources`, a new connection every [`FLOOD_EVERY`], each held until the server
/// closes it. Every task ends when the returned set is dropped.
fn flood(sources: Vec<Ipv4Addr>, server: SocketAddr) -> JoinSet<()> {
    let mut flood = JoinSet::new();
    flood.spawn(async move {
        let mut held = JoinSet::new();
        let mut every = tokio::time::interval(FLOOD_EVERY);
        loop {
            every.tick().await;
            while held.try_join_next().is_some() {}
            for &source in &sources {
                held.spawn(async move {
                    let Ok(mut stream) = connect_from(source, server).await else {
                        return;
                    };
                    // Sends nothing and reads until the server gives the connection up.
                    let mut buf = [0u8; 64];
                    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        }
    });
    flood
}

/// One `GET /healthz` from [`PROBE_PEER`], as the kubelet asks it (a new connection each time):
/// whether a 200 came within [`PROBE_TIMEOUT`].
async fn probe(server: SocketAddr) -> bool {
    let ask = async {
        let mut stream = connect_from(PROBE_PEER, server).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(answer.starts_with(b"HTTP/1.1 200 "))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ask).await,
        Ok(Some(true))
    )
}

/// How many of [`PROBES`] probes were answered in time while `flooders` addresses flood.
async fn probes_answered(limits: http_server::Limits, flooders: u8) -> usize {
    let server = Server::start(limits.clone());
    assert!(probe(server.addr).await, "answers before the flood");
    let sources = (2..2 + flooders)
        .map(|i| Ipv4Addr::new(127, 0, 0, i))
        .collect();
    let flood = flood(sources, server.addr);
    // The flood holds what it can within its first few hundred connections.
    tokio::time::sleep(FLOOD_EVERY * 200).await;
    let mut answered = 0;
    for _ in 0..PROBES {
        if probe(server.addr).await {
            answered += 1;
        }
        // The kubelet's period is seconds; a tenth of that keeps the test short.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(flood);
    drop(server);
    eprintln!("{flooders} flooding address(es), per peer {}, reserve {}: {answered} of {PROBES} probes answered",
        limits.max_connections_per_peer, limits.reserved_connections
    );
    answered
}

#[tokio::test]
async fn one_address_flooding_cannot_fail_the_probe() {
    let answered = probes_answered(AGENT, 1).await;
    assert!(answered >= 9, "{answered} of {PROBES} probes answered");
}

#[tokio::test]
async fn several_addresses_flooding_cannot_fail_the_probe() {
    // Eight addresses at four connections each could take all 32 slots: the reserve stops them.
    let answered = probes_answered(AGENT, 8).await;
    assert!(answered >= 9, "{answered} of {PROBES} probes answered");
}

#[tokio::test]
async fn without_a_per_peer_cap_one_address_takes_every_slot() {
    // The control for the first test: the global cap alone, as before.
    let answered = probes_answered(agent_limits(32, 32, 0), 1).await;
    assert!(answered < 9, "{answered} of {PROBES} probes answered");
}

#[tokio::test]
async fn without_the_reserve_several_addresses_take_every_slot() {
    // The control for the second test.
    let answered = probes_answered(agent_limits(32, 4, 0), 8).await;
    assert!(answered < 9, "{answered} of {PROBES} probes answered");
}
