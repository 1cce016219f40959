//! The messages on the pipes between the agent and its task launcher
//! (`agent/python/astro_launcher.py`): a 4-byte big-endian length, then that many bytes of
//! JSON. The launcher is a child process that may die mid-frame or misbehave, so reading
//! never trusts the length: one above [`MAX_MESSAGE`] is refused before any body is read or
//! allocated.

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol's messages are a few hundred bytes (ids and paths).
pub const MAX_MESSAGE: usize = 1024 * 1024;

pub async fn write_message<W: AsyncWrite + Unpin>(
    out: &mut W,
    message: &Value,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(message)?;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    out.write_all(&frame).await?;
    out.flush().await
}

pub async fn read_message<R: AsyncRead + Unpin>(input: &mut R) -> std::io::Result<Value> {
    let mut header = [0u8; 4];
    input.read_exact(&mut header).await?;
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!(
            "a {len}-byte message is out of protocol"
        )));
    }
    let mut body = vec![0u8; len];
    input.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

/// Arbitrary frames: every read ends in a message or an error, never a panic or a wait for a
/// body the length only claims. `PROPTEST_CASES` sets how many (the test command's fuzz step
/// raises it).
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use std::io::ErrorKind;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    /// Every message read from `bytes` until the first error (or the end).
    fn read_all(bytes: &[u8]) -> (Vec<Value>, std::io::Error) {
        block_on(async {
            let mut input = bytes;
            let mut messages = Vec::new();
            loop {
                match read_message(&mut input).await {
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

    /// The messages the protocol carries: objects of ids, pids, paths and errors (floats are
    /// left out: serde_json does not promise to read back the last bit of one).
    fn message() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            ".{0,24}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
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
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..4)
        ) {
            let stream: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
            let (messages, error) = read_all(&stream);
            let parsed: Vec<Value> = bodies
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
                for m in &messages {
                    write_message(&mut stream, m).await.expect("writes to a Vec");
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
            prop_assert_eq!(error.kind(), ErrorKind::UnexpectedEof);
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
            prop_assert_eq!(error.kind(), ErrorKind::Other);
            prop_assert!(error.to_string().contains("out of protocol"), "{}", error);
        }
    }

    #[test]
    fn a_message_of_exactly_the_limit_is_read() {
        let mut body = b"\"".to_vec();
        body.resize(MAX_MESSAGE - 1, b'x');
        body.push(b'"');
        let (messages, _) = read_all(&frame(&body));
        assert_eq!(messages[0].as_str().map(str::len), Some(MAX_MESSAGE - 2));
    }
}
