//! TCP transport (tokio, loopback or LAN).
//!
//! A [`Tcp`] value owns a small tokio runtime (two named worker threads); every
//! method is a plain synchronous call that can be made from any thread, inside tokio
//! or not. Every socket has `TCP_NODELAY` set.
//!
//! # Control connections
//! Each [`Conn`] has two tasks:
//! * a **writer** draining a bounded queue ([`SEND_QUEUE`] messages;
//!   [`SendError::Full`] beyond): it encodes everything queued into one buffer
//!   (frames of [`crate::wire::encode`]) and writes it at once, so a burst of sends
//!   costs a few system calls;
//! * a **reader** splitting the byte stream into frames, decoding them and pushing
//!   [`Event::Msg`]s. A frame longer than [`MAX_FRAME`] or one that does not decode
//!   closes that connection (the reason is logged on stderr); nothing else is
//!   affected.
//!
//! A connection ends once, for whichever comes first: [`Conn::close`], the peer's
//! end (EOF), a read or write error, a bad frame. Its event channel then gets one
//! [`Event::Closed`] and nothing after it. `close` sends what was queued before it
//! (for at most [`CLOSE_FLUSH`]) and shuts the socket down; the peer sees EOF.
//! Dropping a `Conn` handle does not close the connection (as in-process).
//! Events are pushed from the runtime's threads without blocking them: at a full
//! event channel ([`EVENTS_MAX`]) a reader waits and tries again (it reads no more
//! meanwhile, so TCP flow control slows the peer down); the waits are counted.
//!
//! # Region server (one-sided reads without the application)
//! [`Transport::serve_region`] runs its own listener; a task per reader connection
//! answers fixed-size binary requests straight from the [`Region`] (copied with
//! [`Region::with_slice`] into the socket's write buffer). The protocol (all little
//! endian) is not [`Msg`]:
//!
//! ```text
//! hello    reader -> server   u32 magic "FTRG", u32 region id
//! welcome  server -> reader   u32 magic, u32 status (0 ok, 1 wrong region), u64 region len
//! request  reader -> server   u64 request id, u64 offset, u32 len           (20 bytes)
//! answer   server -> reader   u64 request id, u32 status (0 ok, 1 out of bounds),
//!                             u32 len, then len bytes when ok               (16 bytes + data)
//! ```
//!
//! Requests are pipelined: a reader sends every request of a [`RegionReader::read_many`]
//! at once and answers come back in order. The [`RegionReader`] keeps one connection
//! per attached peer (made in `attach`); a broken connection fails its reads as
//! [`ReadError::Unreachable`] until the peer is attached again. The caller of
//! `read_many` sleeps on a condition variable until the last answer (one wake-up per
//! call), so it may be any plain thread.
//!
//! Addresses are reported as bound: a listener or region server bound to
//! `0.0.0.0:0` reports `0.0.0.0:PORT`, which peers on other hosts cannot use; bind
//! to the address peers should connect to.

use super::region_wire::{
    self as rw, AnswerHeader, Request, ANS_LEN, REQ_LEN, ST_OK, ST_WRONG_REGION,
};
use super::*;
use crate::wire::{self, MAX_FRAME};
use anyhow::Context as _;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{mpsc, watch};

/// Messages a connection queues before `send` answers [`SendError::Full`].
pub const SEND_QUEUE: usize = 65536;
/// How long `close` keeps trying to send what was queued before it.
pub const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// How long `connect` and `attach` wait for the peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The writer writes once this much is encoded even if more is queued.
const WRITE_CHUNK: usize = 1 << 20;
/// Smallest read a connection's reader asks the socket for.
const READ_CHUNK: usize = 64 << 10;

/// A region reader's buffer for answer headers (and small answers); larger answers
/// bypass it, straight into their own `Vec`.
const ANSWER_BUF: usize = 8 << 10;
/// A region server writes its answers once this much is buffered.
const ANSWER_CHUNK: usize = 256 << 10;

/// The TCP transport. Clones share one runtime, which lives as long as the last
/// clone or anything made with it (connections, listeners, servers, readers).
#[derive(Clone)]
pub struct Tcp {
    inner: Arc<Inner>,
}

