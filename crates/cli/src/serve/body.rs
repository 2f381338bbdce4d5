//! Request bodies, read up to a size limit.
//!
//! A body past the limit gets a 413. Answering at once and closing would reset the connection
//! under a client that is still sending, which then sees a broken pipe instead of the answer
//! (hyper closes a connection whose body was not read). So, as nginx's "lingering close" does,
//! the rest of the body is read and dropped first, up to [`DRAIN_BYTES`] more bytes and
//! [`DRAIN_TIME`]; past either bound the connection is closed.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use futures_lite::StreamExt;

use super::api::ApiError;

/// The most bytes read and dropped after the limit is passed.
pub const DRAIN_BYTES: usize = 64 << 20;
/// The longest time spent reading and dropping after the limit is passed.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads a whole body of at most `limit` bytes.
///
/// # Errors
/// 413 when the body is larger than `limit` (`--max-body-bytes`); 400 when the connection fails
/// while the body is read.
pub async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}"), None))?;
        if chunk.len() > limit - buf.len() {
            drop(buf);
            drain(&mut stream).await;
            return Err(ApiError::bad_request(
                format!(
                    "request body is larger than the limit of {limit} bytes (--max-body-bytes)"
                ),
                None,
            )
            .status(StatusCode::PAYLOAD_TOO_LARGE));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.into())
}

/// Reads and drops what is left of a body, within [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(stream: &mut axum::body::BodyDataStream) {
    let deadline = tokio::time::Instant::now() + DRAIN_TIME;
    let mut dropped = 0usize;
    while dropped <= DRAIN_BYTES {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(chunk))) => dropped += chunk.len(),
            _ => return,
        }
    }
}
