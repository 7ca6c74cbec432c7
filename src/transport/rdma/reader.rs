//! The pull side: [`RdmaReader`], the [`RegionReader`] of the RDMA transport. One
//! RC QP per attached region ([`ReadLink`]), one registered staging buffer, and
//! `read_many` in waves of RDMA READs: requests are checked (and broken links
//! reconnected once), a wave is posted into the staging buffer and the reader's
//! CQ polled until it completed or the deadline passed; a link with a READ still
//! out at the deadline, or one that failed a READ, is dropped.

use super::options::{READ_WAVE, STAGING};
use super::side_channel::{
    exchange_hello, exchange_ready, handshake_timeouts, tcp_connect, wait_eof, RegionDesc,
    KIND_REGION,
};
use super::verbs;
use crate::transport::auth::{ClusterKey, Service};
use crate::transport::{ReadError, ReadReq, RegionReader};
use crate::wire::RegionInfo;
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type ReadResult = Result<Vec<u8>, ReadError>;

/// One attached region on the reader's side.
struct ReadLink {
    // Drop order: the QP first (after it is destroyed the NIC no longer writes into
    // the staging buffer for it).
    qp: verbs::Qp,
    tcp: TcpStream,
    alive: Arc<AtomicBool>,
    desc: RegionDesc,
}

impl Drop for ReadLink {
    fn drop(&mut self) {
        let _ = self.tcp.shutdown(Shutdown::Both);
    }
}

struct Peer {
    info: RegionInfo,
    link: Option<ReadLink>,
}

struct ReaderInner {
    peers: HashMap<u32, Peer>,
    staging: verbs::Buf,
    /// Call counter, in the top 32 bits of every wr_id: completions of an earlier
    /// call (a QP destroyed after a timeout) are recognised and ignored.
    seq: u64,
}

pub(super) struct RdmaReader {
    /// The cluster secret each region connection proves.
    key: Option<ClusterKey>,
    pd: Arc<verbs::Pd>,
    cq: Arc<verbs::Cq>,
    inner: Mutex<ReaderInner>,
}

/// One `read_many` call in progress: its requests, their results so far, its
/// sequence number and its deadline.
struct Call<'a> {
    reqs: &'a [ReadReq],
    out: Vec<Option<ReadResult>>,
    seq: u64,
    deadline: Instant,
}

/// The READs of one wave, each (request index, staging offset, done), and how
/// many are still outstanding.
#[derive(Default)]
struct Wave {
    reads: Vec<(usize, usize, bool)>,
    outstanding: usize,
}

impl RdmaReader {
    /// A reader on `pd`, with its own CQ and staging buffer.
    pub(super) fn new(pd: Arc<verbs::Pd>, key: Option<ClusterKey>) -> anyhow::Result<RdmaReader> {
        let entries = pd.dev.max_cqe.clamp(1, 4096);
        let cq = verbs::Cq::new(pd.dev.clone(), entries)?;
        let staging = verbs::Buf::alloc(&pd, STAGING)?;
        Ok(RdmaReader {
            key,
            pd,
            cq,
            inner: Mutex::new(ReaderInner {
                peers: HashMap::new(),
                staging,
                seq: 0,
            }),
        })
    }

    fn connect(&self, info: &RegionInfo) -> anyhow::Result<ReadLink> {
        let mut tcp = tcp_connect(&info.addr, Service::RdmaRegion, self.key.as_ref())?;
        handshake_timeouts(&tcp, true)?;
        let qp = verbs::Qp::new_rc(&self.pd, &self.cq, READ_WAVE as u32, 1)?;
        let (remote, desc) =
            exchange_hello(&mut tcp, KIND_REGION, &qp.endpoint(), RegionDesc::default())?;
        anyhow::ensure!(
            desc.region == info.region
                && desc.len == info.len
                && desc.rkey == info.rkey
                && desc.base == info.base,
            "the region served at `{}` is not the one announced (stale RegionInfo?): served \
             {desc:?}, announced region {} len {} rkey {:#x} base {:#x}",
            info.addr,
            info.region,
            info.len,
            info.rkey,
            info.base
        );
        qp.connect(&remote, 0)?;
        exchange_ready(&mut tcp)?;
        handshake_timeouts(&tcp, false)?;
        let alive = Arc::new(AtomicBool::new(true));
        let (a, t) = (alive.clone(), tcp.try_clone()?);
        std::thread::Builder::new()
            .name("rdma-read-watch".into())
            .spawn(move || {
                wait_eof(t);
                a.store(false, Ordering::Release);
            })?;
        Ok(ReadLink {
            qp,
            tcp: tcp.tcp,
            alive,
            desc,
        })
    }

