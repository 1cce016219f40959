//! The configuration file is operator input: whatever it holds, `Config::parse` answers with a
//! configuration or a one-line error, and never panics. Inputs are arbitrary text, YAML trees
//! built from the file's own keys (so that validation, not only the YAML parser, is reached),
//! and a valid file with bytes changed. `PROPTEST_CASES` sets how many of each (the test
//! command's fuzz step raises it).

use astro_sentinel::config::file::Config;
use astro_sentinel::config::ConfigError;
use proptest::prelude::*;
use serde_yaml::{Mapping, Value};

/// Every key the file knows, at any depth: trees built from them pass the unknown-key checks
/// often enough to reach the validation of values.
const KEYS: &[&str] = &[
    "refreshInterval",
    "stalenessLimit",
    "source",
    "type",
    "airflowApi",
    "url",
    "postgres",
    "sslMode",
    "caFile",
    "auth",
    "disabled",
    "staticTokensFile",
    "tokenReview",
    "allowedUsernames",
    "audiences",
    "cacheTtl",
    "workers",
    "name",
    "queues",
    "syncSlots",
    "minReplicas",
    "maxReplicas",
    "kubernetes",
    "namespace",
    "idleFirstScaleIn",
    "workerLabels",
    "history",
    "path",
];

/// Values the fields accept, and near misses.
const WORDS: &[&str] = &[
    "airflow-api",
    "postgres",
    "http://127.0.0.1:8080",
    "ftp://x",
    "2s",
    "0s",
    "500ms",
    "1h30m",
    "18446744073709551616s",
    "99999999999999999999h",
    "verify-full",
    "w",
    "a,b",
    "-w-",
    "",
    " ",
    "/var/lib/x.bin",
    "/",
    "ns",
    "Ünïcode",
];

const VALID: &str = "refreshInterval: 2s
stalenessLimit: 30s
source:
  type: airflow-api
  airflowApi: {url: \"http://127.0.0.1:8080\"}
auth:
  staticTokensFile: /tokens
  tokenReview: {allowedUsernames: [\"system:serviceaccount:keda:k\"], cacheTtl: 60s}
kubernetes: {namespace: astro, idleFirstScaleIn: true}
history: {path: /var/lib/astro-sentinel/history.bin}
workers:
  - {name: default, queues: [default, b], syncSlots: 4, minReplicas: 0, maxReplicas: 5}
  - name: batch
    queues: \"x,y\"
";

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|f| Value::Number(f.into())),
        proptest::sample::select(WORDS).prop_map(|s| Value::String(s.into())),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => proptest::sample::select(KEYS).prop_map(|k| Value::String(k.into())),
        1 => scalar(),
    ]
}

/// A YAML document shaped like the file, with every value possibly of the wrong type.
fn tree() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            proptest::collection::vec((key(), inner), 0..6)
                .prop_map(|pairs| Value::Mapping(pairs.into_iter().collect::<Mapping>())),
        ]
    })
}

/// A mapping holding each of `fields` or not.
fn some_of(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let entries: Vec<_> = fields
        .into_iter()
        .map(|(k, v)| proptest::option::weighted(0.7, v).prop_map(move |v| (k, v)))
        .collect();
    entries
        .prop_map(|pairs| {
            let map: Mapping = pairs
                .into_iter()
                .filter_map(|(k, v)| Some((Value::String(k.into()), v?)))
                .collect();
            Value::Mapping(map)
        })
        .boxed()
}

/// One of `choices` most of the time, any value now and then.
fn pick(choices: &'static [&'static str]) -> BoxedStrategy<Value> {
    prop_oneof![
        8 => proptest::sample::select(choices).prop_map(|s| Value::String(s.into())),
        1 => scalar(),
    ]
    .boxed()
}

fn word() -> BoxedStrategy<Value> {
    pick(WORDS)
}

fn duration() -> BoxedStrategy<Value> {
    pick(&[
        "2s",
        "500ms",
        "30s",
        "1m",
        "1h30m",
        "11m",
        "0s",
        "18446744073709551616s",
    ])
}

fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => (-2i64..40).prop_map(|n| Value::Number(n.into())),
        1 => scalar(),
    ]
    .boxed()
}

