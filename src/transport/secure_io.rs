//! The secure channel ([`crate::transport::auth`]) on sockets: tokio stream
//! halves that seal what is written into records and open what is read
//! ([`SecureRead`], [`SecureWrite`]), and the same for a blocking socket
//! ([`SecureStd`]). Without a channel (a transport without a cluster key) the
//! bytes pass through unchanged.

use super::auth::{AuthError, Channel, Opener, Sealer, MAX_RECORD, TAG};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most stream bytes sealed in one `poll_write`.
const SEAL_CHUNK: usize = 1 << 20;
/// Room for one whole record, and reads ahead of it.
const RAW_BUF: usize = 2 * (MAX_RECORD + 2);

fn bad(e: AuthError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Seals `plain` into the start of `out`, growing it (never shrinking it)
/// to the room the records need: the bytes of records.
fn seal_into(sealer: &mut Sealer, plain: &[u8], out: &mut Vec<u8>) -> io::Result<usize> {
    let need = Sealer::sealed_len(plain.len());
    if out.len() < need {
        out.resize(need, 0);
    }
    sealer.seal_into(plain, out).map_err(bad)
}

/// Splits a channel for a reader and a writer half (None: pass through).
pub fn split(ch: Option<Channel>) -> (Option<Opener>, Option<Sealer>) {
    match ch {
        Some(c) => (Some(c.opener), Some(c.sealer)),
        None => (None, None),
    }
}

/// Whole records of `raw[start..end]` opened one at a time; the buffer of
/// [`SecureRead`] and [`SecureStd`]. A record is opened straight into the
/// reader's buffer when that has room for its plaintext, else into `plain`
/// and copied out from there. Both buffers are allocated once and reused:
/// zeroing or growing one per record costs as much as the cipher.
struct OpenBuf {
    opener: Opener,
    /// Records as read, `raw[start..end]` not opened yet (allocated at the
    /// first read).
    raw: Vec<u8>,
    start: usize,
    end: usize,
    /// One record's bytes, `plain[pos..len]` not read yet (room for a whole
    /// record, allocated at the first record opened here).
    plain: Vec<u8>,
    pos: usize,
    len: usize,
    failed: bool,
    /// Records read straight into a caller's buffer ([`SecureRead::read_direct`]).
    direct: u64,
}

impl OpenBuf {
    fn new(opener: Opener) -> OpenBuf {
        OpenBuf {
            opener,
            raw: Vec::new(),
            start: 0,
            end: 0,
            plain: Vec::new(),
            pos: 0,
            len: 0,
            failed: false,
            direct: 0,
        }
    }

    /// Whether opened bytes wait to be read.
    fn pending(&self) -> bool {
        self.pos < self.len
    }

    /// Copies opened bytes into `out`: how many (0 when none are open).
    fn copy_out(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len - self.pos);
        out[..n].copy_from_slice(&self.plain[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos == self.len {
            self.pos = 0;
            self.len = 0;
        }
        n
    }

    fn fail(&mut self, e: AuthError) -> io::Error {
        self.failed = true;
        bad(e)
    }

    /// The plaintext bytes of the next record when `raw` holds all of it.
    fn next_record(&mut self) -> io::Result<Option<usize>> {
        if self.failed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the channel failed",
            ));
        }
        Opener::whole(&self.raw[self.start..self.end]).map_err(|e| self.fail(e))
    }

    /// The plaintext bytes of the next record once `raw` holds its length.
    fn next_len(&mut self) -> io::Result<Option<usize>> {
        match self.raw[self.start..self.end] {
            [a, b, ..] => Opener::plain_len([a, b])
                .map(Some)
                .map_err(|e| self.fail(e)),
            _ => Ok(None),
        }
    }

    /// Opens the next record (whole in `raw`) into `out`: the bytes written.
    fn open_into(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let have = &self.raw[self.start..self.end];
        let need = Opener::need(have);
        match self.opener.open_record(&have[..need], out) {
            Ok(n) => {
                self.start += need;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(n)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Opens the next record (whole in `raw`) into `plain`.
    fn open_here(&mut self) -> io::Result<()> {
        if self.plain.is_empty() {
            self.plain = vec![0u8; MAX_RECORD];
        }
        let mut plain = std::mem::take(&mut self.plain);
        let got = self.open_into(&mut plain);
        self.plain = plain;
        self.len = got?;
        self.pos = 0;
        Ok(())
    }

    /// Bytes for `out` (not empty) from what is held: opened bytes waiting,
    /// else the next record when it is whole in `raw` (opened into `out`
    /// when its plaintext fits, else into `plain` and copied from there).
    /// None: more must be read first; `Some(0)`: an empty record.
    fn take_into(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        if self.pending() {
            return Ok(Some(self.copy_out(out)));
        }
        let Some(plain) = self.next_record()? else {
            return Ok(None);
        };
        if out.len() >= plain {
            self.open_into(out).map(Some)
        } else {
            self.open_here()?;
            Ok(Some(self.copy_out(out)))
        }
    }

    /// Room to read into (compacting, allocating at first use).
    fn room(&mut self) -> &mut [u8] {
        if self.raw.is_empty() {
            self.raw = vec![0u8; RAW_BUF];
        }
        if self.start > 0 && (self.end == self.raw.len() || self.start > RAW_BUF / 2) {
            self.raw.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.raw[self.end..]
    }

    /// The end of the stream came: an error when it cut a record.
    fn at_eof(&self) -> io::Result<()> {
        if self.start == self.end {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection inside a record",
            ))
        }
    }
}

/// The read half of a connection, opening the peer's records.
pub struct SecureRead<R> {
    inner: R,
    open: Option<OpenBuf>,
}

impl<R> SecureRead<R> {
    pub fn new(inner: R, opener: Option<Opener>) -> SecureRead<R> {
        SecureRead {
            inner,
            open: opener.map(OpenBuf::new),
        }
    }

    /// The stream read from.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Records read straight into a caller's buffer so far
    /// ([`SecureRead::read_direct`]; 0 without a channel).
    pub fn records_direct(&self) -> u64 {
        self.open.as_ref().map_or(0, |ob| ob.direct)
    }
}

/// Records of at least this many plaintext bytes are read from the stream
/// straight into the caller's buffer by [`SecureRead::read_direct`].
pub const DIRECT_FROM: usize = 16 << 10;

impl<R: AsyncRead + Unpin> SecureRead<R> {
    /// Reads like `AsyncReadExt::read` (some bytes into `out`, 0 at the end
    /// of the stream), except that a record of [`DIRECT_FROM`] bytes or more
    /// that fits in `out` is read from the stream into `out` itself and
    /// opened there, where `poll_read` reads it into the channel's buffer
    /// first and opens it from there into `out`: one pass over the bytes
    /// fewer, for large reads of a known length (region answers, large
    /// frames).
    ///
    /// A record read into `out` is only opened once all of it came, in this
    /// call. Dropped before then (a timeout), the call leaves the stream
    /// inside a record: every later read of this channel fails.
    pub async fn read_direct(&mut self, out: &mut [u8]) -> io::Result<usize> {
        use tokio::io::AsyncReadExt;
        let SecureRead { inner, open } = self;
        let Some(ob) = open.as_mut() else {
            return inner.read(out).await;
        };
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            match ob.take_into(out)? {
                Some(0) => continue,
                Some(n) => return Ok(n),
                None => {}
            }
            if let Some(plain) = ob.next_len()? {
                if plain >= DIRECT_FROM && plain <= out.len() {
                    return read_record_into(inner, ob, &mut out[..plain]).await;
                }
            }
            let n = inner.read(ob.room()).await?;
            if n == 0 {
                ob.at_eof()?;
                return Ok(0);
            }
            ob.end += n;
        }
    }
}

