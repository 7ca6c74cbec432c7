//! In-process transport: every node in one process. Control messages move as
//! [`Msg`] values over crossbeam channels (no encoding); region reads copy straight
//! out of the frontend's [`Region`]. Used by `fermata serve` and the tests.
//!
//! Addresses are names in a process-wide table; a name ending in ":0" (or empty)
//! asks for a fresh unique name, like port 0 for TCP.

use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// A served region and whether its server is still up.
type Served = (Arc<Region>, Arc<AtomicBool>);

#[derive(Default)]
struct Table {
    listeners: HashMap<String, EventTx>,
    regions: HashMap<String, Served>,
}

/// The in-process transport; every handle shares one process-wide table.
#[derive(Clone)]
pub struct InProc {
    table: &'static Mutex<Table>,
}

static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl InProc {
    pub fn global() -> InProc {
        InProc {
            table: TABLE.get_or_init(|| Mutex::new(Table::default())),
        }
    }

    fn fresh(addr: &str) -> String {
        if addr.is_empty() || addr.ends_with(":0") {
            let base = addr.trim_end_matches(":0");
            let base = if base.is_empty() { "inproc" } else { base };
            format!("{base}:{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
        } else {
            addr.to_string()
        }
    }
}

struct Link {
    closed: AtomicBool,
    reason: Mutex<String>,
}

struct InProcConn {
    id: ConnId,
    peer_name: String,
    /// The other side's id and events.
    peer_id: ConnId,
    peer_tx: EventTx,
    own_tx: EventTx,
    link: Arc<Link>,
}

impl Conn for InProcConn {
    fn id(&self) -> ConnId {
        self.id
    }
    fn peer(&self) -> String {
        self.peer_name.clone()
    }
    fn send(&self, msg: Msg) -> Result<(), SendError> {
        if self.link.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed(
                self.link.reason.lock().expect("lock").clone(),
            ));
        }
        match self.peer_tx.try_send(Event::Msg(self.peer_id, msg)) {
            Ok(()) => Ok(()),
            // As a TCP connection's send queue: full is an error, never a wait.
            Err(crossbeam_channel::TrySendError::Full(_)) => Err(SendError::Full),
            Err(_) => Err(SendError::Closed("peer's event loop is gone".into())),
        }
    }
    fn close(&self, reason: &str) {
        if self.link.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.link.reason.lock().expect("lock") = reason.to_string();
        let _ = self
            .own_tx
            .send_detached(Event::Closed(self.id, reason.to_string()));
        let _ = self.peer_tx.send_detached(Event::Closed(
            self.peer_id,
            format!("peer closed: {reason}"),
        ));
    }
}

struct InProcListener {
    name: String,
    table: &'static Mutex<Table>,
}

impl Listener for InProcListener {
    fn local_addr(&self) -> String {
        self.name.clone()
    }
}

impl Drop for InProcListener {
    fn drop(&mut self) {
        self.table
            .lock()
            .expect("lock")
            .listeners
            .remove(&self.name);
    }
}

struct InProcRegionServer {
    name: String,
    info: RegionInfo,
    alive: Arc<AtomicBool>,
    table: &'static Mutex<Table>,
}

impl RegionServer for InProcRegionServer {
    fn info(&self) -> RegionInfo {
        self.info.clone()
    }
}

impl Drop for InProcRegionServer {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        self.table.lock().expect("lock").regions.remove(&self.name);
    }
}

#[derive(Default)]
struct InProcReader {
    peers: Mutex<HashMap<u32, Served>>,
    table: Option<&'static Mutex<Table>>,
}

