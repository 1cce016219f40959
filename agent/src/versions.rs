//! The Airflow and edge-provider versions the worker reports. Airflow refuses to register a
//! worker whose versions differ from its own, so by default they are what the task host's
//! Python has installed; a flag overrides each. The tasks' image needs no Edge provider: when
//! it has none and no flag names it, the version is learnt from Airflow's answer to the
//! registration (see [`crate::registration`]).

use crate::config::ConfigError;
use crate::task_host_protocol::DetectedVersions;

pub struct Versions {
    pub airflow: String,
    /// None: to be learnt from Airflow.
    pub edge_provider: Option<String>,
}

/// The versions to report: the flags where given, else what the task host detected.
pub fn resolve(
    detected: &DetectedVersions,
    airflow: Option<String>,
    edge_provider: Option<String>,
) -> Result<Versions, ConfigError> {
    let missing = |flag: &'static str, package: &str| ConfigError {
        flag,
        problem: match &detected.problem {
            Some(problem) => {
                format!("not given, and detecting it in the tasks' Python failed: {problem}")
            }
            None => format!("not given, and the tasks' Python has no {package} installed"),
        },
    };
    let airflow = airflow
        .or_else(|| detected.airflow.clone())
        .ok_or_else(|| missing("--airflow-version", "apache-airflow"))?;
    let edge_provider = edge_provider.or_else(|| detected.edge_provider.clone());
    Ok(Versions {
        airflow,
        edge_provider,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_what_was_detected() {
        let detected = DetectedVersions {
            airflow: Some("3.3.2".into()),
            edge_provider: Some("5.1.0".into()),
            problem: None,
        };
        let v = resolve(&detected, None, Some("5.0.0".into())).unwrap();
        assert_eq!(
            (
                v.airflow.as_str(),
                v.edge_provider.as_deref().unwrap_or_default()
            ),
            ("3.3.2", "5.0.0")
        );
    }

    #[test]
    fn a_missing_airflow_names_its_flag_and_an_edge_provider_is_left_to_learn() {
        let no_edge = DetectedVersions {
            airflow: Some("3.3.2".into()),
            edge_provider: None,
            problem: None,
        };
        assert_eq!(resolve(&no_edge, None, None).unwrap().edge_provider, None);
        let e = resolve(&DetectedVersions::default(), None, None)
            .err()
            .unwrap();
        assert_eq!(e.flag, "--airflow-version");
        assert!(e.problem.contains("apache-airflow"), "{}", e.problem);
        let failed = DetectedVersions {
            problem: Some("No such file or directory".into()),
            ..DetectedVersions::default()
        };
        let e = resolve(&failed, None, None).err().unwrap();
        assert_eq!(e.flag, "--airflow-version");
        assert!(e.problem.contains("No such file"), "{}", e.problem);
    }
}
