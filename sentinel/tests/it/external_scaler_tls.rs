//! The external scaler port's TLS against the binary:
//! * its certificates rotated under a running Sentinel, as cert-manager renews a Secret mounted
//!   as a volume (the kubelet swaps the keys at once): the next connection gets the new server
//!   certificate and is checked against the new client CA, while a connection made before goes
//!   on; a change that does not work (a key that does not fit) is refused and the port keeps
//!   what it had;
//! * a client that starts a handshake and then drips a byte now and then (never silent long
//!   enough for the silent-connection limit) is cut at the handshake limit.

use astro_sentinel::serve::external_scaler::handshakes::HANDSHAKE_TIMEOUT;
use astro_sentinel::serve::external_scaler::proto::external_scaler_client::ExternalScalerClient;
use astro_sentinel::serve::external_scaler::proto::{GetMetricsRequest, ScaledObjectRef};
use astro_sentinel::serve::external_scaler::service::{METRIC_NAME, WORKER_KEY};
use std::net::SocketAddr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::sentinel_process::SentinelProcess;
use test_kit::test_certificates::{KeyPair, TestCa, Usage};
use test_kit::{eventually, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");
const WORKER: &str = "astro-worker-default";

/// A Secret volume as the kubelet writes it: each version of the keys in a folder of its own,
/// `..data` a symlink to the current one (swapped by a rename, so all keys change at once), and
/// each key a symlink through `..data`.
struct MountedSecret {
    dir: PathBuf,
    versions: AtomicUsize,
}

impl MountedSecret {
    const KEYS: [&str; 3] = ["tls.crt", "tls.key", "client-ca.crt"];

    fn new(dir: PathBuf) -> Self {
        std::fs::create_dir(&dir).unwrap();
        for key in Self::KEYS {
            symlink(format!("..data/{key}"), dir.join(key)).unwrap();
        }
        MountedSecret {
            dir,
            versions: AtomicUsize::new(0),
        }
    }

    fn path(&self, key: &str) -> String {
        self.dir.join(key).to_str().unwrap().to_string()
    }

    /// A new version of the keys: `cert`, `key` and `client_ca`'s certificate.
    fn write(&self, cert: &Path, key: &Path, client_ca: &TestCa) {
        let version = format!("..v{}", self.versions.fetch_add(1, Ordering::SeqCst));
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        for (name, from) in Self::KEYS
            .into_iter()
            .zip([cert, key, &client_ca.pair.cert])
        {
            std::fs::copy(from, self.dir.join(&version).join(name)).unwrap();
        }
        let staged = self.dir.join("..data_tmp");
        symlink(&version, &staged).unwrap();
        std::fs::rename(&staged, self.dir.join("..data")).unwrap();
    }
}

/// The two CAs of the port's mutual TLS (`suffix` tells generations apart), the Sentinel's
/// serving certificate and KEDA's client certificate.
struct Pki {
    server_ca: TestCa,
    client_ca: TestCa,
    server: KeyPair,
    keda: KeyPair,
}

impl Pki {
    fn new(dir: &Path, suffix: &str) -> Self {
        let server_ca = TestCa::new(dir, &format!("server-ca{suffix}"));
        let client_ca = TestCa::new(dir, &format!("client-ca{suffix}"));
        let server = server_ca.issue("sentinel", Usage::Server);
        let keda = client_ca.issue("keda", Usage::Client);
        Pki {
            server_ca,
            client_ca,
            server,
            keda,
        }
    }
}

/// A channel to the port that trusts `server_ca` and presents `client`.
async fn connect(
    scaler: SocketAddr,
    server_ca: &TestCa,
    client: &KeyPair,
) -> Result<Channel, String> {
    let pem = |p: &Path| std::fs::read_to_string(p).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem(&server_ca.pair.cert)))
        .identity(Identity::from_pem(pem(&client.cert), pem(&client.key)))
        .domain_name("127.0.0.1");
    Endpoint::from_shared(format!("https://{scaler}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// The backlog KEDA reads over `channel`.
async fn backlog(channel: Channel) -> Result<f64, String> {
    let request = GetMetricsRequest {
        scaled_object_ref: Some(ScaledObjectRef {
            name: WORKER.into(),
            namespace: "airflow".into(),
            scaler_metadata: [(WORKER_KEY.to_string(), WORKER.to_string())].into(),
        }),
        metric_name: METRIC_NAME.into(),
    };
    let mut client = ExternalScalerClient::new(channel);
    match tokio::time::timeout(Duration::from_secs(5), client.get_metrics(request)).await {
        Ok(Ok(answer)) => Ok(answer.into_inner().metric_values[0].metric_value_float),
        Ok(Err(status)) => Err(format!("{status:?}")),
        Err(_) => Err("no answer in 5 s".into()),
    }
}

/// The backlog read on a new connection that trusts `server_ca` and presents `client`.
async fn read_anew(
    scaler: SocketAddr,
    server_ca: &TestCa,
    client: &KeyPair,
) -> Result<f64, String> {
    backlog(connect(scaler, server_ca, client).await?).await
}

async fn reloads(sentinel: &SentinelProcess, outcome: &str) -> f64 {
    let series = format!(
        "astro_sentinel_external_scaler_certificate_reloads_total{{outcome=\"{outcome}\"}}"
    );
    sentinel.metric(&series).await.unwrap_or(0.0)
}

/// A Sentinel serving the port with mutual TLS from `secret`, which holds `server` and
/// `client_ca` at first; returns it with the port's address.
async fn start(
    dir: &TempDir,
    airflow: SocketAddr,
    secret: &MountedSecret,
) -> (SentinelProcess, SocketAddr) {
    let config = dir.file(
        "c.yaml",
        &format!(
            "refreshInterval: 100ms
source: {{type: airflow-api, airflowApi: {{url: \"http://{airflow}\"}}}}
auth: {{disabled: true}}
workers:
  - {{name: {WORKER}, queues: [default], syncSlots: 1}}
"
        ),
    );
    let sentinel = SentinelProcess::start(
        Path::new(BIN),
        &config,
        &[
            "--config-check-interval",
            "100ms",
            "--external-scaler-listen",
            "127.0.0.1:0",
            "--external-scaler-tls-cert",
            &secret.path("tls.crt"),
            "--external-scaler-tls-key",
            &secret.path("tls.key"),
            "--external-scaler-client-ca",
            &secret.path("client-ca.crt"),
        ],
        &[("ASTRO_SENTINEL_AIRFLOW_TOKEN", "airflow-token")],
    );
    let scaler = eventually(
        Duration::from_secs(10),
        "the external scaler's address",
        || {
            let log = sentinel.log();
            async move {
                log.iter()
                    .find(|l| l.contains("external scaler API") && l.contains("addr="))
                    .and_then(|l| {
                        l.split("addr=")
                            .nth(1)?
                            .split_whitespace()
                            .next()?
                            .parse()
                            .ok()
                    })
            }
        },
    )
    .await;
    (sentinel, scaler)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_reach_new_connections_and_a_broken_change_is_refused() {
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("default", 3, 0);
    let dir = TempDir::new("scaler-certificates");
    let Pki {
        server_ca,
        client_ca,
        server,
        keda,
    } = Pki::new(&dir.0, "");
    let secret = MountedSecret::new(dir.0.join("secret"));
    secret.write(&server.cert, &server.key, &client_ca);
    let (mut sentinel, scaler) = start(&dir, airflow_server.addr, &secret).await;
    let before = eventually(Duration::from_secs(10), "the backlog served", || async {
        read_anew(scaler, &server_ca, &keda).await.ok()
    })
    .await;
    assert_eq!(before, 3.0);
    let open_before = connect(scaler, &server_ca, &keda).await.unwrap();

    // Renewed: a new server certificate from a new CA, and KEDA's client CA rotated too.
    let Pki {
        server_ca: new_server_ca,
        client_ca: new_client_ca,
        server: new_server,
        keda: new_keda,
    } = Pki::new(&dir.0, "-2");
    secret.write(&new_server.cert, &new_server.key, &new_client_ca);
    eventually(Duration::from_secs(10), "the change applied", || async {
        (reloads(&sentinel, "applied").await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(read_anew(scaler, &new_server_ca, &new_keda).await, Ok(3.0));
    let old_server = read_anew(scaler, &server_ca, &new_keda).await;
    assert!(
        old_server.is_err(),
        "the old server certificate is still served: {old_server:?}"
    );
    let old_client = read_anew(scaler, &new_server_ca, &keda).await;
    assert!(
        old_client.is_err(),
        "a client certificate of the old CA is still accepted: {old_client:?}"
    );
    assert_eq!(
        backlog(open_before).await,
        Ok(3.0),
        "a connection made before the change is served on"
    );

    // A key that does not fit the certificate: refused, and the port serves what it had.
    let stray = new_server_ca.issue("stray", Usage::Server);
    secret.write(&new_server.cert, &stray.key, &new_client_ca);
    eventually(
        Duration::from_secs(10),
        "the broken change refused",
        || async { (reloads(&sentinel, "refused").await >= 1.0).then_some(()) },
    )
    .await;
    // The log is read from the process's stderr by another thread: it may trail the metric
    // (a loaded CI run read the log first).
    eventually(
        Duration::from_secs(10),
        "the refusal's reason in the log",
        || async {
            sentinel
                .log()
                .iter()
                .any(|l| l.contains("--external-scaler-tls-key: does not fit"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(read_anew(scaler, &new_server_ca, &new_keda).await, Ok(3.0));
    assert_eq!(reloads(&sentinel, "applied").await, 1.0);
    assert_eq!(sentinel.stop(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_dripped_a_byte_at_a_time_is_cut_at_the_handshake_limit() {
    let (_airflow, airflow_server) = fake_airflow().await;
    let dir = TempDir::new("scaler-handshake");
    let pki = Pki::new(&dir.0, "");
    let secret = MountedSecret::new(dir.0.join("secret"));
    secret.write(&pki.server.cert, &pki.server.key, &pki.client_ca);
    let (_sentinel, scaler) = start(&dir, airflow_server.addr, &secret).await;

    // A TLS record header announcing a large ClientHello, then its body a byte every 2 s:
    // never silent for the silent-connection limit, never a whole handshake.
    let mut drip = TcpStream::connect(scaler).await.unwrap();
    let opened = Instant::now();
    drip.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00])
        .await
        .unwrap();
    let mut answer = [0u8; 512];
    let closed = loop {
        tokio::select! {
            read = drip.read(&mut answer) => match read {
                Ok(0) | Err(_) => break opened.elapsed(),
                Ok(_) => {}
            },
            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                if drip.write_all(&[0x01]).await.is_err() {
                    break opened.elapsed();
                }
            }
        }
        assert!(
            opened.elapsed() < HANDSHAKE_TIMEOUT * 3,
            "the dripping handshake still held its connection after {:?}",
            opened.elapsed()
        );
    };
    assert!(
        closed >= HANDSHAKE_TIMEOUT - Duration::from_secs(1),
        "closed after {closed:?}, before the handshake limit: something else cut it"
    );
    println!("a dripping handshake was cut {closed:?} after it connected");
}
