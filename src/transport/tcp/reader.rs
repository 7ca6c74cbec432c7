//! The pull side: [`TcpReader`], the [`RegionReader`] of the TCP transport. It
//! keeps a few [`Peer`] connections per attached region ([`Lanes`]) and runs each
//! `read_many` as a [`Batch`]: requests are checked, split over a peer's
//! connections (by bytes, [`split`]), registered as pending and sent in one write
//! per connection, and the caller sleeps on a condition variable until the last
//! answer or the timeout (one wake-up per call).

use super::options::STRIPE_MIN;
use super::reader_peer::{Dest, Peer, PeerState, Pending, Row};
use super::runtime::Inner;
use crate::transport::region_wire::Request;
use crate::transport::{fits_row, ReadError, ReadReq, RegionReader, RowRead, SLOT_HEADER};
use crate::wire::RegionInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type ReadResult = Result<Vec<u8>, ReadError>;

/// One `read_many` call: its results, filled in by the connections' reader tasks;
/// the caller sleeps until the last one (one wake-up per call, not per read).
pub(super) struct Batch {
    st: Mutex<BatchState>,
    cv: Condvar,
}

struct BatchState {
    out: Vec<Option<ReadResult>>,
    /// Reads sent and not answered yet.
    left: usize,
    /// The caller has taken the results (timed out): later answers are dropped.
    taken: bool,
    /// Rows of the caller's memory that reads of this batch still hold
    /// ([`Row`]).
    rows_held: usize,
}

impl Batch {
    fn new(n: usize) -> Arc<Batch> {
        Arc::new(Batch {
            st: Mutex::new(BatchState {
                out: (0..n).map(|_| None).collect(),
                left: 0,
                taken: false,
                rows_held: 0,
            }),
            cv: Condvar::new(),
        })
    }

    /// The answer to read `idx`, sent and counted in `left` before.
    pub(super) fn complete(&self, idx: usize, r: ReadResult) {
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

    /// The result of read `idx`, known without sending it.
    fn settle(&self, idx: usize, r: ReadResult) {
        self.st.lock().expect("batch lock").out[idx] = Some(r);
    }

    /// Counts one more read sent.
    fn expect_one(&self) {
        self.st.lock().expect("batch lock").left += 1;
    }

    /// Sleeps until every read sent was answered or `deadline` (None: none)
    /// passed; whether they all were.
    fn wait(&self, deadline: Option<Instant>) -> bool {
        self.wait_for(deadline, |st| st.left == 0)
    }

    /// Sleeps until `done` holds or `deadline` (None: none) passed; whether
    /// it holds.
    fn wait_for(&self, deadline: Option<Instant>, done: impl Fn(&BatchState) -> bool) -> bool {
        let mut st = self.st.lock().expect("batch lock");
        while !done(&st) {
            match deadline {
                None => st = self.cv.wait(st).expect("batch lock"),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    st = self.cv.wait_timeout(st, d - now).expect("batch lock").0;
                }
            }
        }
        done(&st)
    }

    /// A read of this batch holds a row ([`Row::new`]).
    pub(super) fn hold_row(&self) {
        self.st.lock().expect("batch lock").rows_held += 1;
    }

    /// A read of this batch let its row go (the [`Row`] dropped).
    pub(super) fn release_row(&self) {
        let mut st = self.st.lock().expect("batch lock");
        st.rows_held -= 1;
        if st.rows_held == 0 {
            self.cv.notify_one();
        }
    }

    /// Sleeps until no read holds a row or `deadline` (None: none) passed;
    /// whether none does.
    fn wait_rows(&self, deadline: Option<Instant>) -> bool {
        self.wait_for(deadline, |st| st.rows_held == 0)
    }

    /// Takes the results (later answers are dropped); reads without one timed out.
    fn take(&self) -> Vec<ReadResult> {
        let mut st = self.st.lock().expect("batch lock");
        st.taken = true;
        std::mem::take(&mut st.out)
            .into_iter()
            .map(|r| r.unwrap_or(Err(ReadError::Timeout)))
            .collect()
    }
}

/// The connections to one attached peer. They share one fate: once one is
/// broken, every read of the peer fails until new ones replace them (the
/// reader dials the peer again, [`TcpReader::redial`]) or it is attached
/// again.
pub(super) struct Lanes {
    conns: Vec<Arc<Peer>>,
    /// The connection the next small `read_many` goes to.
    next: AtomicUsize,
    /// The region they read, to dial it again.
    info: RegionInfo,
    /// When the peer was last dialled again from these (None: never), and
    /// whether a dial is under way.
    redial: Mutex<(Option<Instant>, bool)>,
}