    /// Checks every request, settling those known without a read; reconnects
    /// peers whose link broke (once per call). The requests left to read.
    fn check_requests(&self, inner: &mut ReaderInner, call: &mut Call) -> Vec<usize> {
        let mut todo = Vec::new();
        let mut tried = Vec::new();
        for (i, r) in call.reqs.iter().enumerate() {
            match self.check_one(inner, r, &mut tried) {
                Some(res) => call.out[i] = Some(res),
                None => todo.push(i),
            }
        }
        todo
    }

    /// The result of `r` when it is known without reading (an error, an empty
    /// read); None: read it. `tried`: the peers reconnected in this call.
    fn check_one(
        &self,
        inner: &mut ReaderInner,
        r: &ReadReq,
        tried: &mut Vec<u32>,
    ) -> Option<ReadResult> {
        let Some(p) = inner.peers.get_mut(&r.peer) else {
            let why = format!("peer {} not attached", r.peer);
            return Some(Err(ReadError::Unreachable(why)));
        };
        if r.offset
            .checked_add(r.len as u64)
            .is_none_or(|e| e > p.info.len)
        {
            return Some(Err(ReadError::OutOfBounds));
        }
        if r.len as usize > STAGING {
            return Some(Err(ReadError::Unreachable(format!(
                "a read of {} bytes is larger than the staging buffer",
                r.len
            ))));
        }
        if r.len == 0 {
            return Some(Ok(Vec::new()));
        }
        let dead = p
            .link
            .as_ref()
            .is_none_or(|l| !l.alive.load(Ordering::Acquire));
        if dead && !tried.contains(&r.peer) {
            tried.push(r.peer);
            p.link = None;
            match self.connect(&p.info) {
                Ok(l) => p.link = Some(l),
                Err(e) => {
                    let why = format!("peer {}'s region: {e:#}", r.peer);
                    return Some(Err(ReadError::Unreachable(why)));
                }
            }
        }
        if p.link.is_none() {
            let why = format!("peer {}'s region is gone", r.peer);
            return Some(Err(ReadError::Unreachable(why)));
        }
        None
    }

    /// Waves: posts as many READs as fit the staging buffer and [`READ_WAVE`],
    /// then polls until they all completed or the deadline passed.
    fn read_waves(&self, inner: &mut ReaderInner, call: &mut Call, todo: &[usize]) {
        let mut wcs = verbs::wc_array::<64>();
        let mut next = 0;
        while next < todo.len() {
            if Instant::now() >= call.deadline {
                break;
            }
            let mut wave = Wave::default();
            next = post_wave(inner, call, todo, next, &mut wave);
            let broken = self.poll_wave(&inner.staging, call, &mut wave, &mut wcs);
            for peer in broken {
                if let Some(p) = inner.peers.get_mut(&peer) {
                    p.link = None;
                }
            }
            if wave.outstanding > 0 {
                time_out_wave(inner, call, &wave);
                break;
            }
        }
    }

