//! Framed, typed messages on a byte stream: each a 4-byte big-endian length, then that many
//! bytes of JSON (the default framing of [`LengthDelimitedCodec`]). Both of the agent's
//! process boundaries speak it: agent ↔ task host, task host ↔ Python launcher. The peer may
//! die mid-frame or misbehave, so reading never trusts the length: one above
//! [`MAX_MESSAGE`] is refused before any body is read or allocated.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{Error, ErrorKind};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

/// Messages are a few hundred bytes (ids and paths) up to a workload and an output tail.
pub const MAX_MESSAGE: usize = 1024 * 1024;

pub type Writer<W> = FramedWrite<W, LengthDelimitedCodec>;
pub type Reader<R> = FramedRead<R, LengthDelimitedCodec>;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_MESSAGE)
        .new_codec()
}

pub fn writer<W: AsyncWrite>(stream: W) -> Writer<W> {
    FramedWrite::new(stream, codec())
}

pub fn reader<R: AsyncRead>(stream: R) -> Reader<R> {
    FramedRead::new(stream, codec())
}

pub async fn send<W: AsyncWrite + Unpin>(
    out: &mut Writer<W>,
    message: &impl Serialize,
) -> std::io::Result<()> {
    out.send(Bytes::from(serde_json::to_vec(message)?)).await
}

/// The next message. The end of the stream is an error too: callers read only while they
/// expect a message.
pub async fn receive<M: DeserializeOwned, R: AsyncRead + Unpin>(
    input: &mut Reader<R>,
) -> std::io::Result<M> {
    let frame = input
        .next()
        .await
        .ok_or_else(|| Error::from(ErrorKind::UnexpectedEof))??;
    serde_json::from_slice(&frame).map_err(|e| Error::new(ErrorKind::InvalidData, e))
}
