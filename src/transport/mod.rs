//! Transports: how Fermata's processes talk. One interface, two halves:
//!
//! * **Control** (two-sided): [`Conn`]s carrying [`Msg`]s, opened with
//!   [`Transport::connect`] or accepted by a [`Transport::listen`]er. Everything a
//!   connection has to say (an arrived message, its end) comes as an [`Event`] on
//!   the crossbeam channel given when it was opened, so a node runs one event loop.
//! * **Data** (one-sided): a frontend keeps its clients' input bytes in a
//!   [`Region`] and exposes it with [`Transport::serve_region`]; backends read
//!   slices of it with a [`RegionReader`] and the frontend's application threads
//!   are not in the loop (RDMA READ; over TCP a server task that only copies bytes).
//!
//! Implementations: [`inproc`] (one process, channels and shared memory), [`tcp`]
//! (tokio, loopback or LAN) and `rdma` (ibverbs, behind the `rdma` cargo feature).

pub mod auth;
pub mod inproc;
#[cfg(feature = "rdma")]
pub mod rdma;
#[cfg(not(feature = "rdma"))]
pub mod rdma_stub;
pub mod rdma_wire;
pub mod region;
pub mod region_wire;
pub mod secure_io;
pub mod tcp;

pub use region::{CapSource, InputRef, Region, SlotHeader, PROBE_CAP, SLOT_HEADER};

use crate::wire::{Msg, RegionInfo};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A connection's id, unique within its transport instance.
pub type ConnId = u64;

/// Something that happened on a connection.
pub enum Event {
    /// A listener accepted a connection (its messages follow as `Msg`).
    Accepted(Arc<dyn Conn>),
    /// A message arrived on `conn`.
    Msg(ConnId, Msg),
    /// `conn` ended: the peer closed it, it broke, or a frame could not be decoded.
    /// Sent exactly once per connection; nothing follows it.
    Closed(ConnId, String),
}

/// Most events a node's event channel holds. A transport that finds it full
/// waits (its reader stops reading, so TCP flow control slows the peer down) and
/// counts the wait ([`EventTx::full_count`]); events are never dropped.
pub const EVENTS_MAX: usize = 65_536;

/// Where a connection's events go: a bounded channel ([`event_channel`]) and the
/// count of the times it was found full.
#[derive(Clone, Debug)]
pub struct EventTx {
    tx: Sender<Event>,
    full: Arc<AtomicU64>,
}

/// The receiver of an event channel is gone (the node's loop ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// A node's event channel, bounded at [`EVENTS_MAX`].
pub fn event_channel() -> (EventTx, Receiver<Event>) {
    let (tx, rx) = crossbeam_channel::bounded(EVENTS_MAX);
    (EventTx::from(tx), rx)
}

impl From<Sender<Event>> for EventTx {
    fn from(tx: Sender<Event>) -> EventTx {
        EventTx {
            tx,
            full: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl EventTx {
    /// Pushes an event, waiting while the channel is full (the wait is counted).
    /// For threads that may block.
    pub fn send(&self, ev: Event) -> Result<(), Gone> {
        match self.try_send(ev) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(_)) => Err(Gone),
            Err(TrySendError::Full(ev)) => self.tx.send(ev).map_err(|_| Gone),
        }
    }

    /// Pushes an event if there is room (a full channel is counted). The event
    /// comes back in the error, for the caller to try again.
    #[allow(clippy::result_large_err)]
    pub fn try_send(&self, ev: Event) -> Result<(), TrySendError<Event>> {
        let r = self.tx.try_send(ev);
        if let Err(TrySendError::Full(_)) = &r {
            self.full.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Pushes an event without ever blocking the caller: when the channel is full
    /// (counted), a short-lived thread waits for room. For the rare events a node's
    /// own loop may cause (a connection's `Closed`, a listener's `Accepted`), which
    /// must not be lost and must not wait on the loop itself.
    pub fn send_detached(&self, ev: Event) -> Result<(), Gone> {
        match self.try_send(ev) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(_)) => Err(Gone),
            Err(TrySendError::Full(ev)) => {
                let tx = self.tx.clone();
                let slot = Arc::new(std::sync::Mutex::new(Some(ev)));
                let theirs = slot.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("event-wait".into())
                        .spawn(move || {
                            if let Some(ev) = theirs.lock().expect("lock").take() {
                                let _ = tx.send(ev);
                            }
                        });
                // Without a thread, wait here rather than lose the event.
                let left = spawned.is_err().then(|| slot.lock().expect("lock").take());
                match left.flatten() {
                    Some(ev) => self.tx.send(ev).map_err(|_| Gone),
                    None => Ok(()),
                }
            }
        }
    }

    /// Times the channel was found full.
    pub fn full_count(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }

    /// The shared counter behind [`EventTx::full_count`] (for metrics).
    pub fn full_counter(&self) -> Arc<AtomicU64> {
        self.full.clone()
    }
}

/// Errors of the control half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The connection is closed (the reason it closed).
    Closed(String),
    /// The send queue is full (the peer does not keep up).
    Full,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Closed(r) => write!(f, "connection closed: {r}"),
            SendError::Full => write!(f, "send queue full"),
        }
    }
}
impl std::error::Error for SendError {}