/// The least time between two dials of a peer whose connections broke: a
/// region server that is gone for good (its frontend stopped; the scheduler
/// soon detaches it) is asked at this pace.
const REDIAL_EVERY: Duration = Duration::from_secs(1);

impl Lanes {
    /// `n` connections to the region server `info` names (all or none).
    fn connect(inner: &Inner, info: &RegionInfo, n: usize) -> anyhow::Result<Lanes> {
        let mut conns: Vec<Arc<Peer>> = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            match Peer::connect(inner, info) {
                Ok(p) => conns.push(p),
                Err(e) => {
                    for c in &conns {
                        c.fail("another connection to the peer failed".into());
                    }
                    return Err(e);
                }
            }
        }
        Ok(Lanes {
            conns,
            next: AtomicUsize::new(0),
            info: info.clone(),
            redial: Mutex::new((None, false)),
        })
    }

    fn fail(&self, reason: String) {
        for c in &self.conns {
            c.fail(reason.clone());
        }
    }

    /// Why one of the connections is unusable, if one is.
    fn broken(&self) -> Option<String> {
        self.conns
            .iter()
            .find_map(|c| c.state.lock().expect("peer lock").broken.clone())
    }
}

/// Which of `lanes` connections each request goes to: every one to a single
/// connection (`turn`) when they ask for less than [`STRIPE_MIN`] bytes in all,
/// else runs of consecutive requests of about `total / lanes` bytes each, in
/// order (so a connection's answers stay in their requests' order).
fn split(lens: &[u32], lanes: usize, turn: usize) -> Vec<usize> {
    let total: u64 = lens.iter().map(|&l| l as u64).sum();
    if lanes <= 1 || total < STRIPE_MIN {
        return vec![turn % lanes.max(1); lens.len()];
    }
    let mut out = Vec::with_capacity(lens.len());
    let mut before = 0u64;
    for &l in lens {
        // The lane whose share holds this request's middle byte.
        let mid = before + l as u64 / 2;
        out.push(((mid * lanes as u64 / total) as usize).min(lanes - 1));
        before += l as u64;
    }
    out
}

pub(super) struct TcpReader {
    inner: Arc<Inner>,
    peers: Arc<Mutex<HashMap<u32, Arc<Lanes>>>>,
    next_req: AtomicU64,
}

impl Drop for TcpReader {
    fn drop(&mut self) {
        for (_, p) in self.peers.lock().expect("reader lock").drain() {
            p.fail("reader dropped".into());
        }
    }
}

/// The requests of one `read_many` sent on one connection.
struct Sent {
    conn: Arc<Peer>,
    ids: Vec<u64>,
}

impl TcpReader {
    pub(super) fn new(inner: Arc<Inner>) -> TcpReader {
        TcpReader {
            inner,
            peers: Arc::new(Mutex::new(HashMap::new())),
            next_req: AtomicU64::new(1),
        }
    }

    /// The peers `reqs` ask, in the order they first appear, each with its
    /// connections (None: not attached). A peer whose connections broke is
    /// dialled again meanwhile ([`Self::redial`]).
    fn peers_asked(&self, reqs: &[ReadReq]) -> Vec<(u32, Option<Arc<Lanes>>)> {
        let mut asked: Vec<(u32, Option<Arc<Lanes>>)> = Vec::new();
        {
            let peers = self.peers.lock().expect("reader lock");
            for r in reqs {
                if !asked.iter().any(|g| g.0 == r.peer) {
                    asked.push((r.peer, peers.get(&r.peer).cloned()));
                }
            }
        }
        for (peer, lanes) in &asked {
            if let Some(l) = lanes.as_ref().filter(|l| l.broken().is_some()) {
                self.redial(*peer, l);
            }
        }
        asked
    }

