//! The external scaler port's TLS, read again whenever its files change: a certificate renewed
//! by cert-manager (or a client CA rotated) reaches a Kubernetes Secret volume in place, and
//! the port serves it to the next connection without a restart. Connections already open keep
//! the certificate they were made with, as with any TLS server.
//!
//! The files are compared by content every check interval rather than watched for events: a
//! Secret volume swaps a symlink to a new directory, which file events report unreliably. A
//! change that does not make a working configuration (a key that does not match, a half-written
//! file) is refused and logged; the port keeps serving what it had.

use super::tls::TlsFiles;
use crate::config::ConfigError;
use prometheus::IntCounterVec;
use rustls::crypto::ring::default_provider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// HTTP/2, the only protocol the port speaks: gRPC clients (grpc-go since 1.67) require it
/// in ALPN.
const ALPN_H2: &[u8] = b"h2";

/// The files' contents, as last read: what the configuration in force was built from.
#[derive(PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

pub struct Certificates {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    /// What was last read, applied or refused: a refused change is logged once, not at every
    /// check.
    last_read: Mutex<Contents>,
}

impl Certificates {
    /// Reads the files; an error names the flag of the file that is unreadable or unusable.
    pub fn load(files: &TlsFiles) -> Result<Self, ConfigError> {
        let contents = read_all(files)?;
        let config = server_config(&contents)?;
        Ok(Certificates {
            files: files.clone(),
            current: RwLock::new(Arc::new(config)),
            last_read: Mutex::new(contents),
        })
    }

    /// The configuration a new connection's handshake uses.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().expect("not poisoned").clone()
    }

    /// Checks the files every `interval` until `shutdown`, counting each change in
    /// `reloads{outcome}` (`applied` or `refused`).
    pub async fn follow(
        self: Arc<Self>,
        interval: Duration,
        reloads: IntCounterVec,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => return,
            }
            let certificates = self.clone();
            let checked = tokio::task::spawn_blocking(move || certificates.check()).await;
            match checked {
                Ok(Some(Ok(()))) => {
                    reloads.with_label_values(&["applied"]).inc();
                    tracing::info!(
                        cert = %self.files.cert.display(),
                        "external scaler certificates changed: new connections get the new ones"
                    );
                }
                Ok(Some(Err(e))) => {
                    reloads.with_label_values(&["refused"]).inc();
                    tracing::warn!(error = %e, "external scaler certificates changed but unusable; serving the previous ones");
                }
                Ok(None) | Err(_) => {}
            }
        }
    }

    /// Reads the files; `None` when they are as last read (or cannot be read: a Secret volume
    /// in the middle of its swap), else whether the change was applied.
    fn check(&self) -> Option<Result<(), ConfigError>> {
        let contents = read_all(&self.files).ok()?;
        let mut last = self.last_read.lock().expect("not poisoned");
        if *last == contents {
            return None;
        }
        let built = server_config(&contents);
        *last = contents;
        Some(built.map(|config| {
            *self.current.write().expect("not poisoned") = Arc::new(config);
        }))
    }
}

fn read_all(files: &TlsFiles) -> Result<Contents, ConfigError> {
    Ok(Contents {
        cert: read(&files.cert, "--external-scaler-tls-cert")?,
        key: read(&files.key, "--external-scaler-tls-key")?,
        client_ca: files
            .client_ca
            .as_deref()
            .map(|ca| read(ca, "--external-scaler-client-ca"))
            .transpose()?,
    })
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| ConfigError::new(format!("{flag}: cannot read {}: {e}", path.display())))
}

/// The rustls configuration of `contents`: the certificate chain and its key, and with a client
/// CA, client certificates required and checked against it.
fn server_config(contents: &Contents) -> Result<ServerConfig, ConfigError> {
    let chain = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(format!("--external-scaler-tls-cert: not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(ConfigError::new(
            "--external-scaler-tls-cert: holds no PEM certificate",
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
        ConfigError::new(format!(
            "--external-scaler-tls-key: no PEM private key: {e}"
        ))
    })?;
    let provider = Arc::new(default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new(format!("--external-scaler-tls-cert: {e}")))?;
    let builder = match &contents.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| {
                    ConfigError::new(format!("--external-scaler-client-ca: not PEM: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    ConfigError::new(format!(
                        "--external-scaler-client-ca: not a CA certificate: {e}"
                    ))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ConfigError::new(format!("--external-scaler-client-ca: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        ConfigError::new(format!(
            "--external-scaler-tls-key: does not fit --external-scaler-tls-cert: {e}"
        ))
    })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(files: &TlsFiles) -> String {
        match Certificates::load(files) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn unreadable_or_non_pem_files_name_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("hello.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let missing = TlsFiles {
            cert: not_pem.clone(),
            key: dir.path().join("missing.pem"),
            client_ca: None,
        };
        let e = error(&missing);
        assert!(
            e.starts_with("--external-scaler-tls-key: cannot read"),
            "{e}"
        );
        let garbage = TlsFiles {
            cert: not_pem.clone(),
            key: not_pem.clone(),
            client_ca: Some(not_pem),
        };
        let e = error(&garbage);
        assert!(
            e.starts_with("--external-scaler-tls-cert: holds no PEM"),
            "{e}"
        );
    }
}