/// One control connection.
pub trait Conn: Send + Sync {
    fn id(&self) -> ConnId;
    /// The peer's address, for logs.
    fn peer(&self) -> String;
    /// Queues `msg` for sending; never waits for the network. Messages on one
    /// connection arrive in the order sent.
    fn send(&self, msg: Msg) -> Result<(), SendError>;
    /// Closes the connection; the peer sees it closed with `reason` logged locally.
    /// Our own event channel gets `Closed` too (once).
    fn close(&self, reason: &str);
}

/// A listening endpoint; dropping it stops accepting.
pub trait Listener: Send {
    /// The address peers connect to (with the port filled in when 0 was asked).
    fn local_addr(&self) -> String;
}

/// A region exposed for one-sided reads; dropping it stops serving.
pub trait RegionServer: Send {
    /// What readers need to attach.
    fn info(&self) -> RegionInfo;
}

/// Why one read failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The peer is not attached, or its region server is gone.
    Unreachable(String),
    /// Out of the region's bounds.
    OutOfBounds,
    /// No answer before the timeout.
    Timeout,
    /// Refused by the region's owner: the capability does not open a live slot
    /// there (the request ended, or the reader was not given the task).
    Denied,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Unreachable(r) => write!(f, "region unreachable: {r}"),
            ReadError::OutOfBounds => write!(f, "read out of the region's bounds"),
            ReadError::Timeout => write!(f, "read timed out"),
            ReadError::Denied => write!(
                f,
                "read refused: no live slot there opens with this capability"
            ),
        }
    }
}
impl std::error::Error for ReadError {}

/// One read: `len` bytes at `offset` of peer `peer`'s region, with the task's
/// capability `cap` ([`Region::read_slot`]; [`region::PROBE_CAP`] for a probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReq {
    pub peer: u32,
    pub offset: u64,
    pub len: u32,
    pub cap: u64,
}

/// What [`RegionReader::read_many_visit`] hands each slot (or why its read
/// failed) to, with the request's index.
pub type SlotVisitor<'a> = dyn FnMut(usize, Result<&[u8], ReadError>) + 'a;