    /// Dials `peer`'s region server again, off the caller's thread, when
    /// its connections `old` broke (a reset, a stalled answer given up on)
    /// and no dial is under way or was made in the last [`REDIAL_EVERY`]:
    /// the new connections replace `old` unless the peer was detached or
    /// attached again meanwhile. The reads that found them broken fail;
    /// those after the new ones are in go through.
    fn redial(&self, peer: u32, old: &Arc<Lanes>) {
        {
            let mut r = old.redial.lock().expect("redial lock");
            let now = Instant::now();
            if r.1 || r.0.is_some_and(|t| now.duration_since(t) < REDIAL_EVERY) {
                return;
            }
            *r = (Some(now), true);
        }
        // Weak: a reader dropped meanwhile takes no new connections.
        let (inner, peers, old) = (self.inner.clone(), Arc::downgrade(&self.peers), old.clone());
        let why = old.broken().unwrap_or_default();
        tracing::warn!(peer, addr = %old.info.addr, reason = %why, "region reader: connections broken, dialling the region server again");
        self.inner.handle.spawn_blocking(move || {
            let n = old.conns.len();
            let dialled = Lanes::connect(&inner, &old.info, n);
            old.redial.lock().expect("redial lock").1 = false;
            match dialled {
                Ok(new) => {
                    let Some(peers) = peers.upgrade() else {
                        return new.fail("reader dropped".into());
                    };
                    let mut map = peers.lock().expect("reader lock");
                    match map.get(&peer) {
                        Some(cur) if Arc::ptr_eq(cur, &old) => {
                            tracing::info!(peer, addr = %old.info.addr, "region reader: connected to the region server again");
                            map.insert(peer, Arc::new(new));
                        }
                        _ => new.fail(format!("peer {peer} was detached or attached again")),
                    }
                }
                Err(e) => tracing::warn!(peer, addr = %old.info.addr, error = %format!("{e:#}"), "region reader: dialling the region server again failed"),
            }
        });
    }

    /// Sends `peer`'s requests of `reqs` over `lanes` (those that fail at once
    /// are settled in `batch`), each answer to be read where `dest` says
    /// (None: not sent, settled already); the ids sent on each connection,
    /// none when `peer` is not attached.
    fn send_to_peer(
        &self,
        reqs: &[ReadReq],
        peer: u32,
        lanes: Option<Arc<Lanes>>,
        batch: &Arc<Batch>,
        dest: &mut DestOf<'_>,
        sent: &mut Vec<Sent>,
    ) {
        let mine: Vec<(usize, &ReadReq)> = reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.peer == peer)
            .collect();
        let Some(lanes) = lanes else {
            for (i, _) in mine {
                let why = format!("peer {peer} not attached");
                batch.settle(i, Err(ReadError::Unreachable(why)));
            }
            return;
        };
        if let Some(why) = lanes.broken() {
            for (i, _) in mine {
                batch.settle(i, Err(ReadError::Unreachable(why.clone())));
            }
            return;
        }
        let lens: Vec<u32> = mine.iter().map(|(_, r)| r.len).collect();
        let turn = lanes.next.fetch_add(1, Ordering::Relaxed);
        let lane_of = split(&lens, lanes.conns.len(), turn);
        for (k, conn) in lanes.conns.iter().enumerate() {
            let part = mine
                .iter()
                .zip(&lane_of)
                .filter(|(_, &l)| l == k)
                .map(|(m, _)| *m);
            if let Some(s) = self.send_on(conn, part, batch, dest) {
                sent.push(s);
            }
        }
    }

    /// Sends `part` (read index, request) on `conn`, each answer to be read
    /// where `dest` says; the ids sent, None when nothing was.
    fn send_on<'a>(
        &self,
        conn: &Arc<Peer>,
        part: impl Iterator<Item = (usize, &'a ReadReq)>,
        batch: &Arc<Batch>,
        dest: &mut DestOf<'_>,
    ) -> Option<Sent> {
        let mut bytes = Vec::new();
        let mut ids = Vec::new();
        let mut st = conn.state.lock().expect("peer lock");
        for (i, r) in part {
            if let Some(e) = early_error(&st, conn, r) {
                batch.settle(i, Err(e));
                continue;
            }
            let Some(d) = dest(i, r) else {
                continue;
            };
            let id = self.next_req.fetch_add(1, Ordering::Relaxed);
            batch.expect_one();
            st.pending.insert(
                id,
                Pending {
                    idx: i,
                    len: r.len,
                    dest: d,
                    batch: batch.clone(),
                },
            );
            let req = Request {
                id,
                offset: r.offset,
                len: r.len,
                cap: r.cap,
            };
            bytes.extend_from_slice(&req.encode());
            ids.push(id);
        }
        drop(st);
        if ids.is_empty() {
            return None;
        }
        if conn.requests.send(bytes).is_err() {
            conn.fail(format!(
                "the connection to the region server at {} is gone",
                conn.addr
            ));
        }
        Some(Sent {
            conn: conn.clone(),
            ids,
        })
    }
}

