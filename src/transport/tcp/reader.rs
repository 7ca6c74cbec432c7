//! The pull side: [`TcpReader`], the [`RegionReader`] of the TCP transport. It
//! keeps one [`Peer`] connection per attached region and runs each `read_many`
//! as a [`Batch`]: requests are checked, registered as pending and sent to their
//! peers in one write each, and the caller sleeps on a condition variable until
//! the last answer or the timeout (one wake-up per call).

use super::reader_peer::{Peer, PeerState, Pending};
use super::runtime::Inner;
use crate::transport::region_wire::Request;
use crate::transport::{ReadError, ReadReq, RegionReader};
use crate::wire::RegionInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Batch {
    fn new(n: usize) -> Arc<Batch> {
        Arc::new(Batch {
            st: Mutex::new(BatchState {
                out: (0..n).map(|_| None).collect(),
                left: 0,
                taken: false,
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
        let mut st = self.st.lock().expect("batch lock");
        while st.left > 0 {
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
        st.left == 0
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

pub(super) struct TcpReader {
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

/// The requests of one `read_many` sent to one peer.
struct Sent {
    conn: Arc<Peer>,
    ids: Vec<u64>,
}

impl TcpReader {
    pub(super) fn new(inner: Arc<Inner>) -> TcpReader {
        TcpReader {
            inner,
            peers: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
        }
    }

    /// The peers `reqs` ask, in the order they first appear, each with its
    /// connection (None: not attached).
    fn peers_asked(&self, reqs: &[ReadReq]) -> Vec<(u32, Option<Arc<Peer>>)> {
        let peers = self.peers.lock().expect("reader lock");
        let mut asked: Vec<(u32, Option<Arc<Peer>>)> = Vec::new();
        for r in reqs {
            if !asked.iter().any(|g| g.0 == r.peer) {
                asked.push((r.peer, peers.get(&r.peer).cloned()));
            }
        }
        asked
    }

    /// Sends `peer`'s requests of `reqs` on `conn` (those that fail at once are
    /// settled in `batch`); the ids sent, None when `peer` is not attached.
    fn send_to_peer(
        &self,
        reqs: &[ReadReq],
        peer: u32,
        conn: Option<Arc<Peer>>,
        batch: &Arc<Batch>,
    ) -> Option<Sent> {
        let mine = reqs.iter().enumerate().filter(|(_, r)| r.peer == peer);
        let Some(conn) = conn else {
            for (i, _) in mine {
                let why = format!("peer {peer} not attached");
                batch.settle(i, Err(ReadError::Unreachable(why)));
            }
            return None;
        };
        let mut bytes = Vec::new();
        let mut ids = Vec::new();
        let mut st = conn.state.lock().expect("peer lock");
        for (i, r) in mine {
            if let Some(e) = early_error(&st, &conn, r) {
                batch.settle(i, Err(e));
                continue;
            }
            let id = self.next_req.fetch_add(1, Ordering::Relaxed);
            batch.expect_one();
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
                cap: r.cap,
            };
            bytes.extend_from_slice(&req.encode());
            ids.push(id);
        }
        drop(st);
        if !bytes.is_empty() && conn.requests.send(bytes).is_err() {
            conn.fail(format!(
                "the connection to the region server at {} is gone",
                conn.addr
            ));
        }
        Some(Sent { conn, ids })
    }
}

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
        let p = Peer::connect(&self.inner, info)?;
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
        // None: no deadline (a timeout too long to add to now).
        let deadline = Instant::now().checked_add(timeout);
        let batch = Batch::new(reqs.len());
        let sent: Vec<Sent> = self
            .peers_asked(reqs)
            .into_iter()
            .filter_map(|(peer, conn)| self.send_to_peer(reqs, peer, conn, &batch))
            .collect();
        if !batch.wait(deadline) {
            forget(&sent);
        }
        batch.take()
    }
}
