//! The secure channel ([`crate::transport::auth`]) on sockets: tokio stream
//! halves that seal what is written into records and open what is read
//! ([`SecureRead`], [`SecureWrite`]), and the same for a blocking socket
//! ([`SecureStd`]). Without a channel (a transport without a cluster key) the
//! bytes pass through unchanged.

use super::auth::{AuthError, Channel, Opener, Sealer, MAX_RECORD};
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

/// Splits a channel for a reader and a writer half (None: pass through).
pub fn split(ch: Option<Channel>) -> (Option<Opener>, Option<Sealer>) {
    match ch {
        Some(c) => (Some(c.opener), Some(c.sealer)),
        None => (None, None),
    }
}

/// Whole records of `raw[start..end]` opened one at a time; the buffer of
/// [`SecureRead`] and [`SecureStd`].
struct OpenBuf {
    opener: Opener,
    /// Records as read, `raw[start..end]` not opened yet (allocated at the
    /// first read).
    raw: Vec<u8>,
    start: usize,
    end: usize,
    /// One record's bytes, `plain[pos..]` not read yet.
    plain: Vec<u8>,
    pos: usize,
    failed: bool,
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
            failed: false,
        }
    }

    /// Copies opened bytes into `out`: how many (0 when none are open).
    fn copy_out(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.plain.len() - self.pos);
        out[..n].copy_from_slice(&self.plain[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos == self.plain.len() {
            self.plain.clear();
            self.pos = 0;
        }
        n
    }

    /// Opens the next whole record, if `raw` holds one: true when it did.
    fn open_next(&mut self) -> io::Result<bool> {
        if self.failed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the channel failed",
            ));
        }
        let have = &self.raw[self.start..self.end];
        let need = Opener::need(have);
        if have.len() < need || have.len() < 2 {
            return Ok(false);
        }
        match self.opener.open(&have[..need], &mut self.plain) {
            Ok(used) => {
                debug_assert_eq!(used, need);
                self.start += need;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(true)
            }
            Err(e) => {
                self.failed = true;
                Err(bad(e))
            }
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
            if ob.pos < ob.plain.len() {
                // Only the bytes copied are initialized first: a caller's
                // large spare capacity is not zeroed on every read.
                let want = buf.remaining().min(ob.plain.len() - ob.pos);
                let n = ob.copy_out(buf.initialize_unfilled_to(want));
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if ob.open_next()? {
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

/// Sealed bytes waiting to be written (`out[pos..]`).
struct SealBuf {
    sealer: Sealer,
    out: Vec<u8>,
    pos: usize,
    /// The stream bytes `out` holds (answered to `poll_write` once written).
    accounted: usize,
}

impl SealBuf {
    fn drain<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pos < self.out.len() {
            let n = ready!(Pin::new(&mut *w).poll_write(cx, &self.out[self.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.out.clear();
        self.pos = 0;
        if self.out.capacity() > 2 * SEAL_CHUNK {
            self.out.shrink_to(SEAL_CHUNK);
        }
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
                accounted: 0,
            }),
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
        if sb.pos == sb.out.len() {
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            sb.out.clear();
            sb.pos = 0;
            let n = buf.len().min(SEAL_CHUNK);
            sb.sealer.seal(&buf[..n], &mut sb.out).map_err(bad)?;
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
        if self.open.start != self.open.end || self.open.pos != self.open.plain.len() {
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
            if self.open.pos < self.open.plain.len() {
                return Ok(self.open.copy_out(buf));
            }
            if self.open.open_next()? {
                continue;
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
        self.out.clear();
        self.sealer.seal(&buf[..n], &mut self.out).map_err(bad)?;
        self.inner.write_all(&self.out)?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
