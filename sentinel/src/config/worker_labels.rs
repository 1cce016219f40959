//! `kubernetes.workerLabels`: the labels every worker Deployment, Pod and ScaledObject carries.
//! The watches ask the API server for these objects only, so Pods that share the namespace
//! (Airflow's own, KubernetesPodOperator's) never reach the Sentinel's memory. Checked with the
//! API server's own rules for label keys and values, so a typo fails at load, not as a watch
//! that is refused at run time.

use super::ConfigError;
use std::collections::BTreeMap;

/// Checks each `key: value` pair; an empty map selects every object (no selector).
pub fn validate_worker_labels(
    labels: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    for (key, value) in &labels {
        if !is_label_key(key) {
            return Err(ConfigError::new(format!(
                "kubernetes.workerLabels: {key:?} is not a label key (an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)"
            )));
        }
        if !is_label_value(value) {
            return Err(ConfigError::new(format!(
                "kubernetes.workerLabels.{key}: {value:?} is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)"
            )));
        }
    }
    Ok(labels)
}

/// `[prefix/]name`: the prefix a DNS-1123 subdomain, the name a label value that is not empty.
fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
}

fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_charts_labels_pass() {
        let chart = labels(&[
            ("component", "worker"),
            ("app.kubernetes.io/instance", "airflow-workers"),
        ]);
        assert_eq!(validate_worker_labels(chart.clone()), Ok(chart));
        assert_eq!(
            validate_worker_labels(labels(&[("tier", "")]))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_bad_key_or_value_names_the_field() {
        let key = validate_worker_labels(labels(&[("Bad Key", "x")]))
            .unwrap_err()
            .0;
        assert!(
            key.starts_with("kubernetes.workerLabels: \"Bad Key\" is not a label key"),
            "{key}"
        );
        for bad in ["-x", "x/", "UPPER.example/x", "a/b/c"] {
            assert!(
                validate_worker_labels(labels(&[(bad, "x")])).is_err(),
                "{bad}"
            );
        }
        let value = validate_worker_labels(labels(&[("component", "worker!")]))
            .unwrap_err()
            .0;
        assert!(
            value
                .starts_with("kubernetes.workerLabels.component: \"worker!\" is not a label value"),
            "{value}"
        );
        let long = "a".repeat(64);
        assert!(validate_worker_labels(labels(&[("component", &long)])).is_err());
    }
}
