//! A control connection's reader task: splits the byte stream into frames, decodes
//! them and delivers them as [`Event::Msg`](crate::transport::Event::Msg); a frame
//! over [`MAX_FRAME`] or one that does not decode ends the connection.

use super::conn::ConnShared;
use super::options::READ_CHUNK;
use super::runtime::stopped;
use crate::transport::secure_io::SecureRead;
use crate::wire::{self, DecodeError, Msg, MAX_FRAME};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

/// A connection's read half, opening the channel's records.
pub(super) type ReadHalf = SecureRead<OwnedReadHalf>;
use tokio::sync::watch;

pub(super) async fn conn_reader(
    shared: Arc<ConnShared>,
    rd: ReadHalf,
    mut stop: watch::Receiver<bool>,
) {
    let reason = tokio::select! {
        biased;
        _ = stopped(&mut stop) => return,
        r = read_frames(&shared, rd) => r,
    };
    if let Some((reason, log)) = reason {
        if log {
            tracing::warn!(peer = %shared.peer, %reason, "tcp: closing connection");
        }
        shared.finish(reason);
    }
}

/// The most the read buffer grows by at once ahead of the bytes received.
const GROW_MAX: usize = 1 << 20;

/// Why [`split_frames`] stopped before the end of the bytes.
enum FrameError {
    /// A length prefix over [`MAX_FRAME`].
    TooLong(usize),
    /// A frame that does not decode.
    Bad(DecodeError),
}

/// Reads frames until the connection ends; the reason it ended (and whether it is
/// a protocol error worth logging), None when the event loop is gone.
async fn read_frames(shared: &ConnShared, mut rd: ReadHalf) -> Option<(String, bool)> {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut msgs = VecDeque::new();
    let mut need = 4usize; // bytes the next frame needs in `buf` (prefix included)
    loop {
        // The buffer grows with the bytes that came, not with what a frame's
        // length prefix announces: a peer that announces 64 MiB and sends a
        // few bytes holds a few bytes (at most twice what it sent, through the
        // vector's doubling).
        let want = need.saturating_sub(buf.len()).clamp(READ_CHUNK, GROW_MAX);
        buf.reserve(want);
        let n = match rd.read_buf(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                // A record that does not verify is worth a warning.
                let log = e.kind() == std::io::ErrorKind::InvalidData;
                return Some((format!("read from {} failed: {e}", shared.peer), log));
            }
        };
        if n == 0 {
            return Some((eof_reason(&buf), false));
        }
        let pos = match split_frames(&buf, &mut msgs) {
            Ok((pos, next_need)) => {
                need = next_need;
                pos
            }
            Err(FrameError::TooLong(len)) => {
                let reason = format!("frame of {len} bytes is over the limit of {MAX_FRAME}");
                shared.tell_peer(&reason);
                return Some((reason, true));
            }
            Err(FrameError::Bad(e)) => {
                // Deliver what came before the bad frame, then close.
                shared.deliver_all(&mut msgs).await;
                let reason = format!("bad frame: {e}");
                shared.tell_peer(&reason);
                return Some((reason, true));
            }
        };
        buf.drain(..pos);
        if !msgs.is_empty() && !shared.deliver_all(&mut msgs).await {
            return None;
        }
        if buf.is_empty() && buf.capacity() > 4 * READ_CHUNK {
            buf.shrink_to(READ_CHUNK);
        }
    }
}

/// Why the connection ended when the peer closed it, with `buf` left unread.
fn eof_reason(buf: &[u8]) -> String {
    if buf.is_empty() {
        "peer closed the connection".to_string()
    } else {
        format!(
            "peer closed the connection inside a frame ({} bytes left over)",
            buf.len()
        )
    }
}

/// Decodes every whole frame at the start of `buf` into `msgs`: the bytes they
/// took and the bytes the next frame needs in `buf` (prefix included).
fn split_frames(buf: &[u8], msgs: &mut VecDeque<Msg>) -> Result<(usize, usize), FrameError> {
    let mut pos = 0;
    loop {
        let rest = &buf[pos..];
        if rest.len() < 4 {
            return Ok((pos, 4));
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLong(len));
        }
        if rest.len() < 4 + len {
            return Ok((pos, 4 + len));
        }
        msgs.push_back(wire::decode(&rest[4..4 + len]).map_err(FrameError::Bad)?);
        pos += 4 + len;
    }
}
