//! How the Sentinel (and its `ensure-secrets` command) reaches the Kubernetes API server as
//! its own service account: the flags, and the access they resolve to.

use clap::Args;
use std::path::PathBuf;
use url::Url;

/// Where Kubernetes mounts a pod's service-account token and the cluster CA.
pub const DEFAULT_KUBERNETES_TOKEN_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const DEFAULT_KUBERNETES_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

#[derive(Debug, Args)]
pub struct KubernetesFlags {
    /// Kubernetes API server (TokenReview; the workers' Deployments and pods; Secrets) [default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT]
    #[arg(long, env = "ASTRO_SENTINEL_KUBERNETES_API_URL", value_name = "URL")]
    pub kubernetes_api_url: Option<String>,

    /// The Sentinel's own service-account token, re-read as it rotates
    #[arg(long, env = "ASTRO_SENTINEL_KUBERNETES_TOKEN_FILE", value_name = "PATH",
          default_value = DEFAULT_KUBERNETES_TOKEN_FILE)]
    pub kubernetes_token_file: PathBuf,

    /// CA bundle that signs the API server's certificate (used for https URLs)
    #[arg(long, env = "ASTRO_SENTINEL_KUBERNETES_CA_FILE", value_name = "PATH",
          default_value = DEFAULT_KUBERNETES_CA_FILE)]
    pub kubernetes_ca_file: PathBuf,
}

/// How to reach the Kubernetes API server as the Sentinel's own service account.
#[derive(Debug, Clone)]
pub struct KubernetesAccess {
    pub api_url: Url,
    pub token_file: PathBuf,
    /// Only read for https URLs.
    pub ca_file: PathBuf,
}

impl KubernetesFlags {
    /// `env` looks up `KUBERNETES_SERVICE_HOST/PORT` (the default URL); the error names the
    /// flag to set.
    pub fn access(&self, env: impl Fn(&str) -> Option<String>) -> Result<KubernetesAccess, String> {
        let api_url = match self.kubernetes_api_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Url::parse(url)
                .map_err(|e| format!("--kubernetes-api-url: invalid URL {url:?}: {e}"))?,
            _ => {
                let host = env("KUBERNETES_SERVICE_HOST")
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| {
                        "--kubernetes-api-url: this needs the Kubernetes API server and \
                         KUBERNETES_SERVICE_HOST is not set (not in a cluster?); set --kubernetes-api-url"
                            .to_string()
                    })?;
                let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                Url::parse(&format!("https://{host}:{port}")).map_err(|e| {
                    format!(
                        "--kubernetes-api-url: KUBERNETES_SERVICE_HOST/PORT do not form a URL: {e}"
                    )
                })?
            }
        };
        if !matches!(api_url.scheme(), "http" | "https") {
            return Err(format!(
                "--kubernetes-api-url: must be http(s), got {api_url}"
            ));
        }
        if api_url.scheme() == "https" && !self.kubernetes_ca_file.is_file() {
            return Err(format!(
                "--kubernetes-ca-file: {} is not a readable file (needed for {api_url})",
                self.kubernetes_ca_file.display()
            ));
        }
        Ok(KubernetesAccess {
            api_url,
            token_file: self.kubernetes_token_file.clone(),
            ca_file: self.kubernetes_ca_file.clone(),
        })
    }
}
