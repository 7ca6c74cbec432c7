//! A control connection's reader task: splits the byte stream into frames, decodes
//! them and delivers them as [`Event::Msg`](crate::transport::Event::Msg); a frame
//! over [`MAX_FRAME`] or one that does not decode ends the connection.

use super::conn::ConnShared;
use super::net::{quick_ack, QUICK_ACK_FROM};
use super::options::READ_CHUNK;
use super::runtime::stopped;
use crate::transport::secure_io::SecureRead;
use crate::wire::{self, DecodeError, Msg, MAX_FRAME};
use bytes::{Bytes, BytesMut};
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

/// The most a frame's own buffer grows by at once ahead of the bytes received.
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
    let mut buf = FrameBuf::new();
    let mut spares = FrameSpares::default();
    let mut msgs = VecDeque::new();
    let mut need = 4usize; // bytes the next frame needs in `buf` (prefix included)
    loop {
        if need >= OWN_FRAME_FROM {
            let frame = match read_own_frame(&mut rd, &mut buf, need, &mut spares).await {
                Ok(Some(f)) => f,
                Ok(None) => {
                    let left = need - 4;
                    return Some((
                        format!("peer closed the connection inside a frame of {left} bytes"),
                        false,
                    ));
                }
                Err(e) => return Some(read_failed(shared, &e)),
            };
            need = 4;
            match wire::decode_shared(&frame) {
                Ok(m) => msgs.push_back(m),
                Err(e) => return Some(bad_frame(shared, &e)),
            }
            if !shared.deliver_all(&mut msgs).await {
                return None;
            }
            continue;
        }
        if need.saturating_sub(buf.end) >= QUICK_ACK_FROM {
            quick_ack(rd.get_ref().as_ref());
        }
        let n = match rd.read(buf.room()).await {
            Ok(n) => n,
            Err(e) => return Some(read_failed(shared, &e)),
        };
        if n == 0 {
            return Some((eof_reason(buf.bytes()), false));
        }
        buf.filled(n);
        let pos = match split_frames(buf.bytes(), &mut msgs) {
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
                return Some(bad_frame(shared, &e));
            }
        };
        buf.consume(pos);
        if !msgs.is_empty() && !shared.deliver_all(&mut msgs).await {
            return None;
        }
    }
}

/// Why a read failed, and whether to log it (a record that does not verify
/// is worth a warning).
fn read_failed(shared: &ConnShared, e: &std::io::Error) -> (String, bool) {
    let log = e.kind() == std::io::ErrorKind::InvalidData;
    (format!("read from {} failed: {e}", shared.peer), log)
}

/// A frame that does not decode: the peer is told, and the connection ends.
fn bad_frame(shared: &ConnShared, e: &DecodeError) -> (String, bool) {
    let reason = format!("bad frame: {e}");
    shared.tell_peer(&reason);
    (reason, true)
}

/// Frames of this many bytes and more (prefix included) are read into a
/// buffer of their own and decoded with their large byte fields as views of it
/// ([`wire::decode_shared`]): a request's input goes from the channel's
/// records into that buffer and from there into the frontend's region, with
/// no copy between.
const OWN_FRAME_FROM: usize = 64 << 10;

/// Reads the rest of a frame of `need` bytes (prefix included), which starts
/// `buf` (whatever of it was read), into a buffer of its own: the frame's
/// body, or None if the peer closed the connection before its end. A frame
/// of up to [`SPARE_MAX_BYTES`] gets its whole buffer at once; a larger one's
/// grows with the bytes that came, not with what its prefix announces.
async fn read_own_frame(
    rd: &mut ReadHalf,
    buf: &mut FrameBuf,
    need: usize,
    spares: &mut FrameSpares,
) -> std::io::Result<Option<Bytes>> {
    let len = need - 4;
    // What came with the prefix (less than the frame, or it would be framed).
    let have = buf.end - 4;
    let mut body = spares.take();
    body.truncate(len);
    let first = if len <= SPARE_MAX_BYTES {
        len
    } else {
        grown(have, len)
    };
    if body.len() < first {
        body.resize(first, 0);
    }
    body[..have].copy_from_slice(&buf.bytes()[4..]);
    buf.consume(buf.end);
    let mut at = have;
    while at < len {
        if at == body.len() {
            body.resize(grown(at, len), 0);
        }
        if len - at >= QUICK_ACK_FROM {
            quick_ack(rd.get_ref().as_ref());
        }
        let n = rd.read_direct(&mut body[at..]).await?;
        if n == 0 {
            return Ok(None);
        }
        at += n;
    }
    let frame = body.freeze();
    spares.keep(&frame);
    Ok(Some(frame))
}

