//! The flags of the external scaler port and its TLS.
//!
//! KEDA's external scaler client (v2.21) sends nothing but the `ScaledObjectRef` — no
//! `authorization` metadata — and authenticates only through TLS: `caCert` to check the
//! Sentinel's certificate and `tlsClientCert` / `tlsClientKey` as its client certificate, from
//! a TriggerAuthentication. So this port's auth is mutual TLS: with `auth.disabled: false` the
//! Sentinel requires a client certificate signed by `--external-scaler-client-ca` (give it a CA
//! of its own: every certificate it signed may read backlogs). With `auth.disabled: true` the
//! port may be plain gRPC, like `/v1` without a token. The files are read at start-up (an
//! unusable one is a configuration error) and again whenever they change
//! (`super::certificates`).

use super::certificates::Certificates;
use crate::config::ConfigError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ExternalScalerFlags {
    /// Address of the gRPC port for KEDA's external-push trigger (off when unset)
    #[arg(
        long,
        env = "ASTRO_SENTINEL_EXTERNAL_SCALER_LISTEN",
        value_name = "ADDR"
    )]
    pub external_scaler_listen: Option<String>,

    /// Certificate (PEM) the external scaler port serves
    #[arg(
        long,
        env = "ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_CERT",
        value_name = "PATH"
    )]
    pub external_scaler_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --external-scaler-tls-cert
    #[arg(
        long,
        env = "ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_KEY",
        value_name = "PATH"
    )]
    pub external_scaler_tls_key: Option<PathBuf>,

    /// CA bundle (PEM) that signs the client certificates KEDA presents (required unless auth.disabled)
    #[arg(
        long,
        env = "ASTRO_SENTINEL_EXTERNAL_SCALER_CLIENT_CA",
        value_name = "PATH"
    )]
    pub external_scaler_client_ca: Option<PathBuf>,
}

/// The external scaler port, validated.
#[derive(Debug, Clone)]
pub struct ExternalScalerSettings {
    pub listen: SocketAddr,
    pub tls: Option<TlsFiles>,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Set: clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

impl ExternalScalerSettings {
    /// `None` when the port is off; an error naming the flag when the flags do not fit together
    /// or leave the port open while `/v1` requires auth.
    pub fn from_flags(
        flags: &ExternalScalerFlags,
        auth_disabled: bool,
    ) -> Result<Option<Self>, ConfigError> {
        let cert = flags.external_scaler_tls_cert.clone();
        let key = flags.external_scaler_tls_key.clone();
        let client_ca = flags.external_scaler_client_ca.clone();
        let Some(listen) = flags
            .external_scaler_listen
            .as_deref()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        else {
            if cert.is_some() || key.is_some() || client_ca.is_some() {
                return Err(ConfigError::new(
                    "--external-scaler-listen: required with the other --external-scaler-* flags",
                ));
            }
            return Ok(None);
        };
        let listen = SocketAddr::from_str(listen).map_err(|e| {
            ConfigError::new(format!(
                "--external-scaler-listen: {listen:?} is not an address like 0.0.0.0:39093: {e}"
            ))
        })?;
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "--external-scaler-tls-key: required with --external-scaler-tls-cert",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "--external-scaler-tls-cert: required with --external-scaler-tls-key",
                ))
            }
            (None, None) if client_ca.is_some() => {
                return Err(ConfigError::new(
                    "--external-scaler-tls-cert: mutual TLS (--external-scaler-client-ca) needs the port's own certificate and key",
                ))
            }
            (None, None) => None,
        };
        if !auth_disabled && tls.as_ref().is_none_or(|t| t.client_ca.is_none()) {
            return Err(ConfigError::new(
                "--external-scaler-client-ca: required unless auth.disabled is true: KEDA's external \
                 scalers authenticate only with a TLS client certificate (and --external-scaler-tls-cert/-key)",
            ));
        }
        Ok(Some(ExternalScalerSettings { listen, tls }))
    }

    /// Reads the certificates (`None`: plain gRPC).
    pub fn certificates(&self) -> Result<Option<Certificates>, ConfigError> {
        self.tls.as_ref().map(Certificates::load).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(listen: Option<&str>, cert: bool, key: bool, ca: bool) -> ExternalScalerFlags {
        ExternalScalerFlags {
            external_scaler_listen: listen.map(str::to_string),
            external_scaler_tls_cert: cert.then(|| "c.pem".into()),
            external_scaler_tls_key: key.then(|| "k.pem".into()),
            external_scaler_client_ca: ca.then(|| "ca.pem".into()),
        }
    }

    fn error(f: ExternalScalerFlags, auth_disabled: bool) -> String {
        ExternalScalerSettings::from_flags(&f, auth_disabled)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn off_unless_listen_is_set() {
        let none = ExternalScalerSettings::from_flags(&flags(None, false, false, false), false);
        assert!(none.unwrap().is_none());
        assert!(
            error(flags(None, true, true, true), false).starts_with("--external-scaler-listen:")
        );
        assert!(error(flags(Some("nope"), true, true, true), false)
            .starts_with("--external-scaler-listen: \"nope\""));
    }

    #[test]
    fn auth_needs_mutual_tls() {
        let addr = Some("127.0.0.1:0");
        for f in [
            flags(addr, false, false, false),
            flags(addr, true, true, false),
        ] {
            assert!(error(f, false)
                .starts_with("--external-scaler-client-ca: required unless auth.disabled"));
        }
        let s = ExternalScalerSettings::from_flags(&flags(addr, true, true, true), false)
            .unwrap()
            .unwrap();
        assert!(s.tls.unwrap().client_ca.is_some());
        // Without auth, plain gRPC or server-only TLS are allowed.
        let plain = ExternalScalerSettings::from_flags(&flags(addr, false, false, false), true);
        assert!(plain.unwrap().unwrap().tls.is_none());
        assert!(ExternalScalerSettings::from_flags(&flags(addr, true, true, false), true).is_ok());
    }

    #[test]
    fn certificate_and_key_come_together() {
        let addr = Some("127.0.0.1:0");
        assert!(
            error(flags(addr, true, false, true), false).starts_with("--external-scaler-tls-key:")
        );
        assert!(
            error(flags(addr, false, true, true), false).starts_with("--external-scaler-tls-cert:")
        );
        assert!(
            error(flags(addr, false, false, true), true).starts_with("--external-scaler-tls-cert:")
        );
    }
}
