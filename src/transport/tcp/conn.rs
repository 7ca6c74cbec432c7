//! One control connection: its shared state ([`ConnShared`]: the send queue, the
//! once-only end and the delivery of events), the [`Conn`] handle callers hold,
//! and how a connection is made ([`connect`], [`new_conn`]). Its two tasks live
//! in [`super::conn_writer`] and [`super::conn_reader`].

use super::conn_reader::conn_reader;
use super::conn_writer::conn_writer;
use super::net::connect_std;
use super::options::{EVENTS_FULL_WAIT, SEND_QUEUE};
use super::runtime::Inner;
use crate::transport::auth::{Channel, Service};
use crate::transport::secure_io::{self, SecureRead, SecureWrite};
use crate::transport::{Conn, ConnId, Event, EventTx, SendError};
use crate::wire::Msg;
use anyhow::Context as _;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// What [`ConnShared::deliver`] got done.
enum Delivered {
    All,
    /// The event channel is full; the rest is still to deliver.
    Full,
    /// The event loop is gone.
    Gone,
}

pub(super) struct ConnShared {
    id: ConnId,
    pub(super) peer: String,
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
    pub(super) fn finish(&self, reason: String) -> bool {
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

    /// Queues an `Error` naming `reason` for the peer, before the connection
    /// is closed for a protocol error (the writer sends what was queued).
    pub(super) fn tell_peer(&self, reason: &str) {
        let _ = self.queue.try_send(Msg::Error {
            message: reason.to_string(),
        });
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
    pub(super) async fn deliver_all(&self, msgs: &mut VecDeque<Msg>) -> bool {
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

pub(super) struct TcpConn {
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
pub(super) fn new_conn(
    inner: &Arc<Inner>,
    stream: TcpStream,
    peer: String,
    events: EventTx,
    channel: Option<Channel>,
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
    let (opener, sealer) = secure_io::split(channel);
    let (rd, wr) = (SecureRead::new(rd, opener), SecureWrite::new(wr, sealer));
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

/// [`Transport::connect`](crate::transport::Transport::connect) for TCP.
pub(super) fn connect(
    inner: &Arc<Inner>,
    addr: &str,
    events: EventTx,
) -> anyhow::Result<Arc<dyn Conn>> {
    let mut s = connect_std(addr)?;
    let ch = inner.authenticate_std(&mut s, addr, Service::Control)?;
    s.set_nonblocking(true)
        .with_context(|| format!("making the connection to `{addr}` non-blocking"))?;
    let stream = inner
        .stream(s)
        .with_context(|| format!("registering the connection to `{addr}`"))?;
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| addr.to_string());
    let (conn, start) = new_conn(inner, stream, peer, events, ch);
    start();
    Ok(conn)
}