/// Where the answer to read `i` (request `r`) is to go; None: it is not
/// sent (its result is settled already).
type DestOf<'a> = dyn FnMut(usize, &ReadReq) -> Option<Dest> + 'a;

/// An answer's buffer: one of `bufs` (from its end; a recycled buffer's
/// pages are mapped already, while reading a large input into a fresh
/// allocation faults on every page), or a new one. Its bytes are
/// initialized, and the answer is read over them.
fn buffer_from(bufs: &mut Vec<Vec<u8>>, len: usize) -> Dest {
    Dest::Buf(match bufs.pop() {
        Some(mut b) => {
            b.truncate(len);
            b.reserve(len - b.len());
            b
        }
        None => Vec::with_capacity(len),
    })
}

/// How long a call whose reads timed out waits for the answers already
/// being read into its rows before it breaks their connections (which
/// stops them). An answer under way normally ends within a millisecond; one
/// stalled this long means a broken peer, and a row must not be written
/// once the call has returned.
const ROW_GRACE: Duration = Duration::from_secs(1);

/// Why `r` fails before it is sent on `conn` (state `st`), if it does.
fn early_error(st: &PeerState, conn: &Peer, r: &ReadReq) -> Option<ReadError> {
    if let Some(why) = &st.broken {
        Some(ReadError::Unreachable(why.clone()))
    } else if r
        .offset
        .checked_add(r.len as u64)
        .is_none_or(|e| e > conn.region_len)
    {
        Some(ReadError::OutOfBounds)
    } else {
        None
    }
}

/// Forgets the reads still out after a timeout (their answers are skipped).
fn forget(sent: &[Sent]) {
    for s in sent {
        let mut ps = s.conn.state.lock().expect("peer lock");
        for id in &s.ids {
            ps.pending.remove(id);
        }
    }
}

