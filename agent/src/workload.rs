//! Which of Airflow's workloads this worker runs: the kinds whose end is the job's state.
//!
//! A job's `command` is passed to Airflow's `execute_workload` unchanged. A kind the agent does
//! not know (from a newer Airflow or Edge provider) would only make that fail in a task process
//! with a parse error in its output; refused before any process starts, its job is failed with
//! the reason in its log, and the worker goes on with the next job.

use serde_json::Value;

/// The workload kinds `execute_workload` runs and an Edge job reports the end of: a task, and a
/// callback (which edge3 5.x queues as a job of its own). `TestConnection` (Airflow 3.3) is not
/// among them: edge3 5.1.0's executor does not queue it, and its result is a connection test's,
/// not a job's state.
const RUNNABLE: [&str; 2] = ["ExecuteTask", "ExecuteCallback"];

/// Whether `command` is an executor callback (Airflow 3.3's `ExecuteCallback`, e.g. a
/// deadline alert's `SyncCallback`) rather than a task.
pub fn is_callback(command: &Value) -> bool {
    command.get("type").and_then(Value::as_str) == Some("ExecuteCallback")
}

/// Why this worker does not run the workload `command`; `None` when it does.
pub fn unsupported(command: &Value) -> Option<String> {
    match command.get("type").and_then(Value::as_str) {
        Some(kind) if RUNNABLE.contains(&kind) => None,
        Some(kind) => Some(format!(
            "the job's workload type {kind:?} is not one this worker runs ({}); a newer \
             astro-agent may run it",
            RUNNABLE.join(", ")
        )),
        None => Some(
            "the job's command is not an Airflow 3 workload (it has no \"type\"; Airflow 2's \
             command lines are not run by this worker)"
                .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tasks_and_callbacks_run_and_anything_else_is_refused_with_its_name() {
        assert_eq!(unsupported(&json!({"type": "ExecuteTask"})), None);
        assert_eq!(unsupported(&json!({"type": "ExecuteCallback"})), None);
        let reason = unsupported(&json!({"type": "SomethingNew"})).unwrap();
        assert!(reason.contains("\"SomethingNew\""), "{reason}");
        assert!(unsupported(&json!({"type": "TestConnection"})).is_some());
        let airflow_2 = json!(["airflow", "tasks", "run", "dag", "task", "run"]);
        assert!(unsupported(&airflow_2).unwrap().contains("no \"type\""));
        assert!(unsupported(&json!({"type": 3})).is_some());
    }

    #[test]
    fn only_an_execute_callback_workload_is_a_callback() {
        assert!(is_callback(&json!({"type": "ExecuteCallback"})));
        assert!(!is_callback(&json!({"type": "ExecuteTask"})));
        assert!(!is_callback(&json!(["airflow", "tasks", "run"])));
    }
}