/// Reads the rest of the record that starts `ob.raw[ob.start..ob.end]` (its
/// length known, the record not whole there) from `inner`: its ciphertext
/// into `out` (its plaintext's length), its tag apart; then opens it in
/// place. The bytes after the tag (at most the next record's length) stay
/// in `ob`, so that a next record of its own can come straight into its
/// caller's buffer too.
async fn read_record_into<R: AsyncRead + Unpin>(
    inner: &mut R,
    ob: &mut OpenBuf,
    out: &mut [u8],
) -> io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let plain = out.len();
    let held = &ob.raw[ob.start + 2..ob.end];
    let body = held.len().min(plain);
    out[..body].copy_from_slice(&held[..body]);
    let mut tag = [0u8; TAG];
    let mut got_tag = held.len() - body;
    tag[..got_tag].copy_from_slice(&held[body..]);
    ob.start = 0;
    ob.end = 0;
    // Until the record is opened the stream is inside it: a read dropped
    // meanwhile leaves the channel failed.
    ob.failed = true;
    let cut = || {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the connection inside a record",
        )
    };
    let mut at = body;
    while at < plain {
        let n = inner.read(&mut out[at..]).await?;
        if n == 0 {
            return Err(cut());
        }
        at += n;
    }
    while got_tag < TAG {
        // The tag, and the next record's length with it (`raw` is empty,
        // so its room starts at its first byte).
        let want = TAG - got_tag + 2;
        let room = ob.room();
        let n = inner.read(&mut room[..want]).await?;
        if n == 0 {
            return Err(cut());
        }
        let t = n.min(TAG - got_tag);
        tag[got_tag..got_tag + t].copy_from_slice(&room[..t]);
        got_tag += t;
        // What followed the tag; `raw` is empty again when nothing did.
        (ob.start, ob.end) = if t == n { (0, 0) } else { (t, n) };
    }
    ob.failed = false;
    match ob.opener.open_in_place(out, tag) {
        Ok(()) => {
            ob.direct += 1;
            Ok(plain)
        }
        Err(e) => Err(ob.fail(e)),
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for SecureRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let Some(ob) = me.open.as_mut() else {
            return Pin::new(&mut me.inner).poll_read(cx, buf);
        };
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if ob.pending() {
                // Only the bytes copied are initialized first: a caller's
                // large spare capacity is not zeroed on every read.
                let want = buf.remaining().min(ob.len - ob.pos);
                let n = ob.copy_out(buf.initialize_unfilled_to(want));
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(plain) = ob.next_record()? {
                if buf.remaining() >= plain {
                    let n = ob.open_into(buf.initialize_unfilled_to(plain))?;
                    buf.advance(n);
                    if n > 0 {
                        return Poll::Ready(Ok(()));
                    }
                } else {
                    ob.open_here()?;
                }
                continue;
            }
            let room = ob.room();
            let mut rb = ReadBuf::new(room);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                ob.at_eof()?;
                return Poll::Ready(Ok(()));
            }
            ob.end += n;
        }
    }
}