impl RegionReader for TcpReader {
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()> {
        let p = Arc::new(Lanes::connect(&self.inner, info, self.inner.pull_streams)?);
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

    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<ReadResult> {
        self.read_many_into(reqs, timeout, Vec::new())
    }

    fn read_many_into(
        &self,
        reqs: &[ReadReq],
        timeout: Duration,
        mut bufs: Vec<Vec<u8>>,
    ) -> Vec<ReadResult> {
        // None: no deadline (a timeout too long to add to now).
        let deadline = Instant::now().checked_add(timeout);
        let batch = Batch::new(reqs.len());
        let mut sent: Vec<Sent> = Vec::new();
        let mut dest = |_: usize, r: &ReadReq| Some(buffer_from(&mut bufs, r.len as usize));
        for (peer, lanes) in self.peers_asked(reqs) {
            self.send_to_peer(reqs, peer, lanes, &batch, &mut dest, &mut sent);
        }
        if !batch.wait(deadline) {
            forget(&sent);
        }
        batch.take()
    }

    /// Each payload is read straight into its row: the channel reads each
    /// record of [`crate::transport::secure_io::DIRECT_FROM`] bytes or more
    /// into the row and opens it there (in the clear, the socket's bytes
    /// are read into it); the region server seals a large slot's header
    /// with its answer's, so the payload's records begin on their own.
    fn read_many_rows(
        &self,
        reqs: &[ReadReq],
        timeout: Duration,
        bufs: Vec<Vec<u8>>,
        rows: &mut [&mut [u8]],
    ) -> (Vec<RowRead>, bool, Vec<Vec<u8>>) {
        assert_eq!(reqs.len(), rows.len(), "a row per request");
        let deadline = Instant::now().checked_add(timeout);
        let batch = Batch::new(reqs.len());
        let mut sent: Vec<Sent> = Vec::new();
        {
            // Each row is lent to its read as a `Row`; those not sent are
            // dropped with this closure, before the wait for the rows.
            let mut lent: Vec<Option<Row>> = reqs
                .iter()
                .zip(rows.iter_mut())
                .enumerate()
                .map(|(i, (r, row))| {
                    if fits_row(r, row.len()) {
                        Some(Row::new(row, &batch))
                    } else {
                        batch.settle(i, Err(ReadError::OutOfBounds));
                        None
                    }
                })
                .collect();
            let mut dest = |i: usize, _: &ReadReq| lent[i].take().map(Dest::Row);
            for (peer, lanes) in self.peers_asked(reqs) {
                self.send_to_peer(reqs, peer, lanes, &batch, &mut dest, &mut sent);
            }
        }
        if !batch.wait(deadline) {
            forget(&sent);
        }
        // Answers under way into rows: the rows are the caller's again only
        // once no read holds one.
        if !batch.wait_rows(Instant::now().checked_add(ROW_GRACE)) {
            for s in &sent {
                s.conn.fail(format!(
                    "an answer from the region server at {} stalled past its read's timeout",
                    s.conn.addr
                ));
            }
            batch.wait_rows(None);
        }
        let out = batch
            .take()
            .into_iter()
            .map(|r| {
                r.and_then(|head| {
                    <[u8; SLOT_HEADER]>::try_from(head.as_slice())
                        .map_err(|_| ReadError::Unreachable("protocol error".into()))
                })
            })
            .collect();
        (out, true, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer whose connections broke is dialled again: the reads that find
    /// them broken fail, and soon the reads go through on new ones; a peer
    /// detached is not dialled.
    #[test]
    fn a_broken_peer_is_dialled_again() {
        use crate::transport::{Region, SlotHeader, Transport};
        let tr =
            super::super::Tcp::keyed(Some(crate::transport::auth::ClusterKey::generate())).unwrap();
        let reg = Arc::new(Region::new(1, 1 << 20).unwrap());
        let r = reg.put(3, 9, &[7u8; 100_000]).unwrap();
        let srv = tr.serve_region(reg.clone(), "127.0.0.1:0").unwrap();
        let rd = TcpReader::new(tr.inner.clone());
        rd.attach(0, &srv.info()).unwrap();
        let req = ReadReq {
            peer: 0,
            offset: r.offset,
            len: r.len,
            cap: 9,
        };
        let t = Duration::from_secs(5);
        let ok = |out: &[ReadResult]| {
            out[0]
                .as_ref()
                .is_ok_and(|s| SlotHeader::check(s, 3, 9) == Ok(&[7u8; 100_000][..]))
        };
        assert!(ok(&rd.read_many(&[req], t)));
        let old = rd.peers.lock().unwrap()[&0].clone();
        old.fail("cut for the test".into());
        let out = rd.read_many(&[req], t);
        assert!(
            matches!(&out[0], Err(ReadError::Unreachable(w)) if w.contains("cut")),
            "{out:?}"
        );
        let end = Instant::now() + Duration::from_secs(10);
        while !ok(&rd.read_many(&[req], t)) {
            assert!(Instant::now() < end, "never connected again");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!Arc::ptr_eq(&rd.peers.lock().unwrap()[&0], &old));
        // Detached: not dialled, the reads fail as not attached.
        rd.detach(0);
        std::thread::sleep(Duration::from_millis(100));
        let out = rd.read_many(&[req], t);
        assert!(
            matches!(&out[0], Err(ReadError::Unreachable(w)) if w.contains("not attached")),
            "{out:?}"
        );
        assert!(rd.peers.lock().unwrap().is_empty());
    }

    #[test]
    fn small_pulls_go_whole_to_one_connection_in_turn() {
        let lens = [150_544u32; 3];
        assert_eq!(split(&lens, 2, 0), vec![0, 0, 0]);
        assert_eq!(split(&lens, 2, 1), vec![1, 1, 1]);
        assert_eq!(split(&lens, 1, 7), vec![0, 0, 0]);
        assert_eq!(split(&[], 2, 3), Vec::<usize>::new());
    }

    #[test]
    fn large_pulls_split_into_runs_of_about_equal_bytes() {
        let lens = [602_128u32; 64];
        for lanes in [2usize, 3, 4] {
            let got = split(&lens, lanes, 5);
            assert!(
                got.windows(2).all(|w| w[0] <= w[1]),
                "runs in order: {got:?}"
            );
            for k in 0..lanes {
                let n = got.iter().filter(|&&l| l == k).count();
                assert!(n.abs_diff(64 / lanes) <= 1, "lane {k} of {lanes}: {n}");
            }
        }
        // Unequal inputs: bytes, not counts, are balanced.
        let lens = [4u32 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20];
        assert_eq!(split(&lens, 2, 0), vec![0, 1, 1, 1, 1]);
    }
}
