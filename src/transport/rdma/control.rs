//! The control plane's shared state ([`Shared`]: PD, the control CQ, the live
//! connections) and the set-up of control connections: [`establish`] on a
//! connected side channel (QP, endpoint exchange, receives posted, ready bytes),
//! and [`listen`], whose accept thread establishes every accepted connection.

use super::conn::CtrlConn;
use super::options::{CTRL_BUF, CTRL_RECVS, CTRL_SENDS};
use super::side_channel::{
    exchange_hello, exchange_ready, handshake_timeouts, wait_eof, AcceptThread, RegionDesc,
    SideTcp, KIND_CTRL,
};
use super::verbs;
use crate::transport::auth::{ClusterKey, Service};
use crate::transport::{Conn, ConnId, Event, EventTx, Listener};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// State shared by the transport, its connections and its polling thread.
pub(super) struct Shared {
    pub(super) pd: Arc<verbs::Pd>,
    /// Completion queue of every control connection.
    pub(super) ctrl_cq: Arc<verbs::Cq>,
    /// Entries of `ctrl_cq` (each connection can have CTRL_RECVS + CTRL_SENDS).
    ctrl_cq_entries: usize,
    pub(super) conns: Mutex<HashMap<ConnId, Arc<CtrlConn>>>,
    /// Connections whose TCP side channel ended: closed by the polling thread after
    /// it emptied the CQ, so their last messages are delivered before `Closed`.
    pub(super) lost: Mutex<Vec<ConnId>>,
    next_id: AtomicU64,
    pub(super) stop: AtomicBool,
}

impl Shared {
    /// The PD and the control CQ (as large as the device allows, up to 2^15) of
    /// `dev`.
    pub(super) fn new(dev: Arc<verbs::Device>) -> anyhow::Result<Shared> {
        let pd = verbs::Pd::new(dev.clone())?;
        let entries = dev.max_cqe.clamp(1, 1 << 15);
        let ctrl_cq = verbs::Cq::new(dev, entries)?;
        Ok(Shared {
            pd,
            ctrl_cq,
            ctrl_cq_entries: entries as usize,
            conns: Mutex::new(HashMap::new()),
            lost: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        })
    }

    /// Fails when the control CQ has no room for one more connection.
    fn check_room(&self) -> anyhow::Result<()> {
        let per_conn = CTRL_RECVS + CTRL_SENDS;
        let n = self.conns.lock().expect("lock").len();
        anyhow::ensure!(
            (n + 1) * per_conn <= self.ctrl_cq_entries,
            "too many rdma control connections ({n}; the completion queue holds {})",
            self.ctrl_cq_entries
        );
        Ok(())
    }
}

/// Builds a control connection on a connected TCP socket: QP, endpoint exchange,
/// receives posted, then (acceptor) `Accepted` is sent before the ready bytes, so it
/// precedes every message of the connection.
pub(super) fn establish(
    shared: &Arc<Shared>,
    mut tcp: SideTcp,
    peer: String,
    events: EventTx,
    accepted: bool,
) -> anyhow::Result<Arc<CtrlConn>> {
    shared.check_room()?;
    handshake_timeouts(&tcp, true)?;
    let conn = Arc::new(connect_qp(shared, &mut tcp, peer, events.clone())?);
    for slot in 0..CTRL_RECVS {
        conn.post_recv(slot)?;
    }
    let id = conn.id();
    shared.conns.lock().expect("lock").insert(id, conn.clone());
    if let Err(e) = get_ready(&mut tcp, &conn, &events, accepted) {
        shared.conns.lock().expect("lock").remove(&id);
        if accepted {
            // `Accepted` may have gone out: end it the documented way.
            conn.fail(&format!("rdma connection set-up failed: {e}"));
        }
        return Err(e);
    }
    watch_side_channel(shared, tcp.tcp, id)?;
    Ok(conn)
}

/// A QP and its buffers, connected to the peer's over `tcp`: the connection.
fn connect_qp(
    shared: &Shared,
    tcp: &mut SideTcp,
    peer: String,
    events: EventTx,
) -> anyhow::Result<CtrlConn> {
    let pd = &shared.pd;
    let qp = verbs::Qp::new_rc(pd, &shared.ctrl_cq, CTRL_SENDS as u32, CTRL_RECVS as u32)?;
    let recv = verbs::Buf::alloc(pd, CTRL_RECVS * CTRL_BUF)?;
    let send = verbs::Buf::alloc(pd, CTRL_SENDS * CTRL_BUF)?;
    let (remote, _) = exchange_hello(tcp, KIND_CTRL, &qp.endpoint(), RegionDesc::default())?;
    qp.connect(&remote, 0)?;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let tcp = tcp.try_clone()?;
    Ok(CtrlConn::new(id, peer, qp, recv, send, events, tcp))
}

/// Announces an accepted connection, then exchanges the ready bytes and ends the
/// handshake's timeouts.
fn get_ready(
    tcp: &mut SideTcp,
    conn: &Arc<CtrlConn>,
    events: &EventTx,
    accepted: bool,
) -> anyhow::Result<()> {
    if accepted && events.send_detached(Event::Accepted(conn.clone())).is_err() {
        anyhow::bail!("the listener's event loop is gone");
    }
    exchange_ready(tcp)?;
    handshake_timeouts(tcp, false)?;
    Ok(())
}

/// The side channel's end is connection `id`'s end (see [`Shared::lost`]): a
/// thread waits for it.
fn watch_side_channel(shared: &Arc<Shared>, tcp: TcpStream, id: ConnId) -> std::io::Result<()> {
    let s = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name("rdma-watch".into())
        .spawn(move || {
            wait_eof(tcp);
            if let Some(s) = s.upgrade() {
                s.lost.lock().expect("lock").push(id);
            }
        })?;
    Ok(())
}

struct RdmaListener {
    addr: String,
    /// Stopped when the listener is dropped.
    _accept: AcceptThread,
}

impl Listener for RdmaListener {
    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

/// [`Transport::listen`](crate::transport::Transport::listen) for RDMA.
pub(super) fn listen(
    shared: &Arc<Shared>,
    addr: &str,
    events: EventTx,
    key: Option<ClusterKey>,
) -> anyhow::Result<Box<dyn Listener>> {
    let l =
        TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen at `{addr}`: {e}"))?;
    let local = l.local_addr()?.to_string();
    let shared = Arc::downgrade(shared);
    let accept = AcceptThread::spawn(l, key, Service::RdmaControl, move |tcp, peer| {
        let Some(s) = shared.upgrade() else {
            return;
        };
        if let Err(e) = establish(&s, tcp, peer.clone(), events.clone(), true) {
            tracing::warn!(%peer, error = %format!("{e:#}"), "rdma: connection failed");
        }
    })?;
    Ok(Box::new(RdmaListener {
        addr: local,
        _accept: accept,
    }))
}