struct Inner {
    rt: Option<Runtime>,
    handle: Handle,
    next_id: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            if Handle::try_current().is_ok() {
                // Dropped inside a runtime (maybe our own): must not block.
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

/// Worker threads of each TCP transport's tokio runtime: `FERMATA_TCP_THREADS`
/// (1 to 64), default 2.
fn tcp_threads() -> usize {
    std::env::var("FERMATA_TCP_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or(2)
}

impl Tcp {
    /// A transport with its own runtime (2 worker threads named `fermata-tcp`).
    pub fn new() -> anyhow::Result<Tcp> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(tcp_threads())
            .thread_name("fermata-tcp")
            .enable_all()
            .build()
            .context("starting the TCP transport's tokio runtime")?;
        let handle = rt.handle().clone();
        Ok(Tcp {
            inner: Arc::new(Inner {
                rt: Some(rt),
                handle,
                next_id: AtomicU64::new(1),
            }),
        })
    }
}

fn resolve(addr: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving `{addr}`"))?
        .collect();
    if addrs.is_empty() {
        anyhow::bail!("`{addr}` resolves to no address");
    }
    Ok(addrs)
}

/// A blocking connect (from any thread) with [`CONNECT_TIMEOUT`] per address.
fn connect_std(addr: &str) -> anyhow::Result<std::net::TcpStream> {
    let mut last = None;
    for a in resolve(addr)? {
        match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => {
                s.set_nodelay(true)
                    .with_context(|| format!("setting TCP_NODELAY on the connection to {a}"))?;
                return Ok(s);
            }
            Err(e) => last = Some((a, e)),
        }
    }
    let (a, e) = last.expect("at least one address");
    Err(e).with_context(|| format!("connecting to `{addr}` ({a})"))
}

fn bind_std(addr: &str, what: &str) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding the {what} to `{addr}`"))?;
    l.set_nonblocking(true)
        .with_context(|| format!("making the {what} at `{addr}` non-blocking"))?;
    Ok(l)
}

// ---------------------------------------------------------------------------
// Control connections

/// How long a reader waits before it tries a full event channel again.
const EVENTS_FULL_WAIT: Duration = Duration::from_micros(200);

/// What [`ConnShared::deliver`] got done.
enum Delivered {
    All,
    /// The event channel is full; the rest is still to deliver.
    Full,
    /// The event loop is gone.
    Gone,
}

struct ConnShared {
    id: ConnId,
    peer: String,
    events: EventTx,
    /// Set once the connection ended (for `send`, without the lock).
    closed: AtomicBool,
    /// The reason it ended. Held while pushing events, so that nothing follows
    /// `Closed`.
    reason: Mutex<Option<String>>,
    /// Tells both tasks to stop (set once, when the connection ends).
    stop: watch::Sender<bool>,
    queue: mpsc::Sender<Msg>,
}

impl ConnShared {
    /// Ends the connection once: records `reason`, sends `Closed`, stops the tasks.
    /// False when it had already ended.
    fn finish(&self, reason: String) -> bool {
        let mut r = self.reason.lock().expect("conn lock");
        if r.is_some() {
            return false;
        }
        self.closed.store(true, Ordering::Release);
        // Never waits: `finish` may run on the node's own loop (`close`).
        let _ = self
            .events
            .send_detached(Event::Closed(self.id, reason.clone()));
        *r = Some(reason);
        drop(r);
        self.stop.send_replace(true);
        true
    }

    /// Pushes decoded messages, in order, unless the connection has ended; stops
    /// at a full event channel, leaving the rest in `msgs` (the lock is not held
    /// while waiting, so `close` never waits on a reader).
    fn deliver(&self, msgs: &mut VecDeque<Msg>) -> Delivered {
        let r = self.reason.lock().expect("conn lock");
        if r.is_some() {
            msgs.clear();
            return Delivered::All;
        }
        while let Some(m) = msgs.pop_front() {
            match self.events.try_send(Event::Msg(self.id, m)) {
                Ok(()) => {}
                Err(crossbeam_channel::TrySendError::Full(Event::Msg(_, m))) => {
                    msgs.push_front(m);
                    return Delivered::Full;
                }
                Err(_) => return Delivered::Gone,
            }
        }
        Delivered::All
    }