/// Reads slices of remote regions (a backend has one).
pub trait RegionReader: Send + Sync {
    /// Makes `peer`'s region readable (connects lazily or at once).
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()>;
    /// Forgets `peer`; later reads of it fail as `Unreachable`.
    fn detach(&self, peer: u32);
    /// Reads every request, concurrently where the transport can; one result per
    /// request, in order. A request not answered within `timeout` fails as
    /// `Timeout`; one failed read does not hold back the others.
    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<Result<Vec<u8>, ReadError>>;
    /// [`Self::read_many`] into buffers the caller recycles (`bufs`, taken from
    /// the end; a transport that cannot use them allocates). Large inputs read
    /// into fresh allocations page-fault on every byte of every read.
    fn read_many_into(
        &self,
        reqs: &[ReadReq],
        timeout: Duration,
        bufs: Vec<Vec<u8>>,
    ) -> Vec<Result<Vec<u8>, ReadError>> {
        let _ = bufs;
        self.read_many(reqs, timeout)
    }
    /// Reads every request and hands each one's slot (or why it failed) to
    /// `f` with its index, in order. A transport that can reads them where
    /// they lie (in process: the frontend's region, under its lock), so the
    /// caller copies each input once, to where it is to go, and returns true;
    /// the default reads them into buffers first ([`Self::read_many_into`],
    /// one more copy) and returns false. Either way the buffers come back
    /// (`bufs`, or those read into) for reuse.
    fn read_many_visit(
        &self,
        reqs: &[ReadReq],
        timeout: Duration,
        bufs: Vec<Vec<u8>>,
        f: &mut SlotVisitor<'_>,
    ) -> (bool, Vec<Vec<u8>>) {
        let got = self.read_many_into(reqs, timeout, bufs);
        let mut spent = Vec::with_capacity(got.len());
        for (i, r) in got.into_iter().enumerate() {
            match r {
                Ok(b) => {
                    f(i, Ok(&b));
                    spent.push(b);
                }
                Err(e) => f(i, Err(e)),
            }
        }
        (false, spent)
    }
    /// Reads every request's slot into `rows[k]`, its header apart: the
    /// slot's first [`SLOT_HEADER`] bytes come back (for the caller to
    /// check), the rest lands in the row, whose length must be `reqs[k].len
    /// - SLOT_HEADER` (a request of another length is not read: it fails as
    /// `OutOfBounds`). Where a read failed, its row's bytes are unspecified.
    /// A transport that can puts each payload straight into its row (in
    /// process: copied out of the frontend's region; over TCP: the channel's
    /// records read and opened there) and returns true; the default reads
    /// each slot into a buffer first ([`Self::read_many_visit`]), one copy
    /// more, and returns false. Once it returns, nothing writes the rows.
    /// The buffers come back (`bufs`, or those read into) for reuse.
    fn read_many_rows(
        &self,
        reqs: &[ReadReq],
        timeout: Duration,
        bufs: Vec<Vec<u8>>,
        rows: &mut [&mut [u8]],
    ) -> (Vec<RowRead>, bool, Vec<Vec<u8>>) {
        assert_eq!(reqs.len(), rows.len(), "a row per request");
        let mut out: Vec<RowRead> = vec![Err(ReadError::OutOfBounds); reqs.len()];
        let fit: Vec<usize> = (0..reqs.len())
            .filter(|&k| fits_row(&reqs[k], rows[k].len()))
            .collect();
        let asked: Vec<ReadReq> = fit.iter().map(|&k| reqs[k]).collect();
        let (in_place, back) = self.read_many_visit(&asked, timeout, bufs, &mut |j, r| {
            let k = fit[j];
            out[k] = r.and_then(|slot| land_slot(slot, rows[k]));
        });
        (out, in_place, back)
    }
}

/// What [`RegionReader::read_many_rows`] gives for one request: its slot's
/// header (the payload is in the request's row), or why its read failed.
pub type RowRead = Result<[u8; SLOT_HEADER], ReadError>;

/// Whether `r` reads a slot whose payload is `row` bytes.
pub fn fits_row(r: &ReadReq, row: usize) -> bool {
    r.len as usize == SLOT_HEADER + row
}

/// Splits a slot read whole into its header (returned) and its payload
/// (copied into `row`).
fn land_slot(slot: &[u8], row: &mut [u8]) -> RowRead {
    if slot.len() != SLOT_HEADER + row.len() {
        return Err(ReadError::OutOfBounds);
    }
    let (head, payload) = slot.split_at(SLOT_HEADER);
    row.copy_from_slice(payload);
    Ok(head.try_into().expect("SLOT_HEADER bytes"))
}

/// A transport: makes control connections and exposes / reads regions.
pub trait Transport: Send + Sync {
    /// "inproc", "tcp" or "rdma".
    fn name(&self) -> &'static str;
    /// Listens at `addr` (TCP: "host:port", port 0 = any; in-process: a name).
    /// Accepted connections come as [`Event::Accepted`] on `events`, then their
    /// messages and end on the same channel.
    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>>;
    /// Connects to a listener; the connection's events go to `events`.
    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>>;
    /// Exposes `region` for one-sided reads at `addr` (TCP: "host:port"; port 0 =
    /// any).
    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>>;
    /// A reader for other nodes' regions.
    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>>;
}

/// Makes the transport named `name` ("inproc", "tcp" or "rdma"), without peer
/// authentication (see [`by_name_keyed`]).
pub fn by_name(name: &str) -> anyhow::Result<Arc<dyn Transport>> {
    by_name_keyed(name, None)
}

