//! `astro-sentinel ensure-secrets`: makes the secrets the chart must not make at render time
//! (a render must give the same output every time, or GitOps tools see a change at every sync
//! and rotate them): KEDA's bearer token and the external-scaler port's CA and certificates.
//! The chart runs it in a hook Job before each install and upgrade, so the Secrets exist before
//! KEDA builds a scaler from its TriggerAuthentication (KEDA reads those Secrets once then).
//! What exists and is good is kept; what is missing, broken or due is made again. Exit codes:
//! 0 done, 2 invalid flags (one line naming the flag), 1 the API server refused or failed.

mod certificates;
mod store;
mod token;

use crate::config::kubernetes_access::KubernetesFlags;
use crate::kubernetes_client::kube_client;
use clap::Parser;
use logging::flags::EXIT_CONFIG;
use std::ffi::OsString;
use std::process::ExitCode;
use store::{SecretStore, TextData};

#[derive(Debug, Parser)]
#[command(
    name = "astro-sentinel ensure-secrets",
    about = "Creates the Secrets the Sentinel's callers authenticate with, if absent, and renews what is due."
)]
struct Flags {
    /// Namespace of the Secrets
    #[arg(long, env = "ASTRO_SENTINEL_NAMESPACE", value_name = "NAMESPACE")]
    namespace: String,

    /// Secret that holds KEDA's bearer token (key `token`)
    #[arg(long, value_name = "NAME")]
    keda_token_secret: Option<String>,