/// The size a frame's own buffer grows to once `at` bytes of its `len` came.
fn grown(at: usize, len: usize) -> usize {
    len.min(at + at.clamp(READ_CHUNK, GROW_MAX))
}

/// The most frame buffers a connection keeps a handle on to take back, the
/// most of them it keeps once free, and the largest it keeps. Under load
/// frames wait for the event loop to store them, and a frame whose buffer
/// is not taken back gets a new one, zeroed and page-faulted in. Measured
/// with 602,112-byte inputs over TCP on 2 cores (`fermata serve --transport
/// tcp`), the frames that got a new buffer with handles on the last 4
/// against the last 16: 5.6% against 2.5% at 1,000 r/s, 22% against 13% at
/// 1,600 r/s (past capacity). A connection holds at most 16 MiB of them
/// past their messages, and at most 4 MiB once its next frame came.
const SPARES_MAX: usize = 16;
const SPARES_FREE_MAX: usize = 4;
const SPARE_MAX_BYTES: usize = 1 << 20;

/// The buffers of the frames read into their own ([`read_own_frame`]),
/// taken back once their messages are gone: a buffer taken back is read over
/// (its bytes are initialized), where a new one is zeroed first, a pass over
/// every byte.
#[derive(Default)]
struct FrameSpares {
    out: VecDeque<Bytes>,
}

impl FrameSpares {
    /// A buffer taken back (its bytes initialized) if one is free, else an
    /// empty one.
    fn take(&mut self) -> BytesMut {
        let mut got = BytesMut::new();
        if let Some(i) = self.out.iter().position(Bytes::is_unique) {
            let b = self.out.remove(i).expect("a position in the queue");
            if let Ok(m) = b.try_into_mut() {
                got = m;
            }
        }
        // Free buffers past the few kept go back to the allocator.
        let mut free = 0;
        self.out.retain(|b| {
            if b.is_unique() {
                free += 1;
                free <= SPARES_FREE_MAX
            } else {
                true
            }
        });
        got
    }

    /// Keeps a handle on `frame` to take it back once its messages are gone.
    fn keep(&mut self, frame: &Bytes) {
        if frame.len() > SPARE_MAX_BYTES {
            return;
        }
        if self.out.len() == SPARES_MAX {
            self.out.pop_front();
        }
        self.out.push_back(frame.clone());
    }
}

/// The reader's buffer for frames under [`OWN_FRAME_FROM`]: `buf[..end]`
/// holds the bytes read and not framed yet, less than one such frame, so the
/// buffer never holds more than that and a chunk. All of `buf` is
/// initialized and kept between frames, so the channel opens its records
/// straight into it (spare capacity is zeroed before each record opened
/// there, a pass over every byte as costly as a copy).
struct FrameBuf {
    buf: Vec<u8>,
    end: usize,
}

impl FrameBuf {
    fn new() -> FrameBuf {
        FrameBuf {
            buf: vec![0; READ_CHUNK],
            end: 0,
        }
    }