    /// [`ConnShared::deliver`] until every message is in (waiting
    /// [`EVENTS_FULL_WAIT`] at a time while the channel is full). False when the
    /// event loop is gone.
    async fn deliver_all(&self, msgs: &mut VecDeque<Msg>) -> bool {
        loop {
            match self.deliver(msgs) {
                Delivered::All => return true,
                Delivered::Gone => return false,
                Delivered::Full => tokio::time::sleep(EVENTS_FULL_WAIT).await,
            }
        }
    }

    fn reason(&self) -> String {
        self.reason
            .lock()
            .expect("conn lock")
            .clone()
            .unwrap_or_default()
    }
}

struct TcpConn {
    shared: Arc<ConnShared>,
    /// Keeps the runtime (and so the connection's tasks) alive.
    _inner: Arc<Inner>,
}

impl Conn for TcpConn {
    fn id(&self) -> ConnId {
        self.shared.id
    }
    fn peer(&self) -> String {
        self.shared.peer.clone()
    }
    fn send(&self, msg: Msg) -> Result<(), SendError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed(self.shared.reason()));
        }
        self.shared.queue.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SendError::Full,
            mpsc::error::TrySendError::Closed(_) => SendError::Closed(self.shared.reason()),
        })
    }
    fn close(&self, reason: &str) {
        self.shared.finish(reason.to_string());
    }
}

/// Makes a connection of `stream` and starts its writer; `start_reader` must be
/// called once the caller has announced the connection (so that `Accepted` comes
/// before its messages).
fn new_conn(
    inner: &Arc<Inner>,
    stream: TcpStream,
    peer: String,
    events: EventTx,
) -> (Arc<TcpConn>, impl FnOnce()) {
    let (stop, stop_rx) = watch::channel(false);
    let (queue, queue_rx) = mpsc::channel(SEND_QUEUE);
    let shared = Arc::new(ConnShared {
        id: inner.next_id.fetch_add(1, Ordering::Relaxed),
        peer,
        events,
        closed: AtomicBool::new(false),
        reason: Mutex::new(None),
        stop,
        queue,
    });
    let (rd, wr) = stream.into_split();
    inner
        .handle
        .spawn(conn_writer(shared.clone(), wr, queue_rx, stop_rx.clone()));
    let conn = Arc::new(TcpConn {
        shared: shared.clone(),
        _inner: inner.clone(),
    });
    let handle = inner.handle.clone();
    let start = move || {
        handle.spawn(conn_reader(shared, rd, stop_rx));
    };
    (conn, start)
}

/// Resolves once `stop` is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn conn_writer(
    shared: Arc<ConnShared>,
    mut wr: OwnedWriteHalf,
    mut queue: mpsc::Receiver<Msg>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = Vec::with_capacity(64 << 10);
    // False once a write was cut short: the stream is then mid-frame and nothing
    // more may be sent.
    let mut clean = true;
    loop {
        let first = tokio::select! {
            biased;
            _ = stopped(&mut stop) => None,
            m = queue.recv() => m,
        };
        let Some(first) = first else { break };
        if let Err(reason) = encode_batch(&shared, first, &mut queue, &mut buf) {
            shared.finish(reason);
            break;
        }
        let write = wr.write_all(&buf);
        tokio::pin!(write);
        let res = tokio::select! {
            biased;
            r = &mut write => r,
            _ = stopped(&mut stop) => {
                // Ended while the peer was not reading: give it the grace period.
                match tokio::time::timeout(CLOSE_FLUSH, &mut write).await {
                    Ok(r) => r,
                    Err(_) => {
                        clean = false;
                        Ok(())
                    }
                }
            }
        };
        buf.clear();
        if buf.capacity() > 4 * WRITE_CHUNK {
            buf.shrink_to(WRITE_CHUNK);
        }
        if let Err(e) = res {
            shared.finish(format!("write to {} failed: {e}", shared.peer));
            clean = false;
            break;
        }
    }
    // Ended (closed by us, by the peer or on an error): send what is still queued,
    // within the grace period, then shut our side down so the peer sees EOF.
    let flush = async {
        if clean {
            while let Ok(m) = queue.try_recv() {
                if encode_batch(&shared, m, &mut queue, &mut buf).is_err()
                    || wr.write_all(&buf).await.is_err()
                {
                    break;
                }
                buf.clear();
            }
        }
        let _ = wr.shutdown().await;
    };
    let _ = tokio::time::timeout(CLOSE_FLUSH, flush).await;
}