fn list_of(item: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![
        6 => proptest::collection::vec(item, 0..4).prop_map(Value::Sequence),
        1 => scalar(),
    ]
    .boxed()
}

/// A document with the file's structure whose leaves vary: what reaches every validation rule.
fn file_shaped() -> impl Strategy<Value = Value> {
    let worker = some_of(vec![
        ("name", pick(&["w", "w.x", "batch", "-w-", "W", ""])),
        ("queues", prop_oneof![list_of(word()), word()].boxed()),
        ("syncSlots", number()),
        ("minReplicas", number()),
        ("maxReplicas", number()),
    ]);
    some_of(vec![
        ("refreshInterval", duration()),
        ("stalenessLimit", duration()),
        (
            "source",
            some_of(vec![
                ("type", pick(&["airflow-api", "postgres"])),
                (
                    "airflowApi",
                    some_of(vec![(
                        "url",
                        pick(&["http://127.0.0.1:8080", "https://h/p", "ftp://x", "::"]),
                    )]),
                ),
                (
                    "postgres",
                    some_of(vec![
                        ("sslMode", pick(&["disable", "verify-full", "verify_ca"])),
                        ("caFile", word()),
                    ]),
                ),
            ]),
        ),
        (
            "auth",
            some_of(vec![
                ("disabled", any::<bool>().prop_map(Value::Bool).boxed()),
                ("staticTokensFile", word()),
                (
                    "tokenReview",
                    some_of(vec![
                        ("allowedUsernames", list_of(word())),
                        ("audiences", list_of(word())),
                        ("cacheTtl", duration()),
                    ]),
                ),
            ]),
        ),
        ("workers", list_of(worker)),
        (
            "kubernetes",
            some_of(vec![
                ("namespace", pick(&["ns", "astro", "-ns", "a.b", ""])),
                (
                    "idleFirstScaleIn",
                    any::<bool>().prop_map(Value::Bool).boxed(),
                ),
                (
                    "workerLabels",
                    some_of(vec![
                        ("component", pick(&["worker", "", "two words", "-x"])),
                        ("example.com/tier", word()),
                    ]),
                ),
            ]),
        ),
        ("history", some_of(vec![("path", word())])),
    ])
}

/// The property: a result, and an error is one non-empty line.
fn parses_or_explains(text: &str) -> Result<(), TestCaseError> {
    match Config::parse(text) {
        Ok(config) => {
            prop_assert!(config.staleness_limit >= config.refresh_interval);
            for w in &config.workers {
                prop_assert!(w.sync_slots >= 1 && w.min_replicas <= w.max_replicas);
                prop_assert!(!w.queues.is_empty());
            }
        }
        Err(ConfigError(message)) => {
            prop_assert!(!message.trim().is_empty());
            prop_assert!(!message.contains('\n'), "not one line: {message:?}");
        }
    }
    Ok(())
}

proptest! {
    // Failures become named tests, not files beside the sources.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_arbitrary_text_never_panics(text in any::<String>()) {
        parses_or_explains(&text)?;
    }

    #[test]
    fn fuzz_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        parses_or_explains(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn fuzz_yaml_trees_of_the_files_keys_never_panic(doc in tree()) {
        let text = serde_yaml::to_string(&doc).expect("a Value always serialises");
        parses_or_explains(&text)?;
    }

    #[test]
    fn fuzz_documents_shaped_like_the_file_never_panic(doc in file_shaped()) {
        let text = serde_yaml::to_string(&doc).expect("a Value always serialises");
        parses_or_explains(&text)?;
    }

    #[test]
    fn fuzz_a_valid_file_with_bytes_changed_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut bytes = VALID.as_bytes().to_vec();
        for (at, byte) in edits {
            bytes[at.index(VALID.len())] = byte;
        }
        parses_or_explains(&String::from_utf8_lossy(&bytes))?;
    }
}

#[test]
fn the_valid_file_of_the_mutations_is_valid() {
    // Otherwise the mutations start from an error and explore little.
    let config = Config::parse(VALID).unwrap();
    assert_eq!(config.workers.len(), 2);
}
