//! The region server: registers a [`Region`] once for remote reads, publishes its
//! rkey and base address, and accepts one RC QP per reader over the side channel.
//! It never sees a read: readers' NICs READ the memory directly.

use super::side_channel::{
    exchange_hello, exchange_ready, handshake_timeouts, wait_eof, AcceptThread, RegionDesc,
    SideTcp, KIND_REGION,
};
use super::verbs;
use crate::transport::auth::Service;
use crate::transport::{Region, RegionServer};
use crate::wire::RegionInfo;
use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A served region: its registration and the QPs readers connected.
struct RegionShared {
    // Drop order: QPs, then the registration (which then lets the region go).
    links: Mutex<HashMap<u64, (verbs::Qp, TcpStream)>>,
    _mr: verbs::RegionMr,
    pd: Arc<verbs::Pd>,
    cq: Arc<verbs::Cq>,
    desc: RegionDesc,
    next: AtomicU64,
}

struct RdmaRegionServer {
    info: RegionInfo,
    shared: Arc<RegionShared>,
    accept: AcceptThread,
}

impl RegionServer for RdmaRegionServer {
    fn info(&self) -> RegionInfo {
        self.info.clone()
    }
}

impl Drop for RdmaRegionServer {
    fn drop(&mut self) {
        self.accept.stop();
        // Readers' QPs go to the error state and are destroyed; their TCP channels
        // close, so readers see the region as gone. The registration goes with the
        // last reference (the watcher threads hold one until their socket ends).
        let links: Vec<_> = self.shared.links.lock().expect("lock").drain().collect();
        for (_, (qp, tcp)) in links {
            qp.set_error();
            let _ = tcp.shutdown(Shutdown::Both);
        }
    }
}

/// [`Transport::serve_region`](crate::transport::Transport::serve_region) for
/// RDMA, on protection domain `pd`.
pub(super) fn serve(
    pd: &Arc<verbs::Pd>,
    region: Arc<Region>,
    addr: &str,
    key: Option<crate::transport::auth::ClusterKey>,
) -> anyhow::Result<Box<dyn RegionServer>> {
    let l = TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot serve a region at `{addr}`: {e}"))?;
    let local = l.local_addr()?.to_string();
    let id = region.id();
    let mr = verbs::RegionMr::new(pd, region)?;
    let desc = RegionDesc {
        region: id,
        len: mr.size() as u64,
        base: mr.base(),
        rkey: mr.rkey(),
    };
    let cq = verbs::Cq::new(pd.dev.clone(), 16)?;
    let rs = Arc::new(RegionShared {
        links: Mutex::new(HashMap::new()),
        _mr: mr,
        pd: pd.clone(),
        cq,
        desc,
        next: AtomicU64::new(0),
    });
    let weak: Weak<RegionShared> = Arc::downgrade(&rs);
    let accept = AcceptThread::spawn(l, key, Service::RdmaRegion, move |tcp, peer| {
        let Some(rs) = weak.upgrade() else {
            return;
        };
        if let Err(e) = region_accept(&rs, tcp) {
            tracing::warn!(%peer, error = %format!("{e:#}"), "rdma: region reader failed");
        }
    })?;
    Ok(Box::new(RdmaRegionServer {
        info: RegionInfo {
            addr: local,
            region: desc.region,
            len: desc.len,
            rkey: desc.rkey,
            base: desc.base,
        },
        shared: rs,
        accept,
    }))
}

/// One reader connecting to a served region; returns when it is gone.
fn region_accept(rs: &Arc<RegionShared>, mut tcp: SideTcp) -> anyhow::Result<()> {
    handshake_timeouts(&tcp, true)?;
    let qp = verbs::Qp::new_rc(&rs.pd, &rs.cq, 1, 1)?;
    let (remote, _) = exchange_hello(&mut tcp, KIND_REGION, &qp.endpoint(), rs.desc)?;
    qp.connect(&remote, verbs::remote_read_access())?;
    exchange_ready(&mut tcp)?;
    handshake_timeouts(&tcp, false)?;
    let id = rs.next.fetch_add(1, Ordering::Relaxed);
    rs.links
        .lock()
        .expect("lock")
        .insert(id, (qp, tcp.try_clone()?));
    wait_eof(tcp.tcp);
    rs.links.lock().expect("lock").remove(&id);
    Ok(())
}