impl RegionReader for InProcReader {
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()> {
        let t = self.table.expect("table").lock().expect("lock");
        let Some(e) = t.regions.get(&info.addr) else {
            anyhow::bail!("no in-process region is served at `{}`", info.addr);
        };
        self.peers.lock().expect("lock").insert(peer, e.clone());
        Ok(())
    }
    fn detach(&self, peer: u32) {
        self.peers.lock().expect("lock").remove(&peer);
    }
    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<Result<Vec<u8>, ReadError>> {
        self.read_many_into(reqs, timeout, Vec::new())
    }
    fn read_many_visit(
        &self,
        reqs: &[ReadReq],
        _timeout: Duration,
        bufs: Vec<Vec<u8>>,
        f: &mut crate::transport::SlotVisitor<'_>,
    ) -> (bool, Vec<Vec<u8>>) {
        // Each slot is handed over in the region's memory, under its stripe
        // locks (see `Region::read_slot`): the caller's copy is the only one.
        for (i, (r, t)) in reqs.iter().zip(self.targets(reqs)).enumerate() {
            let read = t.and_then(|reg| reg.read_slot(r.offset, r.len, r.cap, |b| f(i, Ok(b))));
            if let Err(e) = read {
                f(i, Err(e));
            }
        }
        (true, bufs)
    }
    fn read_many_into(
        &self,
        reqs: &[ReadReq],
        _timeout: Duration,
        bufs: Vec<Vec<u8>>,
    ) -> Vec<Result<Vec<u8>, ReadError>> {
        let targets = self.targets(reqs);
        let total: u64 = reqs.iter().map(|r| r.len as u64).sum();
        copy_all(
            reqs,
            &targets,
            bufs,
            parallel_copies(reqs.len(), total, cores()),
        )
    }
}

impl InProcReader {
    /// Every request's region, resolved under the lock (the copies are made
    /// outside it).
    fn targets(&self, reqs: &[ReadReq]) -> Vec<Result<Arc<Region>, ReadError>> {
        {
            let peers = self.peers.lock().expect("lock");
            reqs.iter()
                .map(|r| match peers.get(&r.peer) {
                    None => Err(ReadError::Unreachable(format!(
                        "peer {} not attached",
                        r.peer
                    ))),
                    Some((_, alive)) if !alive.load(Ordering::Acquire) => Err(
                        ReadError::Unreachable(format!("peer {}'s region is gone", r.peer)),
                    ),
                    Some((reg, _)) => Ok(reg.clone()),
                })
                .collect()
        }
    }
}

/// The cores this process may use, looked up once: `available_parallelism` reads
/// the cgroup's files on every call (five or more syscalls), and this runs for every
/// batch a backend pulls.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get()))
}

/// Copies every request's bytes out of its region, with `threads` threads.
fn copy_all(
    reqs: &[ReadReq],
    targets: &[Result<Arc<Region>, ReadError>],
    mut bufs: Vec<Vec<u8>>,
    threads: usize,
) -> Vec<Result<Vec<u8>, ReadError>> {
    {
        let copy = |r: &ReadReq, t: &Result<Arc<Region>, ReadError>, mut out: Vec<u8>| {
            let reg = t.as_ref().map_err(Clone::clone)?;
            out.clear();
            out.reserve(r.len as usize);
            reg.read_slot(r.offset, r.len, r.cap, |b| out.extend_from_slice(b))?;
            Ok(out)
        };
        if threads <= 1 {
            return reqs
                .iter()
                .zip(targets)
                .map(|(r, t)| copy(r, t, bufs.pop().unwrap_or_default()))
                .collect();
        }
        // A batch of large inputs is copied by several threads: one core copies
        // a few GB/s, and a batch of 64 images of 588 KiB is 38 MB. (The
        // hand-rolled split, not a thread pool crate: one scope per batch pull.)
        let per = reqs.len().div_ceil(threads);
        let mut outs: Vec<Vec<u8>> = (0..reqs.len())
            .map(|_| bufs.pop().unwrap_or_default())
            .collect();
        let mut res: Vec<Option<Result<Vec<u8>, ReadError>>> =
            (0..reqs.len()).map(|_| None).collect();
        std::thread::scope(|s| {
            for ((rq, tg), (os, rs)) in reqs
                .chunks(per)
                .zip(targets.chunks(per))
                .zip(outs.chunks_mut(per).zip(res.chunks_mut(per)))
            {
                s.spawn(move || {
                    for i in 0..rq.len() {
                        rs[i] = Some(copy(&rq[i], &tg[i], std::mem::take(&mut os[i])));
                    }
                });
            }
        });
        res.into_iter()
            .map(|r| r.expect("every request copied"))
            .collect()
    }
}

/// Bytes a pull must move before it is split across threads, and the most
/// threads one pull uses.
const PARALLEL_PULL_BYTES: u64 = 4 << 20;
const PARALLEL_PULL_THREADS: usize = 4;

/// How many threads copy a pull of `n` inputs and `bytes` bytes: one for a small
/// pull, else up to [`PARALLEL_PULL_THREADS`] (at least 1 MiB each), never more
/// than a quarter of this machine's cores.
fn parallel_copies(n: usize, bytes: u64, cores: usize) -> usize {
    if bytes < PARALLEL_PULL_BYTES || n < 2 {
        return 1;
    }
    PARALLEL_PULL_THREADS
        .min(cores / 4)
        .min((bytes >> 20) as usize)
        .min(n)
        .max(1)
}

