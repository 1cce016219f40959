//! A private certificate authority to trust for an https Airflow (`--ca-file`).
//!
//! The CA is trusted *in addition to* the Mozilla roots built into the client (reqwest's
//! `rustls-tls`): an api-server behind a public certificate keeps working when a CA file is
//! given, and one CA file can serve a mixed fleet.

use crate::error::with_causes;
use std::path::{Path, PathBuf};

/// The certificates of a PEM bundle, checked when loaded so that a bad file is a start-up
/// error naming the file rather than a failure at the first request.
#[derive(Clone, Debug)]
pub struct TrustedCa {
    path: PathBuf,
    certificates: Vec<reqwest::Certificate>,
}

impl TrustedCa {
    /// Reads every certificate of the PEM file at `path`; the error names the file.
    pub fn from_pem_file(path: &Path) -> Result<Self, String> {
        let named = |problem: String| format!("{}: {problem}", path.display());
        let pem = std::fs::read(path).map_err(|e| named(format!("cannot read: {e}")))?;
        let certificates =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| named(e.to_string()))?;
        if certificates.is_empty() {
            return Err(named("no PEM certificate in the file".into()));
        }
        let ca = TrustedCa {
            path: path.to_path_buf(),
            certificates,
        };
        // reqwest parses the certificates only when a client is built: build one now.
        ca.add_to(reqwest::Client::builder())
            .build()
            .map_err(|e| named(format!("not a usable CA certificate: {}", with_causes(&e))))?;
        Ok(ca)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `builder` trusting this CA as well as the built-in roots.
    pub fn add_to(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        self.certificates
            .iter()
            .cloned()
            .fold(builder, |b, cert| b.add_root_certificate(cert))
    }
}

/// Adds `ca`, when given, to `builder`.
pub(crate) fn trusting(
    builder: reqwest::ClientBuilder,
    ca: Option<&TrustedCa>,
) -> reqwest::ClientBuilder {
    match ca {
        Some(ca) => ca.add_to(builder),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airflow-trusted-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn a_file_without_certificates_is_refused_with_its_name() {
        let path = temp_file("empty.pem", "not a certificate\n");
        let err = TrustedCa::from_pem_file(&path).unwrap_err();
        assert!(
            err.contains("empty.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_file_is_refused_with_its_name() {
        let err = TrustedCa::from_pem_file(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(err.contains("/nonexistent/ca.pem: cannot read"), "{err}");
    }

    #[test]
    fn a_certificate_block_that_is_not_a_certificate_is_refused() {
        let path = temp_file(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let err = TrustedCa::from_pem_file(&path).unwrap_err();
        assert!(err.contains("garbage.pem"), "{err}");
    }
}
