//! The Airflow and edge-provider versions the worker reports; Airflow refuses to register a
//! worker whose versions differ from its own, so by default they are read from the Python
//! environment that runs the tasks.

use crate::config::ConfigError;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

pub struct Versions {
    pub airflow: String,
    pub edge_provider: String,
}

const DETECT: &str = "import importlib.metadata as m\n\
print(m.version('apache-airflow'))\n\
print(m.version('apache-airflow-providers-edge3'))";

/// `env` is the environment tasks get: the probe runs the tasks' Python, whose start-up
/// (`.pth` files, `sitecustomize`) may run code of the image, so it sees no more than a task.
pub fn resolve(
    python: &Path,
    env: &[(OsString, OsString)],
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
    let output = probe(python, env)
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

/// The detection command, with nothing of the agent's environment but `env`.
fn probe(python: &Path, env: &[(OsString, OsString)]) -> Command {
    let mut command = Command::new(python);
    command
        .args(["-c", DETECT])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_versions_need_no_python() {
        let v = resolve(
            Path::new("/nonexistent"),
            &[],
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
    fn the_probe_sees_only_the_environment_it_is_given() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("env");
        let python = dir.path().join("python");
        std::fs::write(&python, format!("#!/bin/sh\nenv > {}\n", seen.display())).unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = [("LANG".into(), "C.UTF-8".into())];
        // Through the reaper: in this test binary it waits for every child (in the agent,
        // the probe runs before it starts).
        let (_child, exit) = crate::reaper::Reaper::global()
            .spawn(&mut probe(&python, &env))
            .unwrap();
        assert!(exit.blocking_recv().unwrap().success());
        let seen = std::fs::read_to_string(seen).unwrap();
        assert!(seen.contains("LANG=C.UTF-8"), "{seen}");
        // The test process's own variables (HOME, CARGO_*...) are not passed on.
        assert!(!seen.contains("CARGO") && !seen.contains("HOME="), "{seen}");
    }

    #[test]
    fn a_missing_python_names_the_flag() {
        let e = resolve(
            Path::new("/nonexistent/python"),
            &[],
            None,
            Some("5.1.0".into()),
        )
        .err()
        .unwrap();
        assert_eq!(e.flag, "--airflow-version");
        let e = resolve(
            Path::new("/nonexistent/python"),
            &[],
            Some("3".into()),
            None,
        )
        .err()
        .unwrap();
        assert_eq!(e.flag, "--edge-provider-version");
    }
}
