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
//! What a standby does not take over: the primary's state. The nodes
//! register anew (backends keep their models loaded, so this is quick) and
//! the frontends submit the requests that were pending at the primary again,
//! under new task ids (each ends exactly once, none is lost). Two schedulers serve at
//! once only when the standby loses the primary and the nodes do not: the
//! nodes stay with the primary and the standby has none.

use crate::node::proto::standby::StandbyProto;
use crate::transport::{Conn, EventTx, Transport};
use crate::wire::{Dur, Time};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        })
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