/// Makes the transport named `name`; with `key`, every connection it makes or
/// accepts opens with the cluster handshake ([`auth`]). The in-process
/// transport never leaves the process and needs none.
pub fn by_name_keyed(
    name: &str,
    key: Option<auth::ClusterKey>,
) -> anyhow::Result<Arc<dyn Transport>> {
    match name {
        "inproc" => Ok(Arc::new(inproc::InProc::global())),
        "tcp" => Ok(Arc::new(tcp::Tcp::keyed(key)?)),
        #[cfg(feature = "rdma")]
        "rdma" => Ok(Arc::new(rdma::Rdma::open_keyed(None, key)?)),
        #[cfg(not(feature = "rdma"))]
        "rdma" => {
            let _ = key;
            Err(rdma_stub::not_built())
        }
        other => anyhow::bail!("unknown transport `{other}` (expected inproc, tcp or rdma)"),
    }
}

/// The behaviour every transport must have, run by each implementation's tests:
/// messages in order, `Closed` once on both sides, sends after close refused,
/// region reads (a slot, an unattached peer, out of bounds) and a region server
/// that goes away.
#[cfg(test)]
pub(crate) fn conformance(tr: &dyn Transport, listen: &str, region_at: &str) {
    let t = Duration::from_secs(5);
    let (stx, srx) = crate::transport::event_channel();
    let l = tr.listen(listen, stx).unwrap();
    assert!(
        !l.local_addr().ends_with(":0"),
        "the real address is reported"
    );
    let (ctx, crx) = crate::transport::event_channel();
    let c = tr.connect(&l.local_addr(), ctx).unwrap();
    let Event::Accepted(s) = srx.recv_timeout(t).unwrap() else {
        panic!("accept")
    };
    c.send(Msg::ListModels).unwrap();
    c.send(Msg::Unregister { reason: "x".into() }).unwrap();
    match srx.recv_timeout(t).unwrap() {
        Event::Msg(id, Msg::ListModels) => assert_eq!(id, s.id()),
        _ => panic!("first message"),
    }
    assert!(matches!(
        srx.recv_timeout(t).unwrap(),
        Event::Msg(_, Msg::Unregister { .. })
    ));
    s.close("bye");
    assert!(matches!(srx.recv_timeout(t).unwrap(), Event::Closed(id, _) if id == s.id()));
    assert!(matches!(crx.recv_timeout(t).unwrap(), Event::Closed(id, _) if id == c.id()));
    assert!(c.send(Msg::ListModels).is_err());

    let reg = Arc::new(Region::new(1, 1 << 16).unwrap());
    const CAP: u64 = 0x5eed;
    let r = reg.put(5, CAP, b"hello").unwrap();
    let gone = reg.put(6, CAP + 1, b"ended").unwrap();
    reg.release(gone);
    let srv = tr.serve_region(reg.clone(), region_at).unwrap();
    let rd = tr.reader().unwrap();
    rd.attach(3, &srv.info()).unwrap();
    let req = |peer, offset, len, cap| ReadReq {
        peer,
        offset,
        len,
        cap,
    };
    let out = rd.read_many(
        &[
            req(3, r.offset, r.len, CAP),
            req(4, 0, 1, CAP),
            req(3, 1 << 16, 1, CAP),
            // Another capability, a read past the slot, a slot whose request
            // ended: refused. A probe: zeros, nobody's input.
            req(3, r.offset, r.len, CAP + 7),
            req(3, r.offset, r.len + 64, CAP),
            req(3, gone.offset, gone.len, CAP + 1),
            req(3, r.offset, r.len, PROBE_CAP),
        ],
        t,
    );
    assert_eq!(
        SlotHeader::check(out[0].as_ref().unwrap(), 5, CAP).unwrap(),
        b"hello"
    );
    assert!(matches!(out[1], Err(ReadError::Unreachable(_))));
    assert_eq!(out[2], Err(ReadError::OutOfBounds));
    assert_eq!(out[3], Err(ReadError::Denied));
    assert_eq!(out[4], Err(ReadError::Denied));
    assert_eq!(out[5], Err(ReadError::Denied));
    assert_eq!(out[6].as_deref(), Ok(&vec![0u8; r.len as usize][..]));
    drop(srv);
    let out = rd.read_many(&[req(3, r.offset, r.len, CAP)], t);
    assert!(matches!(out[0], Err(ReadError::Unreachable(_))), "{out:?}");
}
