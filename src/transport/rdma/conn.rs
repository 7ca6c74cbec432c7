//! One control connection ([`CtrlConn`]): its registered send and receive slots,
//! the send backlog pumped into free slots, the handling of its completions
//! (freed send slots, received chunks reassembled into messages, the close
//! marker) and the [`Conn`] interface. It is set up by [`super::control`].

use super::options::{BACKLOG_MAX, CTRL_BUF, CTRL_RECVS, CTRL_SENDS, IMM_CLOSE};
use super::verbs;
use crate::transport::rdma_wire::{wr_id, wr_parts, WR_RECV};
use crate::transport::{Conn, ConnId, Event, EventTx, SendError};
use crate::wire::{FrameReader, Msg};
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A control connection.
pub(super) struct CtrlConn {
    id: ConnId,
    peer: String,
    // Field order is drop order: the QP goes before the buffers it points into.
    qp: verbs::Qp,
    recv: verbs::Buf,
    tx: Mutex<SendSide>,
    rx: Mutex<FrameReader>,
    events: EventTx,
    /// `Closed` was delivered (exactly once).
    closed: AtomicBool,
    reason: Mutex<String>,
    /// The TCP side channel (shut down when the connection ends).
    tcp: TcpStream,
}

struct SendSide {
    mr: verbs::Buf,
    free: Vec<usize>,
    backlog: VecDeque<Out>,
    backlog_bytes: usize,
    /// A close marker was queued: shut the TCP channel once everything is sent.
    closing: bool,
}

enum Out {
    /// Encoded frames; `.1` bytes of it already posted.
    Bytes(Vec<u8>, usize),
    /// The close marker with its reason.
    Close(String),
}

// Slots must fit below the kind bit of their work request ids.
const _: () = assert!(CTRL_RECVS < WR_RECV as usize);
const _: () = assert!(CTRL_SENDS < WR_RECV as usize);

impl CtrlConn {
    /// A connection on `qp` (connected) with its buffers: `recv` holds
    /// [`CTRL_RECVS`] slots, `send` [`CTRL_SENDS`], of [`CTRL_BUF`] bytes each.
    pub(super) fn new(
        id: ConnId,
        peer: String,
        qp: verbs::Qp,
        recv: verbs::Buf,
        send: verbs::Buf,
        events: EventTx,
        tcp: TcpStream,
    ) -> CtrlConn {
        CtrlConn {
            id,
            peer,
            qp,
            recv,
            tx: Mutex::new(SendSide {
                mr: send,
                free: (0..CTRL_SENDS).rev().collect(),
                backlog: VecDeque::new(),
                backlog_bytes: 0,
                closing: false,
            }),
            rx: Mutex::new(FrameReader::new()),
            events,
            closed: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            tcp,
        }
    }

    /// Copies as much of the backlog as there are free send slots and posts it.
    fn pump(&self, tx: &mut SendSide) -> std::io::Result<()> {
        while let Some(front) = tx.backlog.front_mut() {
            let Some(slot) = tx.free.pop() else {
                break;
            };
            // A free slot has no send outstanding: it may be rewritten.
            let at = slot * CTRL_BUF;
            let (n, imm, done) = match front {
                Out::Bytes(v, off) => {
                    let n = (v.len() - *off).min(CTRL_BUF);
                    tx.mr.write(at, &v[*off..*off + n]);
                    *off += n;
                    (n, None, *off == v.len())
                }
                Out::Close(reason) => {
                    let r = reason.as_bytes();
                    let n = r.len().min(CTRL_BUF);
                    tx.mr.write(at, &r[..n]);
                    (n, Some(IMM_CLOSE), true)
                }
            };
            let posted = self
                .qp
                .post_send(wr_id(self.id, false, slot), &tx.mr, at, n, imm);
            if let Err(e) = posted {
                tx.free.push(slot);
                return Err(e);
            }
            if done {
                if let Some(Out::Bytes(v, _)) = tx.backlog.pop_front() {
                    tx.backlog_bytes -= v.len();
                }
            }
        }
        Ok(())
    }

    /// Posts receive buffer `slot` (again); it is not read until its completion.
    pub(super) fn post_recv(&self, slot: usize) -> std::io::Result<()> {
        self.qp.post_recv(
            wr_id(self.id, true, slot),
            &self.recv,
            slot * CTRL_BUF,
            CTRL_BUF,
        )
    }