impl Transport for InProc {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        let name = Self::fresh(addr);
        let mut t = self.table.lock().expect("lock");
        if t.listeners.contains_key(&name) {
            anyhow::bail!("in-process address `{name}` is already in use");
        }
        t.listeners.insert(name.clone(), events);
        Ok(Box::new(InProcListener {
            name,
            table: self.table,
        }))
    }

    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        let ltx = {
            let t = self.table.lock().expect("lock");
            match t.listeners.get(addr) {
                Some(tx) => tx.clone(),
                None => anyhow::bail!("nothing listens at in-process address `{addr}`"),
            }
        };
        let link = Arc::new(Link {
            closed: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
        });
        let cid = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let sid = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let client = Arc::new(InProcConn {
            id: cid,
            peer_name: addr.to_string(),
            peer_id: sid,
            peer_tx: ltx.clone(),
            own_tx: events.clone(),
            link: link.clone(),
        });
        let server = Arc::new(InProcConn {
            id: sid,
            peer_name: format!("inproc-client-{cid}"),
            peer_id: cid,
            peer_tx: events,
            own_tx: ltx.clone(),
            link,
        });
        if ltx.send_detached(Event::Accepted(server)).is_err() {
            anyhow::bail!("the listener at `{addr}` is gone");
        }
        Ok(client)
    }

    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        let name = Self::fresh(if addr.is_empty() { "region:0" } else { addr });
        let alive = Arc::new(AtomicBool::new(true));
        let info = RegionInfo {
            addr: name.clone(),
            region: region.id(),
            len: region.len(),
            rkey: 0,
            base: 0,
        };
        let mut t = self.table.lock().expect("lock");
        if t.regions.contains_key(&name) {
            anyhow::bail!("in-process region address `{name}` is already in use");
        }
        t.regions.insert(name.clone(), (region, alive.clone()));
        Ok(Box::new(InProcRegionServer {
            name,
            info,
            alive,
            table: self.table,
        }))
    }

    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        Ok(Arc::new(InProcReader {
            peers: Mutex::new(HashMap::new()),
            table: Some(self.table),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_regions_and_close() {
        crate::transport::conformance(&InProc::global(), "test-srv:0", "");
    }

    #[test]
    fn split_pulls_read_the_same_bytes() {
        // Small pulls stay on one thread; large ones use up to 4, a quarter of
        // the cores, and at least 1 MiB each.
        assert_eq!(parallel_copies(64, 1 << 20, 16), 1);
        assert_eq!(parallel_copies(64, 40 << 20, 16), 4);
        assert_eq!(parallel_copies(64, 40 << 20, 2), 1);
        assert_eq!(parallel_copies(3, 40 << 20, 64), 3);
        assert_eq!(parallel_copies(64, 5 << 20, 64), 4);
        let reg = Arc::new(Region::new(9, 8 << 20).unwrap());
        let refs: Vec<_> = (0..13u64)
            .map(|i| {
                let v: Vec<u8> = (0..100_000u32).map(|b| (b as u64 * 31 + i) as u8).collect();
                reg.put(i, i + 100, &v).unwrap()
            })
            .collect();
        let mut reqs: Vec<ReadReq> = refs
            .iter()
            .zip(100u64..)
            .map(|(r, cap)| ReadReq {
                peer: 1,
                offset: r.offset,
                len: r.len,
                cap,
            })
            .collect();
        reqs.push(ReadReq {
            peer: 2,
            offset: 0,
            len: 16,
            cap: 1,
        });
        let mut targets: Vec<Result<Arc<Region>, ReadError>> =
            refs.iter().map(|_| Ok(reg.clone())).collect();
        targets.push(Err(ReadError::Unreachable("peer 2 not attached".into())));
        let one = copy_all(&reqs, &targets, Vec::new(), 1);
        for threads in [2, 3, 4] {
            let bufs = vec![vec![0xAAu8; 7]; 5];
            assert_eq!(
                copy_all(&reqs, &targets, bufs, threads),
                one,
                "{threads} threads"
            );
        }
        assert!(one[..13]
            .iter()
            .all(|r| r.as_ref().is_ok_and(|b| b.len() == 100_000 + SLOT_HEADER)));
        assert!(one[13].is_err());
    }
}
