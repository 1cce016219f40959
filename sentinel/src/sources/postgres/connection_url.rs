//! `ASTRO_SENTINEL_POSTGRES_URL` (a `postgres://` URL or libpq `key=value` words) into a
//! tokio-postgres configuration, with the TLS settings left to the YAML file.
//!
//! The file's `sslMode`/`caFile` are the one place TLS is configured. A URL that says
//! `sslmode=` too is accepted only when it agrees, so that a copied libpq URL with
//! `sslmode=disable` can never silently weaken (or be silently overridden by) the file.
//! `sslrootcert` is refused outright: its file would not be read.

use crate::config::file::SslMode;
use crate::config::ConfigError;
use std::str::FromStr;

const FLAG: &str = "ASTRO_SENTINEL_POSTGRES_URL";

/// Parses `url`; `ssl_mode` is the file's (explicit or default) `source.postgres.sslMode`.
pub fn parse(url: &str, ssl_mode: SslMode) -> Result<tokio_postgres::Config, ConfigError> {
    let (rest, given) = take_option(url, "sslmode");
    if let Some(given) = given {
        if given != ssl_mode.as_str() {
            return Err(ConfigError::new(format!(
                "{FLAG}: sslmode={given} conflicts with source.postgres.sslMode {ssl_mode}: \
                 set the mode in the configuration file only"
            )));
        }
    }
    if take_option(&rest, "sslrootcert").1.is_some() {
        return Err(ConfigError::new(format!(
            "{FLAG}: sslrootcert is not read from the URL: set source.postgres.caFile"
        )));
    }
    // The parser's messages quote option names, never the password.
    let config = tokio_postgres::Config::from_str(&rest)
        .map_err(|e| ConfigError::new(format!("{FLAG}: invalid: {e}")))?;
    if config.get_hosts().is_empty() {
        return Err(ConfigError::new(format!(
            "{FLAG}: no host (postgres://user:password@host:port/db)"
        )));
    }
    Ok(config)
}

/// `url` without the option `key`, and the option's value when it was there. Handles the
/// two forms libpq accepts: URL query parameters and `key = value` words.
fn take_option(url: &str, key: &str) -> (String, Option<String>) {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if is_url {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), None);
        };
        let mut value = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| match pair.split_once('=') {
                Some((k, v)) if k == key => {
                    value = Some(v.to_string());
                    false
                }
                _ => true,
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, value);
    }
    // key-value form: `key = value` may have spaces around `=`; join them first.
    let mut words: Vec<String> = Vec::new();
    for word in url.split_whitespace() {
        match words.last_mut() {
            Some(last) if last.ends_with('=') || word.starts_with('=') => last.push_str(word),
            _ => words.push(word.to_string()),
        }
    }
    let mut value = None;
    words.retain(|word| match word.split_once('=') {
        Some((k, v)) if k == key => {
            value = Some(v.trim_matches('\'').to_string());
            false
        }
        _ => true,
    });
    (words.join(" "), value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matching_sslmode_is_accepted_and_left_to_the_file() {
        let c = parse(
            "postgres://u:p@db:5432/airflow?sslmode=verify-full&application_name=x",
            SslMode::VerifyFull,
        )
        .unwrap();
        assert_eq!(c.get_application_name(), Some("x"));
        let c = parse("host=db user=u sslmode = verify-ca", SslMode::VerifyCa).unwrap();
        assert_eq!(c.get_user(), Some("u"));
    }

    #[test]
    fn a_conflicting_sslmode_is_refused_naming_both_places() {
        for url in [
            "postgres://u:p@db/airflow?sslmode=disable",
            "postgresql://u:p@db/airflow?connect_timeout=3&sslmode=disable",
            "host=db user=u sslmode=disable",
            "host=db sslmode= disable user=u",
        ] {
            let e = parse(url, SslMode::VerifyFull).unwrap_err().0;
            assert!(
                e.starts_with("ASTRO_SENTINEL_POSTGRES_URL: sslmode=disable conflicts")
                    && e.contains("source.postgres.sslMode verify-full"),
                "{url}: {e}"
            );
            assert!(!e.contains(":p@"), "{e}");
        }
    }

    #[test]
    fn sslrootcert_and_a_missing_host_are_refused() {
        let e = parse(
            "postgres://u:p@db/a?sslrootcert=/ca.pem",
            SslMode::VerifyFull,
        )
        .unwrap_err()
        .0;
        assert!(e.contains("source.postgres.caFile"), "{e}");
        let e = parse("user=u dbname=a", SslMode::Disable).unwrap_err().0;
        assert!(e.contains("no host"), "{e}");
    }
}
