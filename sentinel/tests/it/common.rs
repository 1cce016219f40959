//! Starting a Sentinel in-process against a fake Airflow (the fakes are in `test-kit`).

use astro_sentinel::app::{self, Running};
use astro_sentinel::config::file::Config;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use astro_sentinel::metrics::Metrics;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Starts a Sentinel on 127.0.0.1:0 reading `fake` with token `airflow-token`.
pub async fn start_against(
    fake_addr: SocketAddr,
    yaml_rest: &str,
    kubernetes: Option<KubernetesAccess>,
) -> Running {
    try_start_against(fake_addr, yaml_rest, kubernetes)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`start_against`], returning why the Sentinel did not start.
pub async fn try_start_against(
    fake_addr: SocketAddr,
    yaml_rest: &str,
    kubernetes: Option<KubernetesAccess>,
) -> Result<Running, app::StartError> {
    let yaml = format!(
        "source:\n  type: airflow-api\n  airflowApi:\n    url: http://{fake_addr}\n{yaml_rest}"
    );
    let config = Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let metrics = Arc::new(Metrics::new());
    let source = app::build_source(
        &astro_sentinel::config::flags::SourceSettings::AirflowApi {
            url: url::Url::parse(&format!("http://{fake_addr}")).unwrap(),
            credentials: airflow::rest_api::RestCredentials::Token("airflow-token".into()),
            ca: None,
        },
        &metrics,
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::start_with(config, kubernetes, source, metrics, listener).await
}
