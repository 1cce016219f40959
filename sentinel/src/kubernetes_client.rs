//! The Sentinel's Kubernetes clients, for the worker Deployments and pods and for TokenReview,
//! configured alike: the API server URL, the cluster CA (only it is trusted, re-read as it
//! rotates) and the Sentinel's service-account token file (re-read at least once a minute, as
//! client-go does; the kubelet rotates the token well before the previous one expires).

use crate::config::kubernetes_access::KubernetesAccess;

/// For the watches and patches of the worker Deployments and pods: transient API server
/// answers (429, 503, 504) are retried with backoff.
pub fn kube_client(access: &KubernetesAccess) -> Result<kube::Client, String> {
    client(access, true)
}

/// For TokenReview: nothing is retried. A review answers a waiting request, whose caller asks
/// again anyway, and retrying an API server that answered 429 would multiply the load the
/// review budget bounds.
pub fn review_client(access: &KubernetesAccess) -> Result<kube::Client, String> {
    client(access, false)
}

fn client(access: &KubernetesAccess, retry_transient: bool) -> Result<kube::Client, String> {
    let url: http::Uri = access
        .api_url
        .as_str()
        .parse()
        .map_err(|e| format!("--kubernetes-api-url {}: {e}", access.api_url))?;
    let mut config = kube::Config::new(url);
    if access.api_url.scheme() == "https" {
        config.root_cert_file = Some(access.ca_file.clone());
    }
    config.auth_info.token_file = Some(access.token_file.display().to_string());
    config.default_retry = retry_transient;
    kube::Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}
