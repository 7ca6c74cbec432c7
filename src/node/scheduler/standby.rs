//! A hot-standby scheduler (`fermata scheduler --standby-of ADDR`): the
//! driver of [`StandbyProto`] in the scheduler's event loop. It runs the whole
//! scheduler from the start, listening at its own address, but serves only
//! once the primary is gone; until then the protocol machine decides what is
//! held, refused and when to take over (see [`crate::node::proto::standby`]),
//! and this module opens the connections to the primary and reports the
//! takeover to the process ([`StandbyStatus`]).
//!
//! Nodes know both addresses (`--scheduler PRIMARY,STANDBY`) and try the
//! standby at once when they lose the primary (see
//! [`crate::node::proto::member`]).
//!
//! What a standby takes over of the primary's state: the models'
//! sub-clusters and their states under model control (which are loaded; see
//! [`crate::node::proto::standby`]). The rest it does not: the nodes
//! register anew (backends keep their models loaded, so this is quick) and
//! the frontends submit the requests that were pending at the primary again,
//! under new task ids (each ends exactly once, none is lost).
//!
//! The standby takes over under a new term (see
//! [`crate::node::proto::standby`]) and, from then on, fences its old
//! primary's address from a thread of its own ([`spawn_fencer`], driving
//! [`Fencer`]): a primary that resumes there (it was paused, or cut off) hears
//! the newer term and steps down, and so does this scheduler if a newer term
//! answers. When only the standby lost the primary (its own path to it), the
//! fence reaches the primary as soon as the path is back: the primary steps
//! down and its nodes come over.

use crate::node::proto::fence::{self, Fencer};
use crate::node::proto::standby::StandbyProto;
use crate::transport::{Conn, Event, EventTx, Transport};
use crate::wire::{Dur, Time};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::node::proto::standby::Action;

/// What the process sees of its standby (shared with [`super::SchedulerNode`]).
#[derive(Debug, Default)]
pub struct StandbyStatus {
    /// Whether it took over.
    pub promoted: AtomicBool,
    /// Why it took over, and how long after the primary was last heard from.
    pub took_over: Mutex<Option<(String, Duration)>>,
}

/// The following half of a standby scheduler's event loop.
pub(super) struct Standby {
    pub(super) proto: StandbyProto,
    transport: Arc<dyn Transport>,
    events: EventTx,
    /// The connection to the primary.
    conn: Option<Arc<dyn Conn>>,
    pub(super) status: Arc<StandbyStatus>,
    pub(super) heartbeat: Duration,
}

impl Standby {
    /// Follows `primary`: connects to it now (an error when it cannot: a
    /// standby starts next to a running primary).
    pub(super) fn follow(
        now: Time,
        primary: &str,
        transport: Arc<dyn Transport>,
        events: EventTx,
        heartbeat: Duration,
        status: Arc<StandbyStatus>,
    ) -> anyhow::Result<Standby> {
        use anyhow::Context;
        let conn = transport
            .connect(primary, events.clone())
            .with_context(|| format!("--standby-of {primary}: cannot reach the primary"))?;
        let proto = StandbyProto::new(now, primary, conn.id(), Dur::from_std(heartbeat));
        Ok(Standby {
            proto,
            transport,
            events,
            conn: Some(conn),
            status,
            heartbeat,
        })
    }

    /// The transport (for the fencer, at the takeover).
    pub(super) fn transport(&self) -> Arc<dyn Transport> {
        self.transport.clone()
    }

    /// Whether `c` is the connection to the primary.
    pub(super) fn is_primary_conn(&self, c: crate::transport::ConnId) -> bool {
        self.conn.as_ref().is_some_and(|x| x.id() == c)
    }

    /// Carries out the connection-level actions (connect, send, close on the
    /// primary's connection); hands back those for the event loop (refusals
    /// of nodes, the takeover).
    pub(super) fn step(&mut self, now: Time) -> Vec<Action> {
        let mut rest = Vec::new();
        while let Some(a) = self.proto.poll_action() {
            match a {
                Action::Connect(addr) => match self.transport.connect(&addr, self.events.clone()) {
                    Ok(c) => {
                        let id = c.id();
                        self.conn = Some(c);
                        self.proto.handle_connected(now, id);
                    }
                    Err(e) => self.proto.handle_connect_failed(now, &format!("{e:#}")),
                },
                Action::Send(c, m) => {
                    if let Some(conn) = self.conn.as_ref().filter(|x| x.id() == c) {
                        let _ = conn.send(m);
                    }
                }
                Action::Close(c, why) => {
                    if let Some(conn) = self.conn.take_if(|x| x.id() == c) {
                        conn.close(&why);
                    }
                }
                other => rest.push(other),
            }
        }
        rest
    }
}

/// Fences `addr` with `term` every `every` on a thread of its own (a dial to
/// a paused process waits for the handshake's timeout: not on the event
/// loop), until `stop`; a newer term that answers is stored in `newer` (the
/// event loop steps its scheduler down on it).
pub(super) fn spawn_fencer(
    transport: Arc<dyn Transport>,
    addr: String,
    term: u64,
    every: Duration,
    newer: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sched-fence".into())
        .spawn(move || {
            let t0 = Instant::now();
            let now = || Time(t0.elapsed().as_nanos() as i64);
            let (tx, rx) = crate::transport::event_channel();
            let mut f = Fencer::new(now(), &addr, term, Dur::from_std(every));
            let mut conn: Option<Arc<dyn Conn>> = None;
            while !stop.load(Ordering::Acquire) {
                if now() >= f.poll_timeout() {
                    f.handle_timeout(now());
                }
                while let Some(a) = f.poll_action() {
                    match a {
                        fence::Action::Connect(addr) => match transport.connect(&addr, tx.clone()) {
                            Ok(c) => {
                                let id = c.id();
                                conn = Some(c);
                                f.handle_connected(now(), id);
                            }
                            Err(e) => {
                                tracing::debug!(addr = %addr, error = %format!("{e:#}"), "fence: nobody to fence");
                                f.handle_connect_failed(now());
                            }
                        },
                        fence::Action::Send(c, m) => {
                            if let Some(x) = conn.as_ref().filter(|x| x.id() == c) {
                                let _ = x.send(m);
                            }
                        }
                        fence::Action::Close(c, why) => {
                            if let Some(x) = conn.take_if(|x| x.id() == c) {
                                x.close(&why);
                            }
                        }
                        fence::Action::StepDown { term } => {
                            newer.fetch_max(term, Ordering::AcqRel);
                            return;
                        }
                    }
                }
                let wait = (f.poll_timeout() - now()).clamp(Dur::ZERO, Dur::from_ms(50));
                match rx.recv_timeout(Duration::from_nanos(wait.0 as u64)) {
                    Ok(Event::Msg(c, m)) => f.handle_msg(now(), c, m),
                    Ok(Event::Closed(c, _)) => {
                        conn.take_if(|x| x.id() == c);
                        f.handle_closed(now(), c);
                    }
                    Ok(Event::Accepted(_)) | Err(_) => {}
                }
            }
            if let Some(c) = conn {
                c.close("scheduler stopping");
            }
        })
}