    /// Polls the reader's CQ until every READ of `wave` completed or the deadline
    /// passed. The peers whose QP failed a READ: dropped after the wave (their
    /// other outstanding READs complete flushed first, so they fail fast).
    fn poll_wave(
        &self,
        staging: &verbs::Buf,
        call: &mut Call,
        wave: &mut Wave,
        wcs: &mut [verbs::Wc],
    ) -> Vec<u32> {
        let mut broken: Vec<u32> = Vec::new();
        let mut spins = 0u32;
        while wave.outstanding > 0 {
            let n = self.cq.poll(wcs).unwrap_or(0);
            for wc in &wcs[..n] {
                broken.extend(complete_read(staging, call, wave, wc));
            }
            if n == 0 {
                if Instant::now() >= call.deadline {
                    break;
                }
                spins += 1;
                if spins.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        broken
    }
}

/// Posts the READs of `todo` from `next` on that fit the staging buffer and
/// [`READ_WAVE`] into `wave`; where the next wave starts.
fn post_wave(
    inner: &mut ReaderInner,
    call: &mut Call,
    todo: &[usize],
    mut next: usize,
    wave: &mut Wave,
) -> usize {
    let mut used = 0usize;
    while next < todo.len() && wave.reads.len() < READ_WAVE {
        let i = todo[next];
        let r = call.reqs[i];
        let len = r.len as usize;
        if used + len > STAGING {
            break;
        }
        next += 1;
        let p = inner.peers.get_mut(&r.peer).expect("checked above");
        let Some(l) = p.link.as_ref() else {
            let why = format!("peer {}'s link broke", r.peer);
            call.out[i] = Some(Err(ReadError::Unreachable(why)));
            continue;
        };
        let w = wave.reads.len() as u64;
        // `used..used+len` of staging is not the target of another READ of this
        // call; earlier calls' READs are complete or their QPs destroyed (see
        // `time_out_wave`).
        let posted = l.qp.post_read(
            (call.seq << 32) | w,
            &inner.staging,
            used,
            len,
            l.desc.base + r.offset,
            l.desc.rkey,
        );
        match posted {
            Ok(()) => {
                wave.reads.push((i, used, false));
                used += len;
                wave.outstanding += 1;
            }
            Err(e) => {
                call.out[i] = Some(Err(ReadError::Unreachable(format!("peer {}: {e}", r.peer))));
                p.link = None;
            }
        }
    }
    next
}

/// Records the READ that `wc` completed (completions of earlier calls and
/// repeats are ignored); the peer whose QP failed it, if it did.
fn complete_read(
    staging: &verbs::Buf,
    call: &mut Call,
    wave: &mut Wave,
    wc: &verbs::Wc,
) -> Option<u32> {
    if wc.wr_id() >> 32 != call.seq {
        return None; // a late completion of an earlier call
    }
    let w = (wc.wr_id() & 0xffff_ffff) as usize;
    let entry = wave.reads.get_mut(w)?;
    if entry.2 {
        return None;
    }
    entry.2 = true;
    wave.outstanding -= 1;
    let (i, off) = (entry.0, entry.1);
    let r = call.reqs[i];
    if wc.is_valid() {
        // The READ completed; the bytes are in staging.
        call.out[i] = Some(Ok(staging.copy_out(off, r.len as usize)));
        return None;
    }
    // The QP is in the error state now: reconnect next time.
    call.out[i] = Some(Err(ReadError::Unreachable(format!(
        "rdma read from peer {} failed: {}",
        r.peer,
        verbs::wc_status_str(wc)
    ))));
    Some(r.peer)
}

/// Timed out with READs in flight: drops the links they were posted on (the NIC
/// stops writing into staging once a QP is destroyed) and times the requests out;
/// those peers reconnect on their next read.
fn time_out_wave(inner: &mut ReaderInner, call: &mut Call, wave: &Wave) {
    for &(i, _, done) in &wave.reads {
        if !done {
            call.out[i] = Some(Err(ReadError::Timeout));
            if let Some(p) = inner.peers.get_mut(&call.reqs[i].peer) {
                p.link = None;
            }
        }
    }
}

impl RegionReader for RdmaReader {
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()> {
        let link = self.connect(info)?;
        self.inner.lock().expect("lock").peers.insert(
            peer,
            Peer {
                info: info.clone(),
                link: Some(link),
            },
        );
        Ok(())
    }

    fn detach(&self, peer: u32) {
        self.inner.lock().expect("lock").peers.remove(&peer);
    }

    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<ReadResult> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.inner.lock().expect("lock");
        let inner = &mut *guard;
        inner.seq = inner.seq.wrapping_add(1) & 0xffff_ffff;
        let mut call = Call {
            reqs,
            out: vec![None; reqs.len()],
            seq: inner.seq,
            deadline,
        };
        let todo = self.check_requests(inner, &mut call);
        self.read_waves(inner, &mut call, &todo);
        call.out
            .into_iter()
            .map(|o| o.unwrap_or(Err(ReadError::Timeout)))
            .collect()
    }
}