    fn emit_closed(&self, reason: String) -> bool {
        if self.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        *self.reason.lock().expect("lock") = reason.clone();
        let _ = self.events.send_detached(Event::Closed(self.id, reason));
        true
    }

    /// Ends the connection without telling the peer in band (it sees the TCP side
    /// channel close): errors, a lost peer, teardown.
    pub(super) fn fail(&self, reason: &str) {
        self.emit_closed(reason.to_string());
        self.qp.set_error();
        let _ = self.tcp.shutdown(Shutdown::Both);
    }

    /// One completion of this connection (called by the polling thread).
    pub(super) fn on_completion(&self, wc: &verbs::Wc) {
        let (_, recv, slot) = wr_parts(wc.wr_id());
        if wc.error().is_some() {
            if !verbs::flushed(wc) {
                let what = if recv { "receive" } else { "send" };
                self.fail(&format!("rdma {what} failed: {}", verbs::wc_status_str(wc)));
            }
            return;
        }
        if recv {
            self.on_received(wc, slot);
        } else {
            self.on_sent(slot);
        }
    }

    /// Send slot `slot` is free again: pumps the backlog into it.
    fn on_sent(&self, slot: usize) {
        let mut tx = self.tx.lock().expect("lock");
        tx.free.push(slot);
        if let Err(e) = self.pump(&mut tx) {
            drop(tx);
            self.fail(&format!("rdma send failed: {e}"));
            return;
        }
        if tx.closing && tx.backlog.is_empty() && tx.free.len() == CTRL_SENDS {
            // Our close marker went out: the peer has it; end the side channel.
            let _ = self.tcp.shutdown(Shutdown::Both);
        }
    }

    /// Receive slot `slot` holds a chunk (or the peer's close marker): feeds it to
    /// the frame reader, reposts the slot and delivers the whole messages.
    fn on_received(&self, wc: &verbs::Wc, slot: usize) {
        // The NIC wrote `n` bytes into this slot and is done with it until the
        // slot is posted again below.
        let n = wc.len().min(CTRL_BUF);
        let data = self.recv.copy_out(slot * CTRL_BUF, n);
        if wc.imm_data().map(u32::from_be) == Some(IMM_CLOSE) {
            let reason = String::from_utf8_lossy(&data).into_owned();
            self.emit_closed(format!("peer closed: {reason}"));
            let _ = self.tcp.shutdown(Shutdown::Both);
            return;
        }
        let mut rx = self.rx.lock().expect("lock");
        rx.feed(&data);
        if let Err(e) = self.post_recv(slot) {
            drop(rx);
            self.fail(&format!("rdma receive could not be reposted: {e}"));
            return;
        }
        while let Some(m) = rx.next_msg() {
            match m {
                Ok(m) => {
                    if self.closed.load(Ordering::Acquire) {
                        break;
                    }
                    let _ = self.events.send(Event::Msg(self.id, m));
                }
                Err(e) => {
                    drop(rx);
                    self.close(&format!("undecodable frame from the peer: {e}"));
                    return;
                }
            }
        }
    }
}

impl Conn for CtrlConn {
    fn id(&self) -> ConnId {
        self.id
    }
    fn peer(&self) -> String {
        self.peer.clone()
    }
    fn send(&self, msg: Msg) -> Result<(), SendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed(self.reason.lock().expect("lock").clone()));
        }
        let frame = crate::wire::encode_to_vec(&msg);
        let mut tx = self.tx.lock().expect("lock");
        if tx.closing {
            return Err(SendError::Closed("closing".into()));
        }
        if tx.backlog_bytes + frame.len() > BACKLOG_MAX {
            return Err(SendError::Full);
        }
        tx.backlog_bytes += frame.len();
        // Frames queued behind a partly sent one just join the stream.
        tx.backlog.push_back(Out::Bytes(frame, 0));
        if let Err(e) = self.pump(&mut tx) {
            drop(tx);
            let r = format!("rdma send failed: {e}");
            self.fail(&r);
            return Err(SendError::Closed(r));
        }
        Ok(())
    }
    fn close(&self, reason: &str) {
        {
            let mut tx = self.tx.lock().expect("lock");
            if tx.closing || self.closed.load(Ordering::Acquire) {
                drop(tx);
                self.emit_closed(reason.to_string());
                return;
            }
            tx.closing = true;
            tx.backlog.push_back(Out::Close(reason.to_string()));
            if self.pump(&mut tx).is_err() {
                let _ = self.tcp.shutdown(Shutdown::Both);
            }
        }
        self.emit_closed(reason.to_string());
    }
}
