//! A control connection's writer task: drains the send queue, encodes whatever is
//! queued into one buffer of frames and writes it at once (a large input after
//! it, from where it lies); at the connection's end
//! it flushes what is left (within [`CLOSE_FLUSH`]) and shuts its side down.

use super::conn::ConnShared;
use super::options::{CLOSE_FLUSH, WRITE_CHUNK};
use super::runtime::stopped;
use crate::transport::secure_io::SecureWrite;
use crate::wire::{self, Msg, MAX_FRAME};
use bytes::Bytes;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

/// A connection's write half, sealing into the channel's records.
type WriteHalf = SecureWrite<OwnedWriteHalf>;
use tokio::sync::{mpsc, watch};

pub(super) async fn conn_writer(
    shared: Arc<ConnShared>,
    mut wr: WriteHalf,
    mut queue: mpsc::Receiver<Msg>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = Vec::with_capacity(64 << 10);
    let clean = write_until_stopped(&shared, &mut wr, &mut queue, &mut stop, &mut buf).await;
    flush_and_shut_down(&shared, wr, queue, buf, clean).await;
}

/// Writes what is queued until the connection ends; false when a write was cut
/// short: the stream is then mid-frame and nothing more may be sent.
async fn write_until_stopped(
    shared: &ConnShared,
    wr: &mut WriteHalf,
    queue: &mut mpsc::Receiver<Msg>,
    stop: &mut watch::Receiver<bool>,
    buf: &mut Vec<u8>,
) -> bool {
    let mut clean = true;
    loop {
        let first = tokio::select! {
            biased;
            _ = stopped(stop) => None,
            m = queue.recv() => m,
        };
        let Some(first) = first else { break };
        let tail = match encode_batch(shared, first, queue, buf) {
            Ok(tail) => tail,
            Err(reason) => {
                shared.finish(reason);
                break;
            }
        };
        let res = write_with_grace(wr, buf, tail.as_deref(), stop).await;
        buf.clear();
        if buf.capacity() > 4 * WRITE_CHUNK {
            buf.shrink_to(WRITE_CHUNK);
        }
        match res {
            Ok(true) => {}
            Ok(false) => clean = false,
            Err(e) => {
                shared.finish(format!("write to {} failed: {e}", shared.peer));
                clean = false;
                break;
            }
        }
    }
    clean
}

/// Writes `buf` and then `tail`; when the connection ends meanwhile (the peer
/// was not reading), gives the write the grace period [`CLOSE_FLUSH`].
/// Ok(false): the grace period ran out with the write cut short.
async fn write_with_grace(
    wr: &mut WriteHalf,
    buf: &[u8],
    tail: Option<&[u8]>,
    stop: &mut watch::Receiver<bool>,
) -> std::io::Result<bool> {
    let write = write_frames(wr, buf, tail);
    tokio::pin!(write);
    tokio::select! {
        biased;
        r = &mut write => r.map(|()| true),
        _ = stopped(stop) => {
            match tokio::time::timeout(CLOSE_FLUSH, &mut write).await {
                Ok(r) => r.map(|()| true),
                Err(_) => Ok(false),
            }
        }
    }
}

/// `buf`, then the large input that ends its last frame (if any).
async fn write_frames(wr: &mut WriteHalf, buf: &[u8], tail: Option<&[u8]>) -> std::io::Result<()> {
    wr.write_all(buf).await?;
    if let Some(t) = tail {
        wr.write_all(t).await?;
    }
    Ok(())
}

/// The connection ended (closed by us, by the peer or on an error): sends what is
/// still queued, within the grace period, then shuts our side down so the peer
/// sees EOF.
async fn flush_and_shut_down(
    shared: &ConnShared,
    mut wr: WriteHalf,
    mut queue: mpsc::Receiver<Msg>,
    mut buf: Vec<u8>,
    clean: bool,
) {
    let flush = async {
        if clean {
            while let Ok(m) = queue.try_recv() {
                let Ok(tail) = encode_batch(shared, m, &mut queue, &mut buf) else {
                    break;
                };
                if write_frames(&mut wr, &buf, tail.as_deref()).await.is_err() {
                    break;
                }
                buf.clear();
            }
        }
        let _ = wr.shutdown().await;
    };
    let _ = tokio::time::timeout(CLOSE_FLUSH, flush).await;
}

/// Inputs of at least this many bytes are written from the message, not
/// copied into the buffer of frames first.
const TAIL_MIN: usize = 64 << 10;

/// Encodes `first` and whatever else is queued (up to [`WRITE_CHUNK`]) into
/// `buf`; a large input ends the batch and is returned, the rest of its frame
/// (written after `buf`).
fn encode_batch(
    shared: &ConnShared,
    first: Msg,
    queue: &mut mpsc::Receiver<Msg>,
    buf: &mut Vec<u8>,
) -> Result<Option<Bytes>, String> {
    let mut next = Some(first);
    while let Some(m) = next.take() {
        let start = buf.len();
        let tail = wire::encode_split(&m, buf, TAIL_MIN);
        let frame = buf.len() - start + tail.as_ref().map_or(0, Bytes::len);
        if frame > MAX_FRAME + 4 {
            buf.truncate(start);
            return Err(format!(
                "message {} to {} is a frame of {} bytes, over the limit of {MAX_FRAME}",
                m.kind(),
                shared.peer,
                frame - 4
            ));
        }
        if tail.is_some() {
            return Ok(tail);
        }
        if buf.len() < WRITE_CHUNK {
            next = queue.try_recv().ok();
        }
    }
    Ok(None)
}
