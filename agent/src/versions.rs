//! The Airflow and Edge provider versions the worker reports, and which of them it can serve.
//!
//! Airflow refuses to register a worker whose versions differ from its own (unless its
//! `[edge] minimum_acceptable_*_version_for_workers` settings relax that), so the agent reports
//! Airflow's own: the api-server tells its Airflow version (`GET /api/v2/version`), and the
//! Edge provider's is named in its refusal of any other (see [`crate::registration`]). Until
//! then the tasks' Python's packages are the first guess. A flag overrides each, and is never
//! replaced by what Airflow says.

use crate::config::ConfigError;
use crate::task_host_protocol::DetectedVersions;

/// The oldest Edge provider whose API this agent speaks: the first edge3 release (its API,
/// `/edge_worker/v1`, has not changed in a way the agent depends on since; the compatibility
/// matrix runs it with Airflow 3.3).
pub const OLDEST_EDGE_PROVIDER: &str = "1.0.0";
/// Airflow 3 hands workers workloads for its task SDK; Airflow 2 hands them command lines.
const OLDEST_AIRFLOW_MAJOR: u64 = 3;

/// What an Edge provider version is reported as when nothing names one yet: a valid version
/// (Airflow parses it when a minimum is configured) that matches no release, so Airflow's
/// refusal names its own.
const PLACEHOLDER_EDGE_PROVIDER: &str = "0.0.0";

/// Where a reported version comes from; only a flag's is never replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    /// Airflow said it (the version endpoint, or a refusal naming its own).
    Airflow,
    TasksPython,
    Placeholder,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub version: String,
    pub source: Source,
}

impl Reported {
    pub fn from_airflow(version: String) -> Self {
        Reported {
            version,
            source: Source::Airflow,
        }
    }

    /// Whether what Airflow says may replace it.
    pub fn replaceable(&self) -> bool {
        self.source != Source::Flag
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// None: to be learnt from Airflow before registering.
    pub airflow: Option<Reported>,
    pub edge_provider: Reported,
    /// Why detecting the tasks' Python's packages failed, for the error when nothing else
    /// names the Airflow version.
    pub detection_problem: Option<String>,
}

/// The versions to start from: the flags where given, else what the task host detected.
pub fn resolve(
    detected: &DetectedVersions,
    airflow: Option<String>,
    edge_provider: Option<String>,
) -> Versions {
    let pick = |flag: Option<String>, found: &Option<String>| match (flag, found) {
        (Some(version), _) => Some(Reported {
            version,
            source: Source::Flag,
        }),
        (None, Some(version)) => Some(Reported {
            version: version.clone(),
            source: Source::TasksPython,
        }),
        (None, None) => None,
    };
    Versions {
        airflow: pick(airflow, &detected.airflow),
        edge_provider: pick(edge_provider, &detected.edge_provider).unwrap_or(Reported {
            version: PLACEHOLDER_EDGE_PROVIDER.into(),
            source: Source::Placeholder,
        }),
        detection_problem: detected.problem.clone(),
    }
}

/// The error when no Airflow version is known: no flag, Airflow does not tell, and the tasks'
/// Python has none (`detection_problem`: why looking there failed).
pub fn airflow_unknown(detection_problem: Option<&str>) -> ConfigError {
    ConfigError {
        flag: "--airflow-version",
        problem: match detection_problem {
            Some(problem) => format!("not given, Airflow's api-server does not tell its version, and detecting it in the tasks' Python failed: {problem}"),
            None => "not given, Airflow's api-server does not tell its version, and the tasks' Python has no apache-airflow installed".into(),
        },
    }
}

/// Why the agent cannot serve an Airflow of `version`, if it cannot.
pub fn unservable_airflow(version: &str) -> Option<String> {
    let (major, ..) = release(version)?;
    (major < OLDEST_AIRFLOW_MAJOR).then(|| {
        format!("Airflow {version} answers there; this agent serves Airflow 3 and later only")
    })
}

/// Why the agent cannot serve an Edge provider of `version`, if it cannot.
pub fn unservable_edge_provider(version: &str) -> Option<String> {
    let oldest = release(OLDEST_EDGE_PROVIDER).expect("a valid version");
    (release(version)? < oldest).then(|| {
        format!(
            "Airflow runs Edge provider {version}, older than {OLDEST_EDGE_PROVIDER}, the oldest this agent speaks to"
        )
    })
}

/// What Airflow's refusal of a registration or heartbeat (HTTP 400) says.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The worker's Edge provider version differs from `core`, Airflow's own.
    EdgeProvider {
        core: String,
    },
    /// The worker's Airflow version differs from Airflow's, which edge3 3.4 and older name
    /// (`core`) and 3.8 and later do not.
    Airflow {
        core: Option<String>,
    },
    Other,
}

