//! The messages between the task host and its pre-forked Python launcher
//! (`agent/python/astro_launcher.py`), on the launcher's stdin and stdout, framed as
//! [`crate::frames`] says. Each request comes after one byte that carries the task's link to
//! the task host ([`super::task_output`]) as `SCM_RIGHTS`; a fresh interpreter has that link as
//! its stdout and stderr already, and gets its request alone.

use serde::{Deserialize, Serialize};

/// Task host → launcher: start the task of `workload` (Airflow's workload, as JSON).
#[derive(Debug, Serialize)]
pub struct LaunchRequest<'a> {
    pub id: &'a str,
    /// The task host's pid: the task waits until it is its parent, then dies with it.
    pub host: u32,
    /// In the request, not in a file: a file would be readable by every other task (they run
    /// as the same user), and the request only passes through processes that are not dumpable.
    pub workload: &'a serde_json::Value,
}

/// Launcher → task host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LauncherMessage {
    /// Once, when the launcher has imported Airflow and takes requests.
    Ready,
    /// A spare process exists: the task host reaps it when it exits unused.
    Spare { pid: i32 },
    /// The task of request `id` runs as `pid`.
    Started { id: String, pid: i32 },
    /// The launcher could not start the task of request `id`.
    Failed { id: Option<String>, error: String },
}

/// Arbitrary frames: every read ends in a message or an error, never a panic or a wait for a
/// body the length only claims. `PROPTEST_CASES` sets how many (the test command's fuzz step
/// raises it).
#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::frames::{reader as replies, receive, send, writer as requests, MAX_MESSAGE};
    use proptest::prelude::*;
    use std::io::{Error, ErrorKind};

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    /// Every message read from `bytes` until the first error (or the end).
    fn read_all(bytes: &[u8]) -> (Vec<LauncherMessage>, Error) {
        block_on(async {
            let mut input = replies(bytes);
            let mut messages = Vec::new();
            loop {
                match receive::<LauncherMessage, _>(&mut input).await {
                    Ok(message) => messages.push(message),
                    Err(e) => return (messages, e),
                }
            }
        })
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    /// What the launcher says, with arbitrary ids, pids and error texts.
    fn message() -> impl Strategy<Value = LauncherMessage> {
        prop_oneof![
            Just(LauncherMessage::Ready),
            any::<i32>().prop_map(|pid| LauncherMessage::Spare { pid }),
            (".{0,24}", any::<i32>()).prop_map(|(id, pid)| LauncherMessage::Started { id, pid }),
            (proptest::option::of(".{0,24}"), ".{0,64}")
                .prop_map(|(id, error)| LauncherMessage::Failed { id, error }),
        ]
    }

    /// Frame bodies: arbitrary bytes, or JSON objects with a `type` that may or may not be one
    /// of the protocol's, so that decoding is exercised beyond its first byte.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            (
                prop_oneof![
                    Just("ready"),
                    Just("spare"),
                    Just("started"),
                    Just("failed"),
                    Just("other")
                ],
                proptest::option::of(any::<i64>()),
                proptest::option::of(".{0,8}"),
            )
                .prop_map(|(kind, pid, id)| {
                    let mut m = serde_json::json!({ "type": kind });
                    if let Some(pid) = pid {
                        m["pid"] = pid.into();
                    }
                    if let Some(id) = id {
                        m["id"] = id.clone().into();
                        m["error"] = id.into();
                    }
                    serde_json::to_vec(&m).unwrap()
                }),
        ]
    }

    proptest! {
        // Failures become named tests, not files beside the sources.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_arbitrary_bytes_end_in_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            // A pipe that ends always ends the reading with an error (EOF at the latest).
            let (_, error) = read_all(&bytes);
            prop_assert!(!error.to_string().is_empty());
        }

        #[test]
        fn fuzz_arbitrary_bodies_in_frames_are_read_or_refused(
            bodies in proptest::collection::vec(body(), 1..4)
        ) {
            let stream: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
            let (messages, error) = read_all(&stream);
            let parsed: Vec<LauncherMessage> = bodies
                .iter()
                .map_while(|b| serde_json::from_slice(b).ok())
                .collect();
            prop_assert_eq!(&messages, &parsed);
            if messages.len() == bodies.len() {
                prop_assert_eq!(error.kind(), ErrorKind::UnexpectedEof);
            } else {
                prop_assert!(error.get_ref().is_some_and(|e| e.is::<serde_json::Error>()));
            }
        }

        #[test]
        fn fuzz_written_messages_read_back_and_a_cut_stream_is_an_error(
            messages in proptest::collection::vec(message(), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut stream = Vec::new();
            block_on(async {
                let mut out = requests(&mut stream);
                for m in &messages {
                    send(&mut out, m).await.expect("writes to a Vec");
                }
            });
            let (read, error) = read_all(&stream);
            prop_assert_eq!(&read, &messages);
            prop_assert_eq!(error.kind(), ErrorKind::UnexpectedEof);

            // The launcher died mid-frame: what was whole is read, then an error.
            let cut = cut.index(stream.len());
            let (read, error) = read_all(&stream[..cut]);
            prop_assert!(read.len() < messages.len());
            prop_assert_eq!(&read[..], &messages[..read.len()]);
            prop_assert_ne!(error.kind(), ErrorKind::InvalidData, "{}", error);
        }

        #[test]
        fn fuzz_a_length_above_the_limit_is_refused_before_reading_a_body(
            len in (MAX_MESSAGE as u32 + 1)..=u32::MAX,
            rest in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut stream = len.to_be_bytes().to_vec();
            stream.extend_from_slice(&rest);
            let (messages, error) = read_all(&stream);
            prop_assert!(messages.is_empty());
            // Not EOF: the body the length claims was never waited for nor allocated.
            prop_assert_eq!(error.kind(), ErrorKind::InvalidData);
            prop_assert!(error.to_string().contains("frame size too big"), "{}", error);
        }
    }

    #[test]
    fn a_message_of_exactly_the_limit_is_read() {
        let mut message = LauncherMessage::Failed {
            id: None,
            error: String::new(),
        };
        let overhead = serde_json::to_vec(&message).unwrap().len();
        let long = "x".repeat(MAX_MESSAGE - overhead);
        message = LauncherMessage::Failed {
            id: None,
            error: long,
        };
        let body = serde_json::to_vec(&message).unwrap();
        assert_eq!(body.len(), MAX_MESSAGE);
        let (messages, _) = read_all(&frame(&body));
        assert_eq!(messages, [message]);
    }
}
