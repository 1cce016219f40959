//! TokenReview over HTTPS as in a cluster: the API server's certificate must chain to the
//! configured CA file (and only to it), as with the in-cluster `ca.crt`.

use crate::common::*;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use test_kit::fake_kubernetes::FakeKubernetes;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::test_certificates::{TestCa, Usage};
use test_kit::{eventually, TempDir};
use tokio::net::TcpListener;

const KEDA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.a2VkYQ";

/// Serves the fake Kubernetes API over TLS with `crt`/`key`.
async fn serve_tls(
    fake: Arc<FakeKubernetes>,
    crt: &Path,
    key: &Path,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(crt)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let fake = fake.clone();
            tokio::spawn(async move {
                // A client that distrusts the certificate aborts the handshake here.
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = service_fn(move |req| {
                    let fake = fake.clone();
                    async move { Ok::<_, std::convert::Infallible>(fake.answer(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_over_https_trusts_the_configured_ca_only() {
    let dir = TempDir::new("tls");
    let cluster_ca = TestCa::new(&dir.0, "cluster-ca");
    let server = cluster_ca.issue("server", Usage::Server);
    let other_ca = TestCa::new(&dir.0, "other-ca");
    let fake = FakeKubernetes::new("own-token");
    fake.users
        .lock()
        .unwrap()
        .insert(KEDA_TOKEN.into(), "system:serviceaccount:keda:k".into());
    let (kube_addr, kube_task) = serve_tls(fake.clone(), &server.cert, &server.key).await;
    let (airflow, airflow_server) = fake_airflow().await;
    airflow.set("q", 4, 0);
    let token_file = dir.file("own-token", "own-token");
    let yaml = "refreshInterval: 100ms\nauth:\n  tokenReview: {allowedUsernames: [\"system:serviceaccount:keda:k\"]}\nworkers:\n  - {name: w, queues: [q]}\n";

    for (ca, expected) in [(&cluster_ca.pair.cert, 200), (&other_ca.pair.cert, 503)] {
        let access = KubernetesAccess {
            api_url: url::Url::parse(&format!("https://{kube_addr}")).unwrap(),
            token_file: token_file.clone(),
            ca_file: ca.clone(),
        };
        let sentinel = start_against(airflow_server.addr, yaml, Some(access)).await;
        let addr = sentinel.addr();
        eventually(Duration::from_secs(5), "ready", || async {
            (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
        })
        .await;
        let a = keda_get(addr, "/v1/workers/w", Some(KEDA_TOKEN)).await;
        assert_eq!(a.status, expected, "CA {}: {}", ca.display(), a.body);
        sentinel.stop().await;
    }
    assert_eq!(
        fake.reviews(),
        1,
        "only the trusted connection reached the API server"
    );
    kube_task.abort();
}
