//! TLS for the Postgres source, with libpq's `sslmode` meanings on top of rustls:
//!
//! | sslMode       | TLS                 | certificate checked                                |
//! | ------------- | ------------------- | -------------------------------------------------- |
//! | `disable`     | never               | –                                                  |
//! | `prefer`      | if the server has it| no                                                 |
//! | `require`     | always              | no; chain only (like verify-ca) when caFile is set |
//! | `verify-ca`   | always              | chain against caFile                               |
//! | `verify-full` | always              | chain against caFile (or the system's roots) and host name |
//!
//! The configuration guarantees a CA for the verify modes (see `config::file::postgres_options`).
//! The crypto provider is passed explicitly (ring), so nothing depends on a process default.

use crate::config::file::{PostgresCa, PostgresOptions, SslMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What to connect with: plain TCP, or rustls plus tokio-postgres's own `sslmode`.
pub enum PostgresTls {
    Plain,
    Rustls {
        connector: MakeRustlsConnect,
        mode: tokio_postgres::config::SslMode,
    },
}

pub fn postgres_tls(options: &PostgresOptions) -> Result<PostgresTls, String> {
    use tokio_postgres::config::SslMode as PgMode;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = || load_roots(options);
    let (verifier, mode): (Arc<dyn ServerCertVerifier>, PgMode) = match options.ssl_mode {
        SslMode::Disable => return Ok(PostgresTls::Plain),
        SslMode::Prefer => (Arc::new(NoVerification(provider.clone())), PgMode::Prefer),
        SslMode::Require if options.ca.is_none() => {
            (Arc::new(NoVerification(provider.clone())), PgMode::Require)
        }
        SslMode::Require | SslMode::VerifyCa => (
            Arc::new(ChainOnly(webpki_verifier(roots()?, &provider)?)),
            PgMode::Require,
        ),
        SslMode::VerifyFull => (webpki_verifier(roots()?, &provider)?, PgMode::Require),
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(PostgresTls::Rustls {
        connector: MakeRustlsConnect::new(config),
        mode,
    })
}

fn load_roots(options: &PostgresOptions) -> Result<RootCertStore, String> {
    match &options.ca {
        Some(PostgresCa::File(path)) => load_ca_file(path),
        Some(PostgresCa::System) => load_system_roots(),
        None => Err(format!(
            "source.postgres.caFile: needed to check certificates with sslMode {}",
            options.ssl_mode
        )),
    }
}

/// libpq's `sslrootcert=system`: the roots the operating system trusts (OpenSSL's default
/// paths, `SSL_CERT_FILE` / `SSL_CERT_DIR` included), not a bundle compiled into the binary.
fn load_system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _unusable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        return Err(format!(
            "source.postgres.caFile: system: no trusted root certificate found on this system{why}"
        ));
    }
    Ok(roots)
}

fn load_ca_file(path: &std::path::Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("source.postgres.caFile {}: {e}", path.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("source.postgres.caFile {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("source.postgres.caFile {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "source.postgres.caFile {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(roots)
}

fn webpki_verifier(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("TLS setup: {e}"))
}

/// libpq's `prefer`/`require`: encrypt, but take any certificate (the handshake signature is
/// still checked, so the peer holds the key of the certificate it shows).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// libpq's `verify-ca`: the chain must lead to a trusted root; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn opts(mode: SslMode, ca: Option<PathBuf>) -> PostgresOptions {
        PostgresOptions {
            ssl_mode: mode,
            ca: ca.map(PostgresCa::File),
        }
    }

    #[test]
    fn modes_map_to_libpq_behaviour() {
        use tokio_postgres::config::SslMode as Pg;
        assert!(matches!(
            postgres_tls(&opts(SslMode::Disable, None)),
            Ok(PostgresTls::Plain)
        ));
        for (mode, expected) in [
            (SslMode::Prefer, Pg::Prefer),
            (SslMode::Require, Pg::Require),
        ] {
            match postgres_tls(&opts(mode, None)) {
                Ok(PostgresTls::Rustls { mode, .. }) => assert_eq!(mode, expected),
                _ => panic!("{mode:?}"),
            }
        }
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let err = postgres_tls(&opts(mode, None)).err().expect("refused");
            assert!(err.starts_with("source.postgres.caFile:"), "{err}");
        }
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("astro-sentinel-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.crt");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = postgres_tls(&opts(SslMode::VerifyFull, Some(path)))
            .err()
            .expect("refused");
        assert!(err.contains("caFile"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
