//! The environment task processes (and the version probe) inherit: an allowlist.
//!
//! Tasks run as the agent's user, so anything in their environment is theirs. A denylist
//! misses whatever secret nobody thought of; an allowlist passes what Airflow's task SDK
//! needs and what the user names with `--task-env-allow`. A few names never pass, even when
//! listed: the agent's own settings and the Airflow server-side secrets a task never needs.

use std::ffi::{OsStr, OsString};

/// What every task gets when the agent has it: the process basics, Python's and Airflow's
/// configuration, TLS trust and proxies. `*` ends a prefix.
const ALWAYS_ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "PYTHON*",
    // AIRFLOW_HOME, AIRFLOW__SECTION__KEY configuration, AIRFLOW_CONN_* and AIRFLOW_VAR_*
    // (connections and variables meant for tasks), minus NEVER_PASSED below.
    "AIRFLOW_*",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    // In-cluster Kubernetes clients in tasks (e.g. KubernetesPodOperator) find the API here.
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
];

/// Never passed, whatever the allowlist says (prefixes, so that Airflow's `_CMD` and
/// `_SECRET` variants are covered too): the agent's configuration, which holds its
/// credentials, and server-side secrets of Airflow (the JWT secret signs every task's token).
const NEVER_PASSED: &[&str] = &[
    "ASTRO_AGENT_",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__WEBSERVER__SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CELERY__BROKER_URL",
];

/// One entry of the allowlist: a variable name, or a prefix written `NAME*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPattern(String);

impl EnvPattern {
    /// Parses `NAME` or `PREFIX*`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<EnvPattern, String> {
        let name = text.strip_suffix('*').unwrap_or(text);
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!(
                "{text:?} is not a variable name (letters, digits, _; a trailing * for a prefix)"
            ));
        }
        if let Some(never) = NEVER_PASSED.iter().find(|p| name.starts_with(*p)) {
            return Err(format!("{text:?}: {never}* never reaches tasks"));
        }
        Ok(EnvPattern(text.to_string()))
    }

    /// As written: `NAME` or `PREFIX*`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn matches(&self, key: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == self.0,
        }
    }
}

/// The variables of `parent` a task inherits, given the user's extra patterns.
pub fn inherited(
    parent: impl Iterator<Item = (OsString, OsString)>,
    allowed: &[EnvPattern],
) -> Vec<(OsString, OsString)> {
    let built_in: Vec<EnvPattern> = ALWAYS_ALLOWED
        .iter()
        .map(|p| EnvPattern(p.to_string()))
        .collect();
    parent
        .filter(|(key, _)| passes(key, &built_in, allowed))
        .collect()
}

fn passes(key: &OsStr, built_in: &[EnvPattern], allowed: &[EnvPattern]) -> bool {
    // Names that are not UTF-8 are nobody's configuration.
    let Some(key) = key.to_str() else {
        return false;
    };
    !NEVER_PASSED.iter().any(|p| key.starts_with(p))
        && built_in.iter().chain(allowed).any(|p| p.matches(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parent: &[(&str, &str)], allowed: &[&str]) -> Vec<String> {
        let allowed: Vec<EnvPattern> = allowed
            .iter()
            .map(|p| EnvPattern::parse(p).unwrap())
            .collect();
        inherited(parent.iter().map(|(k, v)| (k.into(), v.into())), &allowed)
            .into_iter()
            .map(|(k, _)| k.into_string().unwrap())
            .collect()
    }

    #[test]
    fn only_allowed_names_pass() {
        let parent = [
            ("PATH", "/bin"),
            ("HOME", "/home/airflow"),
            ("LC_ALL", "C.UTF-8"),
            ("PYTHONPATH", "/dags"),
            ("AIRFLOW__CORE__DAGS_FOLDER", "/dags"),
            ("AIRFLOW_CONN_WAREHOUSE", "postgres://w"),
            ("MY_TEAM_TOKEN", "t"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("RANDOM", "r"),
        ];
        assert_eq!(
            names(&parent, &[]),
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "PYTHONPATH",
                "AIRFLOW__CORE__DAGS_FOLDER",
                "AIRFLOW_CONN_WAREHOUSE"
            ]
        );
        assert_eq!(
            names(&parent, &["MY_TEAM_*", "RANDOM"]),
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "PYTHONPATH",
                "AIRFLOW__CORE__DAGS_FOLDER",
                "AIRFLOW_CONN_WAREHOUSE",
                "MY_TEAM_TOKEN",
                "RANDOM"
            ]
        );
    }

    #[test]
    fn secrets_never_pass_even_under_an_allowed_prefix() {
        let parent = [
            ("ASTRO_AGENT_JWT_SECRET", "s"),
            ("ASTRO_AGENT_REST_API_PASSWORD", "p"),
            ("AIRFLOW__API_AUTH__JWT_SECRET", "s"),
            ("AIRFLOW__API_AUTH__JWT_SECRET_CMD", "cat /s"),
            ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://x"),
            ("AIRFLOW__CORE__FERNET_KEY", "f"),
            ("AIRFLOW__API__SECRET_KEY", "k"),
        ];
        assert!(names(&parent, &["AIRFLOW__*", "AIRFLOW__API_*"]).is_empty());
    }

    #[test]
    fn listing_a_secret_or_a_bad_name_is_refused() {
        for bad in [
            "AIRFLOW__API_AUTH__JWT_SECRET",
            "ASTRO_AGENT_*",
            "",
            "*",
            "A-B",
            "A*B",
        ] {
            assert!(EnvPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(EnvPattern::parse("AWS_*").is_ok());
    }
}