    /// Room for the next read: a chunk past the bytes held.
    fn room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < READ_CHUNK {
            self.buf.resize(self.end + READ_CHUNK, 0);
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`Self::room`].
    fn filled(&mut self, n: usize) {
        self.end += n;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.end]
    }

    /// Drops the first `pos` bytes (frames decoded or taken elsewhere).
    fn consume(&mut self, pos: usize) {
        if pos > 0 {
            self.buf.copy_within(pos..self.end, 0);
            self.end -= pos;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `bytes` into `b` as a socket would, at most `chunk` at a time.
    fn feed(b: &mut FrameBuf, bytes: &[u8], chunk: usize) {
        let mut at = 0;
        while at < bytes.len() {
            let room = b.room();
            let n = room.len().min(chunk).min(bytes.len() - at);
            room[..n].copy_from_slice(&bytes[at..at + n]);
            b.filled(n);
            at += n;
        }
    }

    /// A frame's buffer is taken back once nothing else holds it, and only
    /// then; the largest are not kept, nor more than a few.
    #[test]
    fn frame_buffers_are_taken_back_once_free() {
        let mut s = FrameSpares::default();
        assert!(s.take().is_empty());
        let a = Bytes::from(vec![1u8; 1000]);
        let view = a.slice(10..20);
        s.keep(&a);
        drop(a);
        // A view of it lives: not taken back.
        assert!(s.take().is_empty());
        assert_eq!(&view[..], &[1u8; 10]);
        drop(view);
        // Free now: taken back with its bytes, the same memory.
        let m = s.take();
        assert_eq!(&m[..], &[1u8; 1000][..]);
        let p = m.as_ptr();
        let f = m.freeze();
        s.keep(&f);
        drop(f);
        assert_eq!(s.take().as_ptr(), p);
        // Too large, or past the count: not kept.
        s.keep(&Bytes::from(vec![0u8; SPARE_MAX_BYTES + 1]));
        assert!(s.take().is_empty());
        let held: Vec<Bytes> = (0..SPARES_MAX + 2)
            .map(|_| Bytes::from(vec![0u8; 10]))
            .collect();
        for b in &held {
            s.keep(b);
        }
        assert_eq!(s.out.len(), SPARES_MAX);
        // Once free, all but a few go back to the allocator at the next take.
        drop(held);
        assert_eq!(s.take().len(), 10);
        assert_eq!(s.out.len(), SPARES_FREE_MAX);
        // A frame's own buffer grows with the bytes that came.
        assert_eq!(grown(0, 64 << 20), READ_CHUNK);
        assert_eq!(grown(5 << 20, 64 << 20), (5 << 20) + GROW_MAX);
        assert_eq!(grown(600_000, 602_112), 602_112);
    }

    /// The buffer holds what came of a frame under [`OWN_FRAME_FROM`] and a
    /// chunk more at most, and is kept from frame to frame.
    #[test]
    fn the_buffer_holds_a_small_frame_and_a_chunk() {
        let mut b = FrameBuf::new();
        // A prefix and a few bytes: a chunk held.
        feed(&mut b, &[1, 2, 3, 4, 5], 5);
        assert_eq!(b.bytes(), &[1, 2, 3, 4, 5]);
        assert_eq!(b.buf.len(), READ_CHUNK);
        // The largest frame it holds, less a byte: at most a chunk past it.
        let big: Vec<u8> = (0..OWN_FRAME_FROM - 6).map(|i| i as u8).collect();
        feed(&mut b, &big, 4096);
        assert_eq!(&b.bytes()[5..], &big[..]);
        assert!(b.buf.len() <= b.end + READ_CHUNK, "{}", b.buf.len());
        b.consume(b.end - 7);
        assert_eq!(
            b.bytes(),
            &big[big.len() - 7..],
            "the tail moved to the front"
        );
        // Kept: frames after it are read into the same memory.
        b.consume(b.end);
        let (p, len) = (b.buf.as_ptr(), b.buf.len());
        for _ in 0..100 {
            feed(&mut b, &[3u8; 100], 100);
            b.consume(100);
        }
        assert_eq!((b.buf.as_ptr(), b.buf.len()), (p, len));
    }
}
