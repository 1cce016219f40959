//! A client that holds every connection it can get and opens new ones at 500/s must not fail
//! another peer's liveness probe (the kubelet's, restarting the container after a few misses).
//!
//! Each test runs in a network namespace of its own, as a Pod has: the server listens on every
//! address, the kubelet probes from [`PROBE_PEER`] to the Pod's address [`POD`], distinct Pods
//! flood from addresses of their own, and a process in the Pod floods from every loopback
//! address it likes (all of 127.0.0.0/8 is loopback on Linux).

use crate::net_namespace::in_new_net_namespace;
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
        one_peer_for_this_host: true,
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
const POD: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const PROBE_PEER: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);

/// Other Pods' addresses, `n` of them.
fn other_pods(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|i| Ipv4Addr::new(10, 200, 1, i)).collect()
}

/// Every address of the namespace besides loopback's.
fn addresses() -> Vec<Ipv4Addr> {
    [POD, PROBE_PEER].into_iter().chain(other_pods(8)).collect()
}

/// The server on a thread and a single-threaded runtime of its own, as in the agent; stopped
/// and joined on drop.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(limits: http_server::Limits) -> Server {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
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

/// A connection from `source` to the server's `port`: at loopback's address from a loopback
/// address, at the Pod's from any other.
async fn connect_from(source: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    let to = if source.is_loopback() {
        Ipv4Addr::LOCALHOST
    } else {
        POD
    };
    socket.connect(SocketAddr::new(IpAddr::V4(to), port)).await
}

/// A new connection every [`FLOOD_EVERY`], from each of `sources` in turn, each held until the
/// server closes it. Every task ends when the returned set is dropped.
fn flood(sources: Vec<Ipv4Addr>, port: u16) -> JoinSet<()> {
    let mut flood = JoinSet::new();
    flood.spawn(async move {
        let mut held = JoinSet::new();
        let mut every = tokio::time::interval(FLOOD_EVERY);
        for source in sources.into_iter().cycle() {
            every.tick().await;
            while held.try_join_next().is_some() {}
            held.spawn(async move {
                let Ok(mut stream) = connect_from(source, port).await else {
                    return;
                };
                // Sends nothing and reads until the server gives the connection up.
                let mut buf = [0u8; 64];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    flood
}

/// One `GET /healthz` from [`PROBE_PEER`], as the kubelet asks it (a new connection each time):
/// whether a 200 came within [`PROBE_TIMEOUT`].
async fn probe(port: u16) -> bool {
    let ask = async {
        let mut stream = connect_from(PROBE_PEER, port).await.ok()?;
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

/// How many of [`PROBES`] probes were answered in time while `flooders` flood.
fn probes_answered(limits: http_server::Limits, flooders: Vec<Ipv4Addr>) -> usize {
    in_new_net_namespace(&addresses(), move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(probes_answered_here(limits, flooders))
    })
}

async fn probes_answered_here(limits: http_server::Limits, flooders: Vec<Ipv4Addr>) -> usize {
    let server = Server::start(limits.clone());
    let port = server.addr.port();
    assert!(probe(port).await, "answers before the flood");
    let addresses = flooders.len();
    // The flood holds what it can within its first few hundred connections.
    let flood = flood(flooders, port);
    tokio::time::sleep(FLOOD_EVERY * 400).await;
    let mut answered = 0;
    for _ in 0..PROBES {
        if probe(port).await {
            answered += 1;
        }
        // The kubelet's period is seconds; a tenth of that keeps the test short.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(flood);
    drop(server);
    eprintln!("{addresses} flooding address(es), per peer {}, reserve {}: {answered} of {PROBES} probes answered",
        limits.max_connections_per_peer, limits.reserved_connections
    );
    answered
}

/// A process in the Pod: from the Pod's own address and from 100 loopback addresses.
fn the_pod_itself() -> Vec<Ipv4Addr> {
    (2..102)
        .map(|i| Ipv4Addr::new(127, 0, 0, i))
        .chain([POD])
        .collect()
}

#[test]
fn one_address_flooding_cannot_fail_the_probe() {
    let answered = probes_answered(AGENT, other_pods(1));
    assert!(answered >= 9, "{answered} of {PROBES} probes answered");
}

#[test]
fn several_addresses_flooding_cannot_fail_the_probe() {
    // Eight addresses at four connections each could take all 32 slots: the reserve stops them.
    let answered = probes_answered(AGENT, other_pods(8));
    assert!(answered >= 9, "{answered} of {PROBES} probes answered");
}

#[test]
fn the_pod_flooding_from_every_loopback_address_cannot_fail_the_probe() {
    // A task beside the agent, from more addresses than the reserve has slots: one peer.
    let answered = probes_answered(AGENT, the_pod_itself());
    assert!(answered >= 9, "{answered} of {PROBES} probes answered");
}

#[test]
fn without_a_per_peer_cap_one_address_takes_every_slot() {
    // The control for the first test: the global cap alone, as before.
    let answered = probes_answered(agent_limits(32, 32, 0), other_pods(1));
    assert!(answered < 9, "{answered} of {PROBES} probes answered");
}

#[test]
fn counting_loopback_addresses_apart_the_pod_takes_every_slot() {
    // The control for the third test: each loopback address a peer of its own, as before.
    let limits = http_server::Limits {
        one_peer_for_this_host: false,
        ..AGENT
    };
    let answered = probes_answered(limits, the_pod_itself());
    assert!(answered < 9, "{answered} of {PROBES} probes answered");
}

#[test]
fn without_the_reserve_several_addresses_take_every_slot() {
    // The control for the second test.
    let answered = probes_answered(agent_limits(32, 4, 0), other_pods(8));
    assert!(answered < 9, "{answered} of {PROBES} probes answered");
}
