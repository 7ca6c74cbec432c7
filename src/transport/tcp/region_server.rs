//! The region server: serves one-sided reads of a [`Region`] without the
//! application. A listener of its own, and a task per reader connection that
//! greets the reader and answers its requests straight from the region (the
//! frames are those of [`crate::transport::region_wire`]).

use super::net;
use super::options::{ANSWER_CHUNK, CONNECT_TIMEOUT, READ_CHUNK};
use super::runtime::Inner;
use crate::transport::auth::{ClusterKey, Service};
use crate::transport::region_wire::{self as rw, ANS_LEN, REQ_LEN, ST_OK, ST_WRONG_REGION};
use crate::transport::secure_io::{self, SecureRead, SecureWrite};
use crate::transport::{Region, RegionServer, SLOT_HEADER};
use crate::wire::RegionInfo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

struct TcpRegionServer {
    info: RegionInfo,
    /// Dropped with the server: its tasks see the channel closed and stop.
    stop: Option<watch::Sender<()>>,
    /// One clone per running server task (accept loop, reader connections).
    live: Arc<()>,
    _inner: Arc<Inner>,
}

impl Drop for TcpRegionServer {
    /// Stops serving and, outside the runtime, waits (up to 2 s) until every
    /// server task has ended and closed its socket, so no read is answered after
    /// the drop returns.
    fn drop(&mut self) {
        self.stop.take();
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let end = std::time::Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&self.live) > 1 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl RegionServer for TcpRegionServer {
    fn info(&self) -> RegionInfo {
        self.info.clone()
    }
}

/// [`Transport::serve_region`](crate::transport::Transport::serve_region) for TCP.
pub(super) fn serve(
    inner: &Arc<Inner>,
    region: Arc<Region>,
    addr: &str,
) -> anyhow::Result<Box<dyn RegionServer>> {
    let addr = if addr.is_empty() { "127.0.0.1:0" } else { addr };
    let (l, local) = net::bind(inner, addr, "region server")?;
    let info = RegionInfo {
        addr: local.to_string(),
        region: region.id(),
        len: region.len(),
        rkey: 0,
        base: 0,
    };
    let (stop, stop_rx) = watch::channel(());
    let live = Arc::new(());
    inner.handle.spawn(region_accept(
        l,
        region,
        stop_rx,
        live.clone(),
        inner.key.clone(),
    ));
    Ok(Box::new(TcpRegionServer {
        info,
        stop: Some(stop),
        live,
        _inner: inner.clone(),
    }))
}

async fn region_accept(
    listener: tokio::net::TcpListener,
    region: Arc<Region>,
    stop: watch::Receiver<()>,
    live: Arc<()>,
    key: Option<ClusterKey>,
) {
    let mut stop2 = stop.clone();
    let accept = async {
        loop {
            match listener.accept().await {
                Ok((s, peer)) => {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(region_conn(
                        s,
                        peer,
                        region.clone(),
                        stop.clone(),
                        live.clone(),
                        key.clone(),
                    ));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tcp: region server: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    tokio::select! {
        _ = stop2.changed() => {}
        _ = accept => {}
    }
}

async fn region_conn(
    s: TcpStream,
    peer: SocketAddr,
    region: Arc<Region>,
    mut stop: watch::Receiver<()>,
    _live: Arc<()>,
    key: Option<ClusterKey>,
) {
    let serve = async {
        let mut s = s;
        let Ok(ch) = Inner::authenticate(&key, &mut s, &peer, Service::Region).await else {
            return;
        };
        let (rd, wr) = s.into_split();
        let (opener, sealer) = secure_io::split(ch);
        let mut rd = SecureRead::new(rd, opener);
        let mut wr = SecureWrite::new(wr, sealer);
        if let Err(e) = serve_reads(&mut rd, &mut wr, &region).await {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                tracing::warn!(%peer, error = %e, "tcp: region server: reader failed");
            }
        }
    };
    tokio::select! {
        _ = stop.changed() => {}
        _ = serve => {}
    }
}

/// Greets a reader; false when it asked for another region (it was told so).
async fn greet<R, W>(rd: &mut R, wr: &mut W, region: &Region) -> std::io::Result<bool>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hello = [0u8; rw::HELLO_LEN];
    tokio::time::timeout(CONNECT_TIMEOUT, rd.read_exact(&mut hello))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no hello"))??;
    let want = rw::parse_hello(&hello)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let status = if want == region.id() {
        ST_OK
    } else {
        ST_WRONG_REGION
    };
    wr.write_all(&rw::welcome(status, region.len())).await?;
    Ok(status == ST_OK)
}

/// Zeros for probes' answers, written from here rather than copied into an
/// answer buffer per probe.
static ZERO_CHUNK: [u8; ANSWER_CHUNK] = [0u8; ANSWER_CHUNK];

async fn write_zeros<W: AsyncWrite + Unpin>(wr: &mut W, mut n: usize) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(ZERO_CHUNK.len());
        wr.write_all(&ZERO_CHUNK[..k]).await?;
        n -= k;
    }
    Ok(())
}

/// Slots of at least this many bytes are sealed straight from the region's
/// memory into the connection's records (one copy of each byte, under the
/// slot's stripe locks); smaller answers are gathered into `out` first,
/// which saves records and writes.
const SEAL_DIRECT_MIN: u32 = 64 << 10;

async fn serve_reads<R, W>(
    rd: &mut R,
    wr: &mut SecureWrite<W>,
    region: &Region,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if !greet(rd, wr, region).await? {
        return Ok(());
    }
    let direct = wr.seals().then_some(SEAL_DIRECT_MIN);
    let mut inb: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    loop {
        inb.reserve(READ_CHUNK);
        if rd.read_buf(&mut inb).await? == 0 {
            return Ok(());
        }
        let mut pos = 0;
        while inb.len() - pos >= REQ_LEN {
            if let Some(req) = direct.and_then(|min| rw::large_request(&inb[pos..], min)) {
                pos += REQ_LEN;
                if !out.is_empty() {
                    wr.write_all(&out).await?;
                    out.clear();
                }
                seal_slot(wr, region, req, &mut out)?;
                wr.flush().await?;
                wr.trim(4 * ANSWER_CHUNK);
                continue;
            }
            let (used, zeros) = rw::serve_requests_streamed_below(
                &inb[pos..],
                region,
                &mut out,
                ANSWER_CHUNK,
                direct,
            );
            pos += used;
            if zeros > 0 || out.len() >= ANSWER_CHUNK {
                wr.write_all(&out).await?;
                out.clear();
                write_zeros(wr, zeros as usize).await?;
            }
        }
        inb.drain(..pos);
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
        // One large answer (an input of up to 16 MiB) grows the buffer; it
        // is not kept beyond a few chunks between bursts.
        if out.capacity() > 4 * ANSWER_CHUNK {
            out.shrink_to(ANSWER_CHUNK);
        }
        if inb.capacity() > 4 * READ_CHUNK {
            inb.shrink_to(READ_CHUNK);
        }
    }
}

/// Answers `req` by sealing its header and its slot's bytes into `wr`'s
/// records while the region's stripes are read-locked (nothing written yet);
/// a read the region refuses gets its error's header in `out`.
fn seal_slot<W>(
    wr: &mut SecureWrite<W>,
    region: &Region,
    req: rw::Request,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let ok = rw::AnswerHeader {
        id: req.id,
        status: ST_OK,
        len: req.len,
    };
    // The answer's header and the slot's in one record, the payload in
    // records of its own: a reader that puts payloads where they go (a row
    // of a batch's buffer) reads each of its large records straight there.
    match region.read_slot(req.offset, req.len, req.cap, |b| {
        let (head, payload) = b.split_at(SLOT_HEADER.min(b.len()));
        let mut first = [0u8; ANS_LEN + SLOT_HEADER];
        first[..ANS_LEN].copy_from_slice(&ok.encode());
        first[ANS_LEN..ANS_LEN + head.len()].copy_from_slice(head);
        wr.seal_now(&first[..ANS_LEN + head.len()])?;
        if payload.is_empty() {
            return Ok(());
        }
        wr.seal_now(payload)
    }) {
        Ok(sealed) => sealed,
        Err(e) => {
            out.extend_from_slice(&rw::AnswerHeader::failed(req.id, e).encode());
            Ok(())
        }
    }
}