/// Encodes `first` and whatever else is queued (up to [`WRITE_CHUNK`]) into `buf`.
fn encode_batch(
    shared: &ConnShared,
    first: Msg,
    queue: &mut mpsc::Receiver<Msg>,
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    let mut next = Some(first);
    while let Some(m) = next.take() {
        let start = buf.len();
        wire::encode(&m, buf);
        let frame = buf.len() - start;
        if frame > MAX_FRAME + 4 {
            buf.truncate(start);
            return Err(format!(
                "message {} to {} is a frame of {} bytes, over the limit of {MAX_FRAME}",
                m.kind(),
                shared.peer,
                frame - 4
            ));
        }
        if buf.len() < WRITE_CHUNK {
            next = queue.try_recv().ok();
        }
    }
    Ok(())
}

async fn conn_reader(shared: Arc<ConnShared>, rd: OwnedReadHalf, mut stop: watch::Receiver<bool>) {
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

/// Reads frames until the connection ends; the reason it ended (and whether it is
/// a protocol error worth logging), None when the event loop is gone.
async fn read_frames(shared: &ConnShared, mut rd: OwnedReadHalf) -> Option<(String, bool)> {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut msgs = VecDeque::new();
    let mut need = 4usize; // bytes the next frame needs in `buf` (prefix included)
    loop {
        let want = need.saturating_sub(buf.len()).max(READ_CHUNK);
        buf.reserve(want);
        let n = match rd.read_buf(&mut buf).await {
            Ok(n) => n,
            Err(e) => return Some((format!("read from {} failed: {e}", shared.peer), false)),
        };
        if n == 0 {
            let why = if buf.is_empty() {
                "peer closed the connection".to_string()
            } else {
                format!(
                    "peer closed the connection inside a frame ({} bytes left over)",
                    buf.len()
                )
            };
            return Some((why, false));
        }
        // Every whole frame in `buf`.
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            if rest.len() < 4 {
                need = 4;
                break;
            }
            let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_FRAME {
                return Some((
                    format!("frame of {len} bytes is over the limit of {MAX_FRAME}"),
                    true,
                ));
            }
            if rest.len() < 4 + len {
                need = 4 + len;
                break;
            }
            match wire::decode(&rest[4..4 + len]) {
                Ok(m) => msgs.push_back(m),
                Err(e) => {
                    // Deliver what came before the bad frame, then close.
                    shared.deliver_all(&mut msgs).await;
                    return Some((format!("bad frame: {e}"), true));
                }
            }
            pos += 4 + len;
        }
        buf.drain(..pos);
        if !msgs.is_empty() && !shared.deliver_all(&mut msgs).await {
            return None;
        }
        if buf.is_empty() && buf.capacity() > 4 * READ_CHUNK {
            buf.shrink_to(READ_CHUNK);
        }
    }
}

// ---------------------------------------------------------------------------
// Listener

struct TcpListenerHandle {
    addr: String,
    task: tokio::task::JoinHandle<()>,
    _inner: Arc<Inner>,
}

impl Listener for TcpListenerHandle {
    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    inner: std::sync::Weak<Inner>,
    listener: tokio::net::TcpListener,
    events: EventTx,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: wait a little, go on.
                tracing::warn!(error = %e, "tcp: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(%peer, error = %e, "tcp: setting TCP_NODELAY failed");
        }
        let (conn, start) = new_conn(&inner, stream, peer.to_string(), events.clone());
        let conn: Arc<dyn Conn> = conn;
        if events.send_detached(Event::Accepted(conn.clone())).is_err() {
            // Nobody listens to this listener's events any more.
            conn.close("listener's event loop is gone");
            return;
        }
        start();
    }
}

