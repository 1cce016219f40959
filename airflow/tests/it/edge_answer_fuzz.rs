//! The Edge API's answers come from another process over the network: whatever arrives,
//! decoding gives the typed answer or an [`ApiError`] (never a panic), and the error's text
//! stays short enough for one log line, however large the body. Inputs are arbitrary bytes,
//! JSON built from the answers' own keys, and a valid job with one field replaced.
//! `PROPTEST_CASES` sets how many of each (the test command's fuzz step raises it).

use airflow::edge_client::decode_answer;
use airflow::edge_types::{EdgeJob, HeartbeatAnswer, RegisterAnswer};
use airflow::ApiError;
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use std::path::Component;

/// An error is logged as one line: a body of any size must not make it long.
const MAX_ERROR_LEN: usize = 1024;

/// The keys of the fetch, register and heartbeat answers and of a job's command.
const KEYS: &[&str] = &[
    "dag_id",
    "task_id",
    "run_id",
    "map_index",
    "try_number",
    "command",
    "concurrency_slots",
    "task_instance_id",
    "log_path",
    "type",
    "token",
    "versions_match",
    "state",
    "queues",
    "maintenance_comments",
    "concurrency",
];

const WORDS: &[&str] = &[
    "running",
    "idle",
    "shutdown request",
    "maintenance mode",
    "ExecuteTask",
    "dag_id=d/run_id=r/task_id=t/attempt=1.log",
    "../../etc/passwd",
    "/etc/passwd",
    "",
    "0195f2a8-4f4e-7c1b-9a1e-1234567890ab",
    "ü",
];

fn status() -> impl Strategy<Value = StatusCode> {
    prop_oneof![
        4 => Just(StatusCode::OK),
        1 => Just(StatusCode::NO_CONTENT),
        2 => (100u16..600).prop_map(|s| StatusCode::from_u16(s).expect("100..600 is a status")),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        proptest::sample::select(WORDS).prop_map(Value::from),
        ".{0,16}".prop_map(Value::from),
        // Long texts: what a body of any size does to the error message.
        (0usize..20_000).prop_map(|n| Value::from("x".repeat(n))),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::sample::select(KEYS).prop_map(String::from),
        1 => ".{0,8}",
    ]
}

fn tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..9)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn valid_job() -> Value {
    json!({
        "dag_id": "d", "task_id": "t", "run_id": "manual__2025-01-01T00:00:00+00:00",
        "map_index": -1, "try_number": 1, "concurrency_slots": 1,
        "command": {"type": "ExecuteTask", "token": "tok", "log_path": "dag_id=d/attempt=1.log"},
        "task_instance_id": "0195f2a8-4f4e-7c1b-9a1e-1234567890ab"
    })
}

fn short<T>(result: Result<T, ApiError>) -> Result<Option<T>, TestCaseError> {
    match result {
        Ok(answer) => Ok(Some(answer)),
        Err(e) => {
            let text = e.to_string();
            prop_assert!(
                text.len() <= MAX_ERROR_LEN,
                "a {}-byte error: {}…",
                text.len(),
                text.chars().take(200).collect::<String>()
            );
            Ok(None)
        }
    }
}

/// Decodes `body` as every answer the client reads, and uses a job as the agent does.
fn decodes_or_explains(status: StatusCode, body: &str) -> Result<(), TestCaseError> {
    if let Some(Some(job)) = short(decode_answer::<Option<EdgeJob>>("fetch", status, body))? {
        let _ = job.key().to_string();
        if let Some(path) = job.log_path() {
            // The worker reads this file and sends it to Airflow: never one outside the folder.
            prop_assert!(path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)));
        }
    }
    short(decode_answer::<RegisterAnswer>("register", status, body))?;
    short(decode_answer::<HeartbeatAnswer>("heartbeat", status, body))?;
    short(decode_answer::<Value>("job_state", status, body))?;
    Ok(())
}

proptest! {
    // Failures become named tests below, not files beside the sources.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_arbitrary_bodies_never_panic(
        status in status(),
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        decodes_or_explains(status, &String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn fuzz_json_of_the_answers_keys_never_panics(status in status(), body in tree()) {
        decodes_or_explains(status, &body.to_string())?;
    }

    #[test]
    fn fuzz_a_job_with_one_field_replaced_never_panics(
        field in proptest::sample::select(KEYS),
        value in proptest::option::of(tree()),
    ) {
        let mut job = valid_job();
        let fields = job.as_object_mut().expect("an object");
        match value {
            Some(value) => fields.insert(field.to_string(), value),
            None => fields.remove(field),
        };
        decodes_or_explains(StatusCode::OK, &job.to_string())?;
    }

    #[test]
    fn fuzz_a_job_with_bytes_changed_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)
    ) {
        let mut bytes = valid_job().to_string().into_bytes();
        let len = bytes.len();
        for (at, byte) in edits {
            bytes[at.index(len)] = byte;
        }
        decodes_or_explains(StatusCode::OK, &String::from_utf8_lossy(&bytes))?;
    }
}

#[test]
fn the_valid_job_of_the_mutations_decodes() {
    let job: Option<EdgeJob> =
        decode_answer("fetch", StatusCode::OK, &valid_job().to_string()).unwrap();
    assert_eq!(job.unwrap().concurrency_slots, 1);
    let none: Option<EdgeJob> = decode_answer("fetch", StatusCode::NO_CONTENT, "").unwrap();
    assert!(none.is_none());
}

/// Found by `fuzz_json_of_the_answers_keys_never_panics`: the parser's message quotes the
/// string it could not use in full, so a server answering one huge string made a log line of
/// that size (the body itself was already cut).
#[test]
fn a_huge_string_answer_gives_a_short_error() {
    let body = Value::from("x".repeat(1_000_000)).to_string();
    for error in [
        decode_answer::<HeartbeatAnswer>("heartbeat", StatusCode::OK, &body).unwrap_err(),
        decode_answer::<Option<EdgeJob>>("fetch", StatusCode::OK, &body).unwrap_err(),
    ] {
        let text = error.to_string();
        assert!(matches!(error, ApiError::Malformed { .. }), "{text:.200}");
        assert!(text.len() <= MAX_ERROR_LEN, "a {}-byte error", text.len());
    }
}
