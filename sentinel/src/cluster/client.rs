//! One Kubernetes client, configured as the TokenReview client is: the API server URL, the
//! cluster CA and the Sentinel's service-account token file (re-read by the client as the
//! kubelet rotates it).

use crate::settings::KubernetesAccess;

pub fn kube_client(access: &KubernetesAccess, namespace: &str) -> Result<kube::Client, String> {
    let url: http::Uri = access
        .api_url
        .as_str()
        .parse()
        .map_err(|e| format!("--kubernetes-api-url {}: {e}", access.api_url))?;
    let mut config = kube::Config::new(url);
    config.default_namespace = namespace.to_string();
    if access.api_url.scheme() == "https" {
        config.root_cert_file = Some(access.ca_file.clone());
    }
    config.auth_info.token_file = Some(access.token_file.display().to_string());
    kube::Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}