    /// Secret that holds the external-scaler port's CA (ca.crt, ca.key; mounted nowhere)
    #[arg(long, value_name = "NAME", requires_all = [
        "external_scaler_server_secret", "external_scaler_client_secret", "external_scaler_dns_names"
    ])]
    external_scaler_ca_secret: Option<String>,

    /// Secret with the Sentinel's serving certificate (tls.crt, tls.key, ca.crt)
    #[arg(long, value_name = "NAME", requires = "external_scaler_ca_secret")]
    external_scaler_server_secret: Option<String>,

    /// Secret with KEDA's client certificate (tls.crt, tls.key, ca.crt)
    #[arg(long, value_name = "NAME", requires = "external_scaler_ca_secret")]
    external_scaler_client_secret: Option<String>,

    /// A DNS name KEDA dials the Sentinel by; the serving certificate carries each (repeat)
    #[arg(
        long = "external-scaler-dns-name",
        value_name = "NAME",
        requires = "external_scaler_ca_secret"
    )]
    external_scaler_dns_names: Vec<String>,

    /// Common name of the serving certificate (the CA is named after it)
    #[arg(long, value_name = "NAME", default_value = "astro-sentinel")]
    external_scaler_common_name: String,

    /// A label of the Secrets it creates, KEY=VALUE (repeat)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,

    /// Log format
    #[arg(
        long,
        env = "ASTRO_SENTINEL_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: logging::LogFormat,

    #[command(flatten)]
    kubernetes: KubernetesFlags,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// Runs the command; `args` are those after `ensure-secrets`.
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let flags: Flags = match logging::flags::parse_from(
        std::iter::once(OsString::from("ensure-secrets")).chain(args),
    ) {
        Ok(flags) => flags,
        Err(exit) => return exit,
    };
    if flags.keda_token_secret.is_none() && flags.external_scaler_ca_secret.is_none() {
        eprintln!(
            "astro-sentinel ensure-secrets: invalid configuration: --keda-token-secret or \
             --external-scaler-ca-secret: nothing to ensure"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let access = match flags.kubernetes.access(|name| std::env::var(name).ok()) {
        Ok(access) => access,
        Err(e) => {
            eprintln!("astro-sentinel ensure-secrets: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    logging::init(flags.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("astro-sentinel ensure-secrets: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = kube_client(&access)?;
        let labels = flags.labels.iter().cloned().collect();
        let store = SecretStore::new(client, &flags.namespace, labels);
        if let Some(name) = &flags.keda_token_secret {
            ensure_token(&store, name).await?;
        }
        if let Some(ca) = &flags.external_scaler_ca_secret {
            // clap's `requires_all` holds the other two names whenever the CA's is given.
            let names = CertificateSecrets {
                ca,
                server: flags
                    .external_scaler_server_secret
                    .as_deref()
                    .unwrap_or_default(),
                client: flags
                    .external_scaler_client_secret
                    .as_deref()
                    .unwrap_or_default(),
            };
            ensure_certificates(
                &store,
                names,
                &flags.external_scaler_common_name,
                &flags.external_scaler_dns_names,
            )
            .await?;
        }
        Ok::<_, String>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot ensure the Secrets");
            ExitCode::FAILURE
        }
    }
}

async fn ensure_token(store: &SecretStore, name: &str) -> Result<(), String> {
    let stored = store.read(name).await?;
    let current = stored.as_ref().and_then(|s| s.data.get(token::KEY));
    if token::usable(current.map(String::as_str)) {
        tracing::info!(secret = name, "KEDA's token is there; kept");
        let Some(stored) = stored else { return Ok(()) };
        return store.mark_kept(name, stored).await;
    }
    let mut data = stored.as_ref().map(|s| s.data.clone()).unwrap_or_default();
    data.insert(token::KEY.into(), token::new_token());
    store.write(name, stored, data).await?;
    tracing::info!(secret = name, "made KEDA's token");
    Ok(())
}

struct CertificateSecrets<'a> {
    ca: &'a str,
    server: &'a str,
    client: &'a str,
}

async fn ensure_certificates(
    store: &SecretStore,
    names: CertificateSecrets<'_>,
    common_name: &str,
    dns_names: &[String],
) -> Result<(), String> {
    let ca = store.read(names.ca).await?;
    let server = store.read(names.server).await?;
    let client = store.read(names.client).await?;
    let issued = certificates::ensure(
        certificates::Stored {
            ca: ca.as_ref().map(|s| &s.data),
            server: server.as_ref().map(|s| &s.data),
            client: client.as_ref().map(|s| &s.data),
        },
        common_name,
        dns_names,
        time::OffsetDateTime::now_utc(),
    )?;
    // The CA first: a run cut short after it leaves certificates it can still renew.
    for (name, stored, data, what) in [
        (names.ca, ca, issued.ca, "the external scaler's CA"),
        (
            names.server,
            server,
            issued.server,
            "the Sentinel's serving certificate",
        ),
        (
            names.client,
            client,
            issued.client,
            "KEDA's client certificate",
        ),
    ] {
        match (data, stored) {
            (Some(data), stored) => {
                store.write(name, stored, data as TextData).await?;
                tracing::info!(secret = name, "issued {what}");
            }
            (None, Some(stored)) => {
                store.mark_kept(name, stored).await?;
                tracing::info!(secret = name, "{what} is good; kept");
            }
            (None, None) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("ensure-secrets").chain(args.iter().copied()))
    }

    #[test]
    fn the_certificate_secrets_come_together() {
        let e = parse(&["--namespace", "ns", "--external-scaler-ca-secret", "ca"]).unwrap_err();
        assert!(
            e.to_string().contains("--external-scaler-server-secret"),
            "{e}"
        );
        let e = parse(&["--namespace", "ns", "--external-scaler-server-secret", "s"]).unwrap_err();
        assert!(e.to_string().contains("--external-scaler-ca-secret"), "{e}");
        parse(&[
            "--namespace",
            "ns",
            "--external-scaler-ca-secret",
            "ca",
            "--external-scaler-server-secret",
            "s",
            "--external-scaler-client-secret",
            "c",
            "--external-scaler-dns-name",
            "astro-sentinel",
        ])
        .unwrap();
    }

    #[test]
    fn labels_are_key_value() {
        let flags = parse(&["--namespace", "ns", "--label", "a=b=c"]).unwrap();
        assert_eq!(flags.labels, vec![("a".to_string(), "b=c".to_string())]);
        let e = parse(&["--namespace", "ns", "--label", "=x"]).unwrap_err();
        assert!(e.to_string().contains("is not KEY=VALUE"), "{e}");
    }
}
