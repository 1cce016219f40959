//! Which Airflow and Edge provider the tasks' Python has installed, for the agent to report.

use super::reaper::Reaper;
use crate::task_host_protocol::DetectedVersions;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

/// One line per package: its version, or nothing when it is not installed.
const DETECT: &str = r#"
import importlib.metadata as m
for name in ("apache-airflow", "apache-airflow-providers-edge3"):
    try:
        print(m.version(name))
    except m.PackageNotFoundError:
        print()
"#;

/// Runs the probe with `python` and the tasks' environment `env`: its start-up (`.pth` files,
/// `sitecustomize`) may run code of the image, so it sees no more than a task.
pub async fn detect(python: &Path, env: &[(OsString, OsString)]) -> DetectedVersions {
    let failed = |problem: String| DetectedVersions {
        problem: Some(problem),
        ..DetectedVersions::default()
    };
    let spawned = Reaper::global().spawn(
        Command::new(python)
            .args(["-c", DETECT])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let (mut child, exit) = match spawned {
        Ok(spawned) => spawned,
        Err(e) => return failed(format!("{}: {e}", python.display())),
    };
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let output = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut err);
        }
        (out, err)
    })
    .await;
    let (stdout, stderr) = output.unwrap_or_default();
    match exit.await {
        Ok(status) if status.success() => {
            let mut lines = stdout.lines().map(str::trim);
            let mut next = || lines.next().filter(|l| !l.is_empty()).map(str::to_string);
            DetectedVersions {
                airflow: next(),
                edge_provider: next(),
                problem: None,
            }
        }
        Ok(status) => {
            let last = stderr.lines().last().unwrap_or("").trim();
            failed(format!("{} ended with {status}: {last}", python.display()))
        }
        Err(_) => failed("the reaper stopped".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fake_python(dir: &Path, script: &str) -> std::path::PathBuf {
        let python = dir.join("python");
        std::fs::write(&python, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        python
    }

    #[tokio::test]
    async fn reads_both_versions_and_tells_a_missing_package() {
        let dir = tempfile::tempdir().unwrap();
        let both = fake_python(dir.path(), "printf '3.3.2\\n5.1.0\\n'");
        let v = detect(&both, &[]).await;
        assert_eq!(v.airflow.as_deref(), Some("3.3.2"));
        assert_eq!(v.edge_provider.as_deref(), Some("5.1.0"));
        let other = tempfile::tempdir().unwrap();
        let no_edge = fake_python(other.path(), "printf '3.3.2\\n\\n'");
        let v = detect(&no_edge, &[]).await;
        assert_eq!(
            (v.airflow.as_deref(), v.edge_provider, v.problem),
            (Some("3.3.2"), None, None)
        );
    }

    #[tokio::test]
    async fn the_probe_sees_only_the_environment_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("env");
        let python = fake_python(dir.path(), &format!("env > {}", seen.display()));
        detect(&python, &[("LANG".into(), "C.UTF-8".into())]).await;
        let seen = std::fs::read_to_string(seen).unwrap();
        assert!(seen.contains("LANG=C.UTF-8"), "{seen}");
        // The test process's own variables (HOME, CARGO_*...) are not passed on.
        assert!(!seen.contains("CARGO") && !seen.contains("HOME="), "{seen}");
    }

    #[tokio::test]
    async fn a_real_python_without_airflow_runs_the_probe_and_finds_neither() {
        let path = [("PATH".into(), std::env::var_os("PATH").unwrap())];
        let v = detect(Path::new("python3"), &path).await;
        assert_eq!(v.problem, None, "the probe itself runs");
        assert_eq!((v.airflow, v.edge_provider), (None, None));
    }

    #[tokio::test]
    async fn a_missing_python_is_a_problem_not_a_version() {
        let v = detect(Path::new("/nonexistent/python3"), &[]).await;
        assert!(v.airflow.is_none());
        assert!(v.problem.unwrap().contains("/nonexistent/python3"));
    }
}