// ---------------------------------------------------------------------------
// Region server

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

async fn region_accept(
    listener: tokio::net::TcpListener,
    region: Arc<Region>,
    stop: watch::Receiver<()>,
    live: Arc<()>,
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
) {
    let serve = async {
        if let Err(e) = serve_reads(s, &region).await {
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

async fn serve_reads(mut s: TcpStream, region: &Region) -> std::io::Result<()> {
    let mut hello = [0u8; rw::HELLO_LEN];
    tokio::time::timeout(CONNECT_TIMEOUT, s.read_exact(&mut hello))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no hello"))??;
    let want = rw::parse_hello(&hello)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let status = if want == region.id() {
        ST_OK
    } else {
        ST_WRONG_REGION
    };
    s.write_all(&rw::welcome(status, region.len())).await?;
    if status != ST_OK {
        return Ok(());
    }
    let mut inb: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    loop {
        inb.reserve(READ_CHUNK);
        if s.read_buf(&mut inb).await? == 0 {
            return Ok(());
        }
        let mut pos = 0;
        while inb.len() - pos >= REQ_LEN {
            pos += rw::serve_requests(&inb[pos..], region, &mut out, ANSWER_CHUNK);
            if out.len() >= ANSWER_CHUNK {
                s.write_all(&out).await?;
                out.clear();
            }
        }
        inb.drain(..pos);
        if !out.is_empty() {
            s.write_all(&out).await?;
            out.clear();
        }
        if out.capacity() > 64 * ANSWER_CHUNK {
            out.shrink_to(ANSWER_CHUNK);
        }
    }
}

// ---------------------------------------------------------------------------
// Region reader

type ReadResult = Result<Vec<u8>, ReadError>;

/// One `read_many` call: its results, filled in by the connections' reader tasks;
/// the caller sleeps until the last one (one wake-up per call, not per read).
struct Batch {
    st: Mutex<BatchState>,
    cv: std::sync::Condvar,
}

struct BatchState {
    out: Vec<Option<ReadResult>>,
    /// Reads sent and not answered yet.
    left: usize,
    /// The caller has taken the results (timed out): later answers are dropped.
    taken: bool,
}

impl Batch {
    fn complete(&self, idx: usize, r: ReadResult) {
        let mut st = self.st.lock().expect("batch lock");
        if st.taken || st.out[idx].is_some() {
            return;
        }
        st.out[idx] = Some(r);
        st.left -= 1;
        if st.left == 0 {
            self.cv.notify_one();
        }
    }
}

struct Pending {
    idx: usize,
    len: u32,
    /// Capacity `len`; the answer's bytes are read straight into it.
    buf: Vec<u8>,
    batch: Arc<Batch>,
}

#[derive(Default)]
struct PeerState {
    pending: HashMap<u64, Pending>,
    /// Why the connection is unusable (broken or detached).
    broken: Option<String>,
}

struct Peer {
    addr: String,
    region_len: u64,
    state: Mutex<PeerState>,
    requests: mpsc::UnboundedSender<Vec<u8>>,
    stop: watch::Sender<bool>,
}

impl Peer {
    /// Marks the connection unusable and fails every read waiting on it.
    fn fail(&self, reason: String) {
        let mut st = self.state.lock().expect("peer lock");
        let reason = st.broken.get_or_insert(reason).clone();
        for (_, p) in st.pending.drain() {
            p.batch
                .complete(p.idx, Err(ReadError::Unreachable(reason.clone())));
        }
        drop(st);
        self.stop.send_replace(true);
    }
}

struct TcpReader {
    inner: Arc<Inner>,
    peers: Mutex<HashMap<u32, Arc<Peer>>>,
    next_req: AtomicU64,
}

impl Drop for TcpReader {
    fn drop(&mut self) {
        for (_, p) in self.peers.lock().expect("reader lock").drain() {
            p.fail("reader dropped".into());
        }
    }
}

async fn peer_writer(
    peer: Arc<Peer>,
    mut wr: OwnedWriteHalf,
    mut requests: mpsc::UnboundedReceiver<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
) {
    let work = async {
        let mut buf = Vec::new();
        while let Some(first) = requests.recv().await {
            buf.clear();
            buf.extend_from_slice(&first);
            while let Ok(more) = requests.try_recv() {
                buf.extend_from_slice(&more);
            }
            if let Err(e) = wr.write_all(&buf).await {
                peer.fail(format!(
                    "sending read requests to the region server at {} failed: {e}",
                    peer.addr
                ));
                return;
            }
        }
    };
    tokio::select! {
        _ = stopped(&mut stop) => {}
        _ = work => {}
    }
    let _ = wr.shutdown().await;
}

async fn peer_reader(peer: Arc<Peer>, rd: OwnedReadHalf, mut stop: watch::Receiver<bool>) {
    let reason = tokio::select! {
        _ = stopped(&mut stop) => return,
        r = read_answers(&peer, rd) => r,
    };
    peer.fail(reason);
}

async fn read_answers(peer: &Peer, rd: OwnedReadHalf) -> String {
    let mut rd = BufReader::with_capacity(ANSWER_BUF, rd);
    let mut hdr = [0u8; ANS_LEN];
    loop {
        if let Err(e) = rd.read_exact(&mut hdr).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("the region server at {} closed the connection", peer.addr)
            } else {
                format!(
                    "reading from the region server at {} failed: {e}",
                    peer.addr
                )
            };
        }
        let AnswerHeader { id, status, len } = AnswerHeader::decode(&hdr);
        let p = peer.state.lock().expect("peer lock").pending.remove(&id);
        if status != ST_OK {
            if let Some(p) = p {
                p.batch.complete(p.idx, Err(ReadError::OutOfBounds));
            }
            continue;
        }
        match p {
            Some(mut p) => {
                if p.len != len {
                    p.batch
                        .complete(p.idx, Err(ReadError::Unreachable("protocol error".into())));
                    return format!(
                        "region server at {} answered {len} bytes for a read of {}",
                        peer.addr, p.len
                    );
                }
                let mut left = len as u64;
                while left > 0 {
                    match (&mut rd).take(left).read_buf(&mut p.buf).await {
                        Ok(0) => {
                            let reason =
                                format!("the region server at {} closed the connection", peer.addr);
                            p.batch
                                .complete(p.idx, Err(ReadError::Unreachable(reason.clone())));
                            return reason;
                        }
                        Ok(n) => left -= n as u64,
                        Err(e) => {
                            let reason = format!(
                                "reading from the region server at {} failed: {e}",
                                peer.addr
                            );
                            p.batch
                                .complete(p.idx, Err(ReadError::Unreachable(reason.clone())));
                            return reason;
                        }
                    }
                }
                p.batch.complete(p.idx, Ok(p.buf));
            }
            None => {
                // Its read timed out (or was detached): skip the bytes.
                let mut skip = (&mut rd).take(len as u64);
                match tokio::io::copy(&mut skip, &mut tokio::io::sink()).await {
                    Ok(n) if n == len as u64 => {}
                    Ok(_) => {
                        return format!("the region server at {} closed the connection", peer.addr)
                    }
                    Err(e) => {
                        return format!(
                            "reading from the region server at {} failed: {e}",
                            peer.addr
                        )
                    }
                }
            }
        }
    }
}

impl TcpReader {
    fn connect_peer(&self, info: &RegionInfo) -> anyhow::Result<Arc<Peer>> {
        let addr = &info.addr;
        let mut s = connect_std(addr).context("attaching a region")?;
        use std::io::{Read, Write};
        s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
        s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
        let mut welcome = [0u8; rw::WELCOME_LEN];
        s.write_all(&rw::hello(info.region))
            .and_then(|_| s.read_exact(&mut welcome))
            .with_context(|| format!("greeting the region server at `{addr}`"))?;
        let (status, len) =
            rw::parse_welcome(&welcome).map_err(|e| anyhow::anyhow!("`{addr}`: {e}"))?;
        if status != ST_OK {
            anyhow::bail!(
                "the region server at `{addr}` does not serve region {}",
                info.region
            );
        }
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
        s.set_nonblocking(true)?;
        let stream = {
            let _g = self.inner.handle.enter();
            TcpStream::from_std(s).with_context(|| format!("registering the socket to `{addr}`"))?
        };
        let (rd, wr) = stream.into_split();
        let (requests, req_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let peer = Arc::new(Peer {
            addr: addr.clone(),
            region_len: len,
            state: Mutex::new(PeerState::default()),
            requests,
            stop,
        });
        self.inner
            .handle
            .spawn(peer_writer(peer.clone(), wr, req_rx, stop_rx.clone()));
        self.inner
            .handle
            .spawn(peer_reader(peer.clone(), rd, stop_rx));
        Ok(peer)
    }
}

impl RegionReader for TcpReader {
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()> {
        let p = self.connect_peer(info)?;
        let old = self.peers.lock().expect("reader lock").insert(peer, p);
        if let Some(old) = old {
            old.fail(format!("peer {peer} was attached again"));
        }
        Ok(())
    }

    fn detach(&self, peer: u32) {
        let old = self.peers.lock().expect("reader lock").remove(&peer);
        if let Some(old) = old {
            old.fail(format!("peer {peer} was detached"));
        }
    }

    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<Result<Vec<u8>, ReadError>> {
        // None: no deadline (a timeout too long to add to now).
        let deadline = Instant::now().checked_add(timeout);
        let batch = Arc::new(Batch {
            st: Mutex::new(BatchState {
                out: (0..reqs.len()).map(|_| None).collect(),
                left: 0,
                taken: false,
            }),
            cv: std::sync::Condvar::new(),
        });
        // The peers asked, each with its connection, its encoded requests and the
        // ids sent to it.
        type Group = (u32, Option<Arc<Peer>>, Vec<u8>, Vec<u64>);
        let mut groups: Vec<Group> = Vec::new();
        {
            let peers = self.peers.lock().expect("reader lock");
            for r in reqs {
                if !groups.iter().any(|g| g.0 == r.peer) {
                    groups.push((r.peer, peers.get(&r.peer).cloned(), Vec::new(), Vec::new()));
                }
            }
        }
        for (g_peer, g_conn, bytes, ids) in groups.iter_mut() {
            let mine = reqs.iter().enumerate().filter(|(_, r)| r.peer == *g_peer);
            let Some(conn) = g_conn else {
                let mut b = batch.st.lock().expect("batch lock");
                for (i, _) in mine {
                    b.out[i] = Some(Err(ReadError::Unreachable(format!(
                        "peer {g_peer} not attached"
                    ))));
                }
                continue;
            };
            let mut st = conn.state.lock().expect("peer lock");
            for (i, r) in mine {
                let early = if let Some(why) = &st.broken {
                    Some(ReadError::Unreachable(why.clone()))
                } else if r
                    .offset
                    .checked_add(r.len as u64)
                    .is_none_or(|e| e > conn.region_len)
                {
                    Some(ReadError::OutOfBounds)
                } else {
                    None
                };
                if let Some(e) = early {
                    batch.st.lock().expect("batch lock").out[i] = Some(Err(e));
                    continue;
                }
                let id = self.next_req.fetch_add(1, Ordering::Relaxed);
                batch.st.lock().expect("batch lock").left += 1;
                st.pending.insert(
                    id,
                    Pending {
                        idx: i,
                        len: r.len,
                        buf: Vec::with_capacity(r.len as usize),
                        batch: batch.clone(),
                    },
                );
                let req = Request {
                    id,
                    offset: r.offset,
                    len: r.len,
                };
                bytes.extend_from_slice(&req.encode());
                ids.push(id);
            }
            drop(st);
            if !bytes.is_empty() && conn.requests.send(std::mem::take(bytes)).is_err() {
                conn.fail(format!(
                    "the connection to the region server at {} is gone",
                    conn.addr
                ));
            }
        }
        let mut st = batch.st.lock().expect("batch lock");
        while st.left > 0 {
            match deadline {
                None => st = batch.cv.wait(st).expect("batch lock"),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    st = batch.cv.wait_timeout(st, d - now).expect("batch lock").0;
                }
            }
        }
        if st.left > 0 {
            // Timed out: forget the reads still out (their answers are skipped).
            drop(st);
            for (_, conn, _, ids) in &groups {
                if let Some(conn) = conn {
                    let mut ps = conn.state.lock().expect("peer lock");
                    for id in ids {
                        ps.pending.remove(id);
                    }
                }
            }
            st = batch.st.lock().expect("batch lock");
        }
        st.taken = true;
        std::mem::take(&mut st.out)
            .into_iter()
            .map(|r| r.unwrap_or(Err(ReadError::Timeout)))
            .collect()
    }
}

// ---------------------------------------------------------------------------

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        let l = bind_std(addr, "listener")?;
        let local = l
            .local_addr()
            .with_context(|| format!("the address of the listener at `{addr}`"))?;
        let l = {
            let _g = self.inner.handle.enter();
            tokio::net::TcpListener::from_std(l)
                .with_context(|| format!("registering the listener at `{addr}`"))?
        };
        let task = self
            .inner
            .handle
            .spawn(accept_loop(Arc::downgrade(&self.inner), l, events));
        Ok(Box::new(TcpListenerHandle {
            addr: local.to_string(),
            task,
            _inner: self.inner.clone(),
        }))
    }

    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        let s = connect_std(addr)?;
        s.set_nonblocking(true)
            .with_context(|| format!("making the connection to `{addr}` non-blocking"))?;
        let stream = {
            let _g = self.inner.handle.enter();
            TcpStream::from_std(s)
                .with_context(|| format!("registering the connection to `{addr}`"))?
        };
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| addr.to_string());
        let (conn, start) = new_conn(&self.inner, stream, peer, events);
        start();
        Ok(conn)
    }

    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        let addr = if addr.is_empty() { "127.0.0.1:0" } else { addr };
        let l = bind_std(addr, "region server")?;
        let local = l
            .local_addr()
            .with_context(|| format!("the address of the region server at `{addr}`"))?;
        let l = {
            let _g = self.inner.handle.enter();
            tokio::net::TcpListener::from_std(l)
                .with_context(|| format!("registering the region server at `{addr}`"))?
        };
        let info = RegionInfo {
            addr: local.to_string(),
            region: region.id(),
            len: region.len(),
            rkey: 0,
            base: 0,
        };
        let (stop, stop_rx) = watch::channel(());
        let live = Arc::new(());
        self.inner
            .handle
            .spawn(region_accept(l, region, stop_rx, live.clone()));
        Ok(Box::new(TcpRegionServer {
            info,
            stop: Some(stop),
            live,
            _inner: self.inner.clone(),
        }))
    }

    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        Ok(Arc::new(TcpReader {
            inner: self.inner.clone(),
            peers: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-process transport's test scenario, over loopback TCP.
    #[test]
    fn messages_regions_and_close() {
        crate::transport::conformance(&Tcp::new().unwrap(), "127.0.0.1:0", "127.0.0.1:0");
    }

    #[test]
    fn bind_and_connect_errors_name_the_address() {
        let tr = Tcp::new().unwrap();
        let (tx, _rx) = crate::transport::event_channel();
        let l = tr.listen("127.0.0.1:0", tx.clone()).unwrap();
        let e = tr.listen(&l.local_addr(), tx.clone()).err().unwrap();
        assert!(format!("{e:#}").contains(&l.local_addr()), "{e:#}");
        let addr = l.local_addr();
        drop(l);
        // Let the accept task see the abort and close the socket.
        let mut refused = None;
        for _ in 0..100 {
            match tr.connect(&addr, tx.clone()) {
                Err(e) => {
                    refused = Some(e);
                    break;
                }
                Ok(c) => {
                    c.close("test");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        let e = refused.expect("a dropped listener stops accepting");
        assert!(format!("{e:#}").contains(&addr), "{e:#}");
        let e = tr.listen("not an address", tx).err().unwrap();
        assert!(format!("{e:#}").contains("not an address"), "{e:#}");
    }
}
