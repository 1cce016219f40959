//! The external scaler port against 10 000 connections that never say a word, from two
//! addresses: the port holds at most [`MAX_CONNECTIONS_PER_PEER`] of each address and closes
//! the others at once, and the held ones when they stay silent, so the Sentinel's descriptors
//! stay bounded — under a descriptor limit a container could well have — and KEDA's
//! external-scaler client, from a third address, is served meanwhile.

use astro_sentinel::serve::external_scaler::admission::MAX_CONNECTIONS_PER_PEER;
use astro_sentinel::serve::external_scaler::proto::external_scaler_client::ExternalScalerClient;
use astro_sentinel::serve::external_scaler::proto::{GetMetricsRequest, ScaledObjectRef};
use astro_sentinel::serve::external_scaler::service::{METRIC_NAME, WORKER_KEY};
use futures_util::future::join_all;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{eventually, ChildGuard, TempDir};
use tokio::io::AsyncReadExt;
use tokio::net::TcpSocket;
use tokio::task::JoinSet;

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");
const SILENT: usize = 10_000;
/// The silent connections come from these; KEDA's client from 127.0.0.1.
const SOURCES: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)];
/// The Sentinel's descriptor limit: far fewer than the silent connections.
const SENTINEL_NOFILE: libc::rlim_t = 4096;

/// Raises this process's soft descriptor limit to its hard one (it holds every silent
/// connection's client side); returns the new limit.
fn raise_own_nofile() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

/// The Sentinel binary with both ports on free loopback ports, its descriptors limited to
/// [`SENTINEL_NOFILE`]; returns it with its `/v1` and external scaler addresses.
fn start_sentinel(config: &std::path::Path) -> (ChildGuard, SocketAddr, SocketAddr) {
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .args(["--external-scaler-listen", "127.0.0.1:0"])
        .env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "airflow-token")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: SENTINEL_NOFILE,
                rlim_max: SENTINEL_NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = ChildGuard(cmd.spawn().unwrap());
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let addr_in = |line: &str| -> SocketAddr {
        let after = line.split("addr=").nth(1).unwrap();
        after.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (mut api, mut scaler) = (None, None);
    while api.is_none() || scaler.is_none() {
        let line = lines
            .next()
            .expect("the Sentinel stopped before listening")
            .unwrap();
        if line.contains("external scaler") && line.contains("addr=") {
            scaler = Some(addr_in(&line));
        } else if line.contains("listening") {
            api = Some(addr_in(&line));
        }
    }
    // Keep reading, so that the Sentinel never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, api.unwrap(), scaler.unwrap())
}

/// `None` once the process is gone.
fn open_descriptors(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

fn scaled_object() -> ScaledObjectRef {
    ScaledObjectRef {
        name: "astro-worker-default".into(),
        namespace: "airflow".into(),
        scaler_metadata: [(WORKER_KEY.to_string(), "astro-worker-default".to_string())].into(),
    }
}

/// KEDA's calls, from 127.0.0.1 on a new connection: the worker is active with 3 queued.
async fn keda_is_served(scaler: SocketAddr) {
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{scaler}"))
            .unwrap()
            .connect()
            .await
            .expect("KEDA's client connects");
        let mut client = ExternalScalerClient::new(channel);
        let active = client.is_active(scaled_object()).await.unwrap();
        assert!(active.into_inner().result);
        let metrics = client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(scaled_object()),
                metric_name: METRIC_NAME.into(),
            })
            .await
            .unwrap();
        assert_eq!(
            metrics.into_inner().metric_values[0].metric_value_float,
            3.0
        );
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("KEDA's client was not answered within 10s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_neither_exhaust_descriptors_nor_lock_keda_out() {
    let own_limit = raise_own_nofile();
    assert!(
        own_limit as usize > SILENT + 1000,
        "this test needs a descriptor limit over {SILENT}; the hard limit is {own_limit}"
    );
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("default", 3, 0);
    let dir = TempDir::new("scaler-limits");
    let config = dir.file(
        "c.yaml",
        &format!(
            "refreshInterval: 100ms
source: {{type: airflow-api, airflowApi: {{url: \"http://{}\"}}}}
auth: {{disabled: true}}
workers:
  - {{name: astro-worker-default, queues: [default], syncSlots: 8}}
",
            airflow_server.addr
        ),
    );
    let (sentinel, api, scaler) = start_sentinel(&config);
    eventually(Duration::from_secs(10), "ready", || async {
        (keda_get(api, "/readyz", None).await.status == 200).then_some(())
    })
    .await;
    keda_is_served(scaler).await;
    let before = open_descriptors(sentinel.0.id()).unwrap();

    // The most descriptors the Sentinel holds until every silent connection is closed.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        let pid = sentinel.0.id();
        tokio::task::spawn_blocking(move || {
            let mut most = 0;
            while sampling.load(Ordering::SeqCst) {
                let Some(open) = open_descriptors(pid) else {
                    break;
                };
                most = most.max(open);
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    // Open them all; each waits for the Sentinel to close it, and never writes a byte.
    let started = Instant::now();
    let closed = Arc::new(AtomicUsize::new(0));
    let mut silent = JoinSet::new();
    // A few at a time: connections past a full listen queue would be dropped by the kernel
    // unseen by the Sentinel, and a client that never writes would not notice.
    for chunk in (0..SILENT).collect::<Vec<_>>().chunks(64) {
        let connected = join_all(chunk.iter().map(|i| async move {
            let socket = TcpSocket::new_v4().unwrap();
            socket
                .bind(SocketAddr::from((SOURCES[i % SOURCES.len()], 0)))
                .unwrap();
            tokio::time::timeout(Duration::from_secs(10), socket.connect(scaler)).await
        }))
        .await;
        for stream in connected {
            let mut stream = stream
                .expect("the Sentinel's listen queue stayed full for 10s")
                .expect("connect");
            let closed = closed.clone();
            silent.spawn(async move {
                // Whatever the Sentinel sends (its HTTP/2 SETTINGS), until it closes.
                let _ = stream.read_to_end(&mut Vec::new()).await;
                closed.fetch_add(1, Ordering::SeqCst);
                stream
            });
        }
    }
    let opened = started.elapsed();
    keda_is_served(scaler).await;
    eventually(
        Duration::from_secs(60),
        "the Sentinel to close every silent connection",
        || async { (closed.load(Ordering::SeqCst) == SILENT).then_some(()) },
    )
    .await;
    let all_closed = started.elapsed();
    sampling.store(false, Ordering::SeqCst);
    let most = sampler.await.unwrap();
    let held = SOURCES.len() * MAX_CONNECTIONS_PER_PEER;
    eprintln!(
        "{SILENT} silent connections opened in {opened:.2?}, all closed by the Sentinel after \
         {all_closed:.2?}; its descriptors: {before} before, at most {most} meanwhile \
         (limit {SENTINEL_NOFILE}; {held} connections may be held)"
    );
    assert!(
        most <= before + held + 8,
        "{most} descriptors open, {before} before the flood, {held} connections may be held"
    );
    silent.shutdown().await;
    drop(sentinel);
}