/// Sealed bytes waiting to be written (`out[pos..len]`). `out` is kept
/// (at most [`SEAL_CHUNK`] sealed by a write; more by
/// [`SecureWrite::seal_now`] until [`SecureWrite::trim`]) so that a write
/// does not zero or grow it.
struct SealBuf {
    sealer: Sealer,
    out: Vec<u8>,
    pos: usize,
    len: usize,
    /// The stream bytes `out` holds (answered to `poll_write` once written).
    accounted: usize,
}

impl SealBuf {
    fn drain<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pos < self.len {
            let n = ready!(Pin::new(&mut *w).poll_write(cx, &self.out[self.pos..self.len]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.pos = 0;
        self.len = 0;
        Poll::Ready(Ok(()))
    }
}

/// The write half of a connection, sealing what is written into records.
/// A `poll_write` answers once the records of its bytes are written to the
/// socket, so nothing waits in here for a flush.
pub struct SecureWrite<W> {
    inner: W,
    seal: Option<SealBuf>,
}

impl<W> SecureWrite<W> {
    pub fn new(inner: W, sealer: Option<Sealer>) -> SecureWrite<W> {
        SecureWrite {
            inner,
            seal: sealer.map(|sealer| SealBuf {
                sealer,
                out: Vec::new(),
                pos: 0,
                len: 0,
                accounted: 0,
            }),
        }
    }
}

impl<W> SecureWrite<W> {
    /// Whether what is written is sealed (the connection carries a channel).
    pub fn seals(&self) -> bool {
        self.seal.is_some()
    }

    /// Seals `plain` now, after the records waiting to be written, and writes
    /// nothing: for a caller that reads its bytes under a lock and must not
    /// wait on the socket meanwhile (a flush writes them). The bytes are
    /// copied once, from where they lie into their records; written with
    /// `write`, bytes a caller first gathered into a buffer of its own are
    /// copied twice. Without a channel there is nothing to seal: an error.
    pub fn seal_now(&mut self, plain: &[u8]) -> io::Result<()> {
        let Some(sb) = self.seal.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no channel to seal with",
            ));
        };
        let need = sb.len + Sealer::sealed_len(plain.len());
        if sb.out.len() < need {
            sb.out.resize(need, 0);
        }
        let n = sb
            .sealer
            .seal_into(plain, &mut sb.out[sb.len..])
            .map_err(bad)?;
        sb.len += n;
        Ok(())
    }

    /// Once every sealed record is written, gives back the buffer's memory
    /// past `keep` bytes (one large [`Self::seal_now`] grows it).
    pub fn trim(&mut self, keep: usize) {
        if let Some(sb) = self.seal.as_mut() {
            if sb.pos == sb.len && sb.out.len() > keep {
                sb.out.truncate(keep);
                sb.out.shrink_to(keep);
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SecureWrite<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let Some(sb) = me.seal.as_mut() else {
            return Pin::new(&mut me.inner).poll_write(cx, buf);
        };
        if sb.pos < sb.len && sb.accounted == 0 {
            // Records of `seal_now` go out first (none of them are `buf`'s).
            ready!(sb.drain(&mut me.inner, cx))?;
        }
        if sb.pos == sb.len {
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            let n = buf.len().min(SEAL_CHUNK);
            sb.len = seal_into(&mut sb.sealer, &buf[..n], &mut sb.out)?;
            sb.pos = 0;
            sb.accounted = n;
        }
        ready!(sb.drain(&mut me.inner, cx))?;
        Poll::Ready(Ok(std::mem::take(&mut sb.accounted)))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Some(sb) = me.seal.as_mut() {
            ready!(sb.drain(&mut me.inner, cx))?;
        }
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Some(sb) = me.seal.as_mut() {
            ready!(sb.drain(&mut me.inner, cx))?;
        }
        Pin::new(&mut me.inner).poll_shutdown(cx)
    }
}

/// A blocking socket carrying a channel (for the RDMA side channel and test
/// tools): `Read` opens records, `Write` seals them.
pub struct SecureStd<S> {
    inner: S,
    open: OpenBuf,
    sealer: Sealer,
    out: Vec<u8>,
}

impl<S: io::Read + io::Write> SecureStd<S> {
    pub fn new(inner: S, ch: Channel) -> SecureStd<S> {
        SecureStd {
            inner,
            open: OpenBuf::new(ch.opener),
            sealer: ch.sealer,
            out: Vec::new(),
        }
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The socket and the channel back, for a driver that goes on with them
    /// elsewhere; an error when bytes the peer sent are still buffered here.
    pub fn into_parts(self) -> io::Result<(S, Channel)> {
        if self.open.start != self.open.end || self.open.pending() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer sent more than was asked for",
            ));
        }
        Ok((
            self.inner,
            Channel {
                sealer: self.sealer,
                opener: self.open.opener,
            },
        ))
    }
}