/// Reads the edge3 provider's refusal texts: "Edge Worker runs on Edge Provider 0.0.0 and the
/// core runs on 5.1.0. Rejecting access due to difference.", "Edge Worker runs on Airflow
/// 3.2.0 which is below the minimum acceptable version None. Rejecting access due to
/// incompatible version." and, from its first releases, "Edge Worker runs on Airflow 3.2.0 and
/// the core runs on 3.3.2. Rejecting access due to difference."
pub fn read_refusal(text: &str) -> Refusal {
    let core = text
        .split_once("and the core runs on ")
        .and_then(|(_, after)| {
            let version = after
                .split_whitespace()
                .next()?
                .trim_end_matches(['.', '"', ',']);
            release(version).map(|_| version.to_string())
        });
    if text.contains("Edge Worker runs on Edge Provider ") {
        if let Some(core) = core {
            return Refusal::EdgeProvider { core };
        }
    }
    if text.contains("Edge Worker runs on Airflow ") {
        return Refusal::Airflow { core };
    }
    Refusal::Other
}

/// `major.minor.micro` of a version as Python's `packaging` reads its release (missing parts
/// are 0; a suffix such as `rc1` or `.dev0` is ignored, as Airflow's own check ignores it).
fn release(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.trim().split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let micro = parts.next().flatten().unwrap_or(0);
    Some((major, minor, micro))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_what_was_detected_and_nothing_found_is_left_to_learn() {
        let detected = DetectedVersions {
            airflow: Some("3.3.2".into()),
            edge_provider: Some("5.1.0".into()),
            problem: None,
        };
        let v = resolve(&detected, None, Some("5.0.0".into()));
        let airflow = v.airflow.unwrap();
        assert_eq!(
            (airflow.version.as_str(), airflow.source),
            ("3.3.2", Source::TasksPython)
        );
        assert_eq!(
            (v.edge_provider.version.as_str(), v.edge_provider.source),
            ("5.0.0", Source::Flag)
        );
        assert!(!v.edge_provider.replaceable());

        let v = resolve(&DetectedVersions::default(), None, None);
        assert_eq!(v.airflow, None);
        assert_eq!(v.edge_provider.source, Source::Placeholder);
        let e = airflow_unknown(Some("No such file or directory"));
        assert_eq!(e.flag, "--airflow-version");
        assert!(e.problem.contains("No such file"), "{}", e.problem);
    }

    #[test]
    fn reads_airflows_refusals() {
        let edge = r#"register: HTTP 400: {"detail":"Edge Worker runs on Edge Provider 0.0.0 and the core runs on 5.1.0. Rejecting access due to difference."}"#;
        assert_eq!(
            read_refusal(edge),
            Refusal::EdgeProvider {
                core: "5.1.0".into()
            }
        );
        let airflow = r#"HTTP 400: {"detail":"Edge Worker runs on Airflow 3.2.0 which is below the minimum acceptable version None. Rejecting access due to incompatible version."}"#;
        assert_eq!(read_refusal(airflow), Refusal::Airflow { core: None });
        let airflow_1_0 = r#"HTTP 400: {"detail":"Edge Worker runs on Airflow 3.2.0 and the core runs on 3.3.2. Rejecting access due to difference."}"#;
        assert_eq!(
            read_refusal(airflow_1_0),
            Refusal::Airflow {
                core: Some("3.3.2".into())
            }
        );
        assert_eq!(read_refusal("HTTP 400: nonsense"), Refusal::Other);
    }

    #[test]
    fn airflow_2_and_edge_providers_before_the_oldest_are_not_served() {
        assert!(unservable_airflow("2.10.5").unwrap().contains("2.10.5"));
        assert_eq!(unservable_airflow("3.0.6"), None);
        assert_eq!(unservable_airflow("3.3.2"), None);
        assert!(unservable_edge_provider("0.9.0").is_some());
        assert_eq!(unservable_edge_provider("1.0.0"), None);
        assert_eq!(unservable_edge_provider("5.1.0rc1"), None);
        // An unreadable version is not refused here: Airflow's own check has the last word.
        assert_eq!(unservable_edge_provider("unknown"), None);
    }
}
