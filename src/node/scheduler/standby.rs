//! A hot-standby scheduler (`fermata scheduler --standby-of ADDR`): it runs
//! the whole scheduler from the start, listening at its own address, but
//! follows the primary until the primary is gone and only then serves.
//!
//! While following, it keeps a connection to the primary (authenticated like
//! any node's) and pings it every heartbeat. The primary is gone when that
//! connection closes and a new one cannot be opened at once, or when no pong
//! came for [`SILENT_HEARTBEATS`] heartbeats. Then the standby takes over
//! ([`Standby::promoted`]).
//!
//! Nodes know both addresses (`--scheduler PRIMARY,STANDBY`) and try the
//! standby at once when they lose the primary (see
//! [`crate::node::proto::member`]). A node that reaches the standby before
//! it took over is accepted, but its messages are held, not answered; they
//! are handed to the protocol machine when the standby takes over, so the
//! node's clock sync and registration simply complete then. A node that lost
//! the primary while the standby still hears it (a partition between the node
//! and the primary only) is never answered, gives the standby up after its
//! scheduler timeout and goes back to the primary's address.
//!
//! What a standby does not take over: the primary's state. The nodes
//! register anew (backends keep their models loaded, so this is quick) and
//! the frontends fail the requests that were pending at the primary
//! explicitly (each ends exactly once, none is lost). Two schedulers serve at
//! once only when the standby loses the primary and the nodes do not: the
//! nodes stay with the primary and the standby has none.

use crate::transport::{Conn, ConnId, EventTx, Transport};
use crate::wire::{Dur, Msg, Time};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A primary silent for this many heartbeats is gone.
pub const SILENT_HEARTBEATS: u32 = 3;
/// Messages of waiting nodes held before the standby takes over; beyond, the
/// connection that sent the next one is closed (it retries).
pub const HOLD_MAX: usize = 65_536;

/// What the process sees of its standby (shared with [`super::SchedulerNode`]).
#[derive(Debug, Default)]
pub struct StandbyStatus {
    /// Whether it took over.
    pub promoted: AtomicBool,
    /// Why it took over, and how long after the first sign of trouble.
    pub took_over: Mutex<Option<(String, Duration)>>,
}

/// The following half of a standby scheduler's event loop.
pub(super) struct Standby {
    primary: String,
    transport: Arc<dyn Transport>,
    events: EventTx,
    conn: Option<Arc<dyn Conn>>,
    heartbeat: Duration,
    last_pong: Instant,
    next_ping: Instant,
    seq: u64,
    held: Vec<(ConnId, Msg)>,
    status: Arc<StandbyStatus>,
}

/// What the event loop must do with an event, while following.
pub(super) enum Seen {
    /// The standby's own business (its connection to the primary).
    Mine,
    /// Held until the standby takes over.
    Held,
    /// Held no more: too many; close this connection.
    Overflow,
}

impl Standby {
    /// Follows `primary`: connects to it now (an error when it cannot: a
    /// standby starts next to a running primary).
    pub(super) fn follow(
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
        let now = Instant::now();
        Ok(Standby {
            primary: primary.to_string(),
            transport,
            events,
            conn: Some(conn),
            heartbeat,
            last_pong: now,
            next_ping: now,
            seq: 0,
            held: Vec::new(),
            status,
        })
    }

    pub(super) fn primary(&self) -> &str {
        &self.primary
    }

    /// Whether connection `c` is the standby's own, to the primary.
    fn is_mine(&self, c: ConnId) -> bool {
        self.conn.as_ref().is_some_and(|x| x.id() == c)
    }

    /// A message on connection `c`.
    pub(super) fn on_msg(&mut self, c: ConnId, msg: Msg) -> Seen {
        if self.is_mine(c) {
            if let Msg::Pong { .. } = msg {
                self.last_pong = Instant::now();
            }
            return Seen::Mine;
        }
        if self.held.len() >= HOLD_MAX {
            return Seen::Overflow;
        }
        self.held.push((c, msg));
        Seen::Held
    }

    /// Connection `c` closed; Some(why) when that means the primary is gone.
    pub(super) fn on_closed(&mut self, c: ConnId, reason: &str) -> Option<String> {
        if !self.is_mine(c) {
            return None;
        }
        self.conn = None;
        // A connection can end for other reasons than the primary's death: a
        // new one that opens says it lives.
        match self.transport.connect(&self.primary, self.events.clone()) {
            Ok(conn) => {
                tracing::info!(primary = %self.primary, reason, "standby: the connection to the primary closed; reconnected");
                self.conn = Some(conn);
                self.last_pong = Instant::now();
                self.next_ping = self.last_pong;
                None
            }
            Err(e) => Some(format!(
                "its connection closed ({reason}) and it cannot be reached: {e:#}"
            )),
        }
    }

    /// Pings the primary when due; Some(why) when it has been silent too long.
    pub(super) fn tick(&mut self, now: Instant, sched_now: Time) -> Option<String> {
        let silent = now.duration_since(self.last_pong);
        if silent > self.heartbeat * SILENT_HEARTBEATS {
            return Some(format!("no pong for {} ms", silent.as_millis()));
        }
        if now >= self.next_ping {
            self.seq += 1;
            self.next_ping = now + self.heartbeat;
            if let Some(c) = &self.conn {
                let _ = c.send(Msg::Ping {
                    seq: self.seq,
                    sent: sched_now,
                    ctrl_delay: Dur::ZERO,
                    pull: Dur::ZERO,
                });
            }
        }
        None
    }

    /// When [`Standby::tick`] is next due.
    pub(super) fn next_tick(&self) -> Instant {
        self.next_ping
            .min(self.last_pong + self.heartbeat * SILENT_HEARTBEATS)
    }

    /// Takes over: records why, closes the connection to the primary and hands
    /// back the held messages, in order.
    pub(super) fn promote(mut self, why: &str, since: Instant) -> Vec<(ConnId, Msg)> {
        let after = since.elapsed();
        if let Some(c) = self.conn.take() {
            c.close("standby taking over");
        }
        tracing::warn!(primary = %self.primary, reason = why, "standby: the primary is gone; taking over");
        *self.status.took_over.lock().expect("status lock") = Some((why.to_string(), after));
        self.status.promoted.store(true, Ordering::Release);
        std::mem::take(&mut self.held)
    }

    /// When the primary was last heard from (the first sign of trouble is
    /// after it).
    pub(super) fn last_heard(&self) -> Instant {
        self.last_pong
    }
}