impl<S: io::Read + io::Write> io::Read for SecureStd<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.open.take_into(buf)? {
                Some(0) => continue,
                Some(n) => return Ok(n),
                None => {}
            }
            let n = self.inner.read(self.open.room())?;
            if n == 0 {
                self.open.at_eof()?;
                return Ok(0);
            }
            self.open.end += n;
        }
    }
}

impl<S: io::Read + io::Write> io::Write for SecureStd<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(SEAL_CHUNK);
        let len = seal_into(&mut self.sealer, &buf[..n], &mut self.out)?;
        self.inner.write_all(&self.out[..len])?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::auth::tests::channel_pair;
    use crate::transport::auth::{Sealer, MAX_PLAIN};
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A blocking socket's stand-in: reads from `rx`, writes to `tx`.
    struct Pipe {
        rx: io::Cursor<Vec<u8>>,
        tx: Vec<u8>,
    }

    impl io::Read for Pipe {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            io::Read::read(&mut self.rx, buf)
        }
    }

    impl io::Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            io::Write::write(&mut self.tx, buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn stream(n: usize) -> Vec<u8> {
        (0..n as u32).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Reads of every size come back as the stream sent: reads with room
    /// for a whole record and its tag open it in place, smaller ones go
    /// through the buffer, and the two mix within one stream.
    #[test]
    fn reads_of_any_size_give_back_the_stream() {
        let (d, l) = channel_pair();
        let data = stream(5 * MAX_PLAIN + 1234);
        let mut w = SecureStd::new(
            Pipe {
                rx: io::Cursor::new(Vec::new()),
                tx: Vec::new(),
            },
            d,
        );
        // Writes of uneven sizes: records do not line up with reads.
        for part in data.chunks(40_000) {
            w.write_all(part).unwrap();
        }
        let wire = std::mem::take(&mut w.inner.tx);
        let mut r = SecureStd::new(
            Pipe {
                rx: io::Cursor::new(wire),
                tx: Vec::new(),
            },
            l,
        );
        let sizes = [
            7,
            MAX_RECORD + 100,
            MAX_PLAIN,
            MAX_RECORD,
            3,
            MAX_RECORD * 2,
        ];
        let mut got = Vec::new();
        let mut i = 0;
        loop {
            let mut buf = vec![0xAAu8; sizes[i % sizes.len()]];
            i += 1;
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the stream came back changed");
    }

    /// A changed byte of a record fails the read that opens it, in place
    /// or through the buffer, and every read after it.
    #[test]
    fn a_changed_record_fails_whatever_the_read_size() {
        for size in [100, MAX_RECORD * 2] {
            let (mut d, l) = channel_pair();
            let mut wire = Vec::new();
            d.sealer.seal(&stream(3 * MAX_PLAIN), &mut wire).unwrap();
            wire[2 + MAX_RECORD + 2 + 10] ^= 1;
            let mut r = SecureStd::new(
                Pipe {
                    rx: io::Cursor::new(wire),
                    tx: Vec::new(),
                },
                l,
            );
            let mut buf = vec![0u8; size];
            let mut read = 0;
            let err = loop {
                match r.read(&mut buf) {
                    Ok(n) => {
                        assert!(n > 0, "the stream ended before the changed record");
                        read += n;
                    }
                    Err(e) => break e,
                }
            };
            assert_eq!(read, MAX_PLAIN, "only the first record opened");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert!(r.read(&mut buf).is_err(), "the channel stays failed");
        }
    }

    /// A runtime for the async halves' tests.
    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// The two ends of a duplex stream carrying a channel.
    fn sealed_duplex() -> (
        SecureWrite<tokio::io::DuplexStream>,
        SecureRead<tokio::io::DuplexStream>,
    ) {
        let (d, l) = channel_pair();
        let (a, b) = tokio::io::duplex(1 << 16);
        (
            SecureWrite::new(a, Some(d.sealer)),
            SecureRead::new(b, Some(l.opener)),
        )
    }

    /// Bytes sealed ahead of a write (`seal_now`, as the region server seals
    /// a slot under its lock) reach the peer in order with those written,
    /// and the buffer they grew is given back once written; a connection
    /// without a channel has nothing to seal with.
    #[test]
    fn bytes_sealed_ahead_go_out_in_order_with_those_written() {
        current_thread().block_on(async {
            let (mut w, mut r) = sealed_duplex();
            assert!(w.seals());
            let big = stream(5 * MAX_PLAIN + 3);
            let sent = big.clone();
            let writer = tokio::spawn(async move {
                w.write_all(b"head").await.unwrap();
                w.seal_now(b"").unwrap();
                w.seal_now(&sent[..10]).unwrap();
                w.seal_now(&sent[10..]).unwrap();
                w.write_all(b"tail").await.unwrap();
                w.flush().await.unwrap();
                w.trim(1 << 10);
                assert!(w.seal.as_ref().unwrap().out.len() <= 1 << 10);
                w.seal_now(b"last").unwrap();
                w.shutdown().await.unwrap();
            });
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            let mut want = b"head".to_vec();
            want.extend_from_slice(&big);
            want.extend_from_slice(b"taillast");
            assert!(got == want, "the stream came back changed");

            let (a, _b) = tokio::io::duplex(64);
            let mut clear = SecureWrite::new(a, None);
            assert!(!clear.seals());
            let err = clear.seal_now(b"x").unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        });
    }

    /// `stream`'s bytes sealed as records of the sizes `writes` (each write
    /// cut into records as `SecureWrite` cuts it), as they go on the wire.
    fn sealed(sealer: &mut Sealer, data: &[u8], writes: &[usize]) -> Vec<u8> {
        let mut wire = Vec::new();
        let mut at = 0;
        for &n in writes {
            sealer.seal(&data[at..at + n], &mut wire).unwrap();
            at += n;
        }
        assert_eq!(at, data.len());
        wire
    }

    /// Writes `wire` in pieces of the sizes `cuts` (in turn), letting the
    /// reader run after each: records, tags and lengths arrive cut anywhere.
    async fn write_cut(mut to: tokio::io::DuplexStream, wire: Vec<u8>, cuts: &[usize]) {
        let mut at = 0;
        for &c in cuts.iter().cycle() {
            if at == wire.len() {
                break;
            }
            let end = (at + c).min(wire.len());
            to.write_all(&wire[at..end]).await.unwrap();
            at = end;
            tokio::task::yield_now().await;
        }
        to.shutdown().await.unwrap();
    }

    /// `read_direct` gives back the stream whatever the records' sizes, the
    /// cuts on the wire and the caller's buffers (small reads through the
    /// channel's buffer mixed in), and reads large records that fit straight
    /// into the caller's buffer.
    #[test]
    fn records_read_straight_into_the_callers_buffer_give_back_the_stream() {
        let writes = [
            MAX_PLAIN,
            100_000,
            20_000,
            5,
            DIRECT_FROM,
            DIRECT_FROM - 1,
            3 * MAX_PLAIN + 7,
            1,
            70_000,
            602_112,
        ];
        let data = stream(writes.iter().sum());
        for cuts in [
            &[1usize, 17, 2, 16, 4096, 65_551, 18, 100_000, 3][..],
            &[65_537][..],
            &[1 << 20][..],
            &[7, 9][..],
        ] {
            current_thread().block_on(async {
                let (d, l) = channel_pair();
                let (a, b) = tokio::io::duplex(1 << 20);
                let mut sealer = d.sealer;
                let wire = sealed(&mut sealer, &data, &writes);
                let writer = tokio::spawn({
                    let cuts = cuts.to_vec();
                    async move { write_cut(a, wire, &cuts).await }
                });
                let mut r = SecureRead::new(b, Some(l.opener));
                let outs = [700_000usize, MAX_PLAIN, 1000, 20_000, 7, 66_000];
                let mut got = Vec::new();
                for i in 0.. {
                    let mut out = vec![0xAAu8; outs[i % outs.len()]];
                    let n = if i % 5 == 4 {
                        r.read(&mut out).await
                    } else {
                        r.read_direct(&mut out).await
                    }
                    .unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&out[..n]);
                }
                writer.await.unwrap();
                assert!(got == data, "the stream came back changed (cuts {cuts:?})");
                let direct = r.records_direct();
                assert!(
                    direct >= 5,
                    "{direct} records read straight (cuts {cuts:?})"
                );
            });
        }
    }

    /// A record read straight into the caller's buffer and changed on the
    /// way does not open, and the channel reads nothing after it; a read
    /// dropped inside such a record (a timeout) leaves the channel failed.
    #[test]
    fn a_record_read_straight_is_checked_and_a_cut_read_fails_the_channel() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let data = stream(3 * DIRECT_FROM);
            // Changed on the way.
            let (d, l) = channel_pair();
            let (mut a, b) = tokio::io::duplex(1 << 20);
            let mut sealer = d.sealer;
            let mut wire = sealed(&mut sealer, &data, &[DIRECT_FROM, 2 * DIRECT_FROM]);
            wire[2 + 100] ^= 1;
            let mut r = SecureRead::new(b, Some(l.opener));
            a.write_all(&wire[..1000]).await.unwrap();
            let writer = tokio::spawn(async move {
                tokio::task::yield_now().await;
                a.write_all(&wire[1000..]).await.unwrap();
                a
            });
            let mut out = vec![0u8; 3 * DIRECT_FROM];
            let e = r.read_direct(&mut out).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(r.read_direct(&mut out).await.is_err(), "nothing after it");
            assert!(r.read(&mut out).await.is_err(), "nothing after it");
            drop(writer.await.unwrap());

            // Cut by a timeout inside the record.
            let (d, l) = channel_pair();
            let (mut a, b) = tokio::io::duplex(1 << 20);
            let mut sealer = d.sealer;
            let wire = sealed(&mut sealer, &data, &[DIRECT_FROM, 2 * DIRECT_FROM]);
            let mut r = SecureRead::new(b, Some(l.opener));
            a.write_all(&wire[..1000]).await.unwrap();
            let cut = tokio::time::timeout(
                std::time::Duration::from_millis(20),
                r.read_direct(&mut out),
            )
            .await;
            assert!(cut.is_err(), "the read waited for the rest");
            a.write_all(&wire[1000..]).await.unwrap();
            let e = r.read_direct(&mut out).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        });
    }

    /// The tokio halves: a large `read_exact` (records opened in place) and
    /// small reads (through the buffer) over one duplex stream.
    #[test]
    fn async_halves_carry_large_and_small_reads() {
        current_thread().block_on(async {
            let (mut w, mut r) = sealed_duplex();
            let data = stream(3 * MAX_PLAIN + 77);
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                w.write_all(&sent).await.unwrap();
                w.write_all(b"tail").await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut big = vec![0u8; 2 * MAX_PLAIN];
            r.read_exact(&mut big).await.unwrap();
            let mut rest = Vec::new();
            let mut small = [0u8; 1000];
            loop {
                let n = r.read(&mut small).await.unwrap();
                if n == 0 {
                    break;
                }
                rest.extend_from_slice(&small[..n]);
            }
            writer.await.unwrap();
            big.extend_from_slice(&rest);
            let mut want = data;
            want.extend_from_slice(b"tail");
            assert!(big == want, "the stream came back changed");
        });
    }
}
