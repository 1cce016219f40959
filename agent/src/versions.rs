//! The Airflow and edge-provider versions the worker reports; Airflow refuses to register a
//! worker whose versions differ from its own, so by default they are read from the Python
//! environment that runs the tasks.

use crate::config::ConfigError;
use std::path::Path;
use std::process::Command;

pub struct Versions {
    pub airflow: String,
    pub edge_provider: String,
}

const DETECT: &str = "import importlib.metadata as m\n\
print(m.version('apache-airflow'))\n\
print(m.version('apache-airflow-providers-edge3'))";

pub fn resolve(
    python: &Path,
    airflow: Option<String>,
    edge_provider: Option<String>,
) -> Result<Versions, ConfigError> {
    if let (Some(airflow), Some(edge_provider)) = (&airflow, &edge_provider) {
        return Ok(Versions {
            airflow: airflow.clone(),
            edge_provider: edge_provider.clone(),
        });
    }
    let flag = if airflow.is_none() {
        "--airflow-version"
    } else {
        "--edge-provider-version"
    };
    let fail = |why: String| ConfigError {
        flag,
        problem: format!(
            "not given, and detecting it with {} failed: {why}",
            python.display()
        ),
    };
    let output = Command::new(python)
        .args(["-c", DETECT])
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("").trim().to_string();
        return Err(fail(last));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines().map(str::trim);
    let detected_airflow = lines.next().unwrap_or_default().to_string();
    let detected_edge = lines.next().unwrap_or_default().to_string();
    if detected_airflow.is_empty() || detected_edge.is_empty() {
        return Err(fail(format!("unexpected output {stdout:?}")));
    }
    Ok(Versions {
        airflow: airflow.unwrap_or(detected_airflow),
        edge_provider: edge_provider.unwrap_or(detected_edge),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_versions_need_no_python() {
        let v = resolve(
            Path::new("/nonexistent"),
            Some("3.3.2".into()),
            Some("5.1.0".into()),
        )
        .unwrap();
        assert_eq!(
            (v.airflow.as_str(), v.edge_provider.as_str()),
            ("3.3.2", "5.1.0")
        );
    }

    #[test]
    fn a_missing_python_names_the_flag() {
        let e = resolve(Path::new("/nonexistent/python"), None, Some("5.1.0".into()))
            .err()
            .unwrap();
        assert_eq!(e.flag, "--airflow-version");
        let e = resolve(Path::new("/nonexistent/python"), Some("3".into()), None)
            .err()
            .unwrap();
        assert_eq!(e.flag, "--edge-provider-version");
    }
}
