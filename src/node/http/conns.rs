//! The HTTP server's open connections ([`Conns`]): a cap, and which connection
//! gives way when a new one comes at the cap.
//!
//! At the cap a new connection closes the one that has waited longest for its
//! next request (an idle keep-alive connection, or one still sending its head),
//! so connections that sit and wait cannot lock legitimate clients out; with
//! none waiting (every connection in a request) the new one is refused with 503.
//! Written here rather than taken from a crate: tower's concurrency limits
//! queue or refuse new work, none of them closes an idle connection to make
//! room, which is what keeps the server reachable under a connection flood.

use crate::metrics::{Counter, Gauge, Registry};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `waiting_since` of a connection in a request.
const BUSY: u64 = u64::MAX;
/// `waiting_since` of a connection told to close.
const EVICTED: u64 = u64::MAX - 1;

/// The server's connections.
pub(super) struct Conns {
    max: usize,
    start: Instant,
    table: Mutex<Table>,
    open: Option<Gauge>,
    evicted: Option<Counter>,
    refused: Option<Counter>,
    /// Notified whenever a connection ends (see [`Conns::settle`]).
    room: tokio::sync::Notify,
}

#[derive(Default)]
struct Table {
    next: u64,
    slots: HashMap<u64, Arc<Slot>>,
    /// Slots told to close whose connections have not ended yet (not counted
    /// against the cap: they are on their way out).
    closing: usize,
}

/// One connection's entry: since when it waits for a request, and the signal
/// that tells it to close.
pub(super) struct Slot {
    /// Milliseconds from [`Conns`]' start to when the connection began waiting
    /// for its next request; [`BUSY`] in a request, [`EVICTED`] once told to close.
    waiting_since: AtomicU64,
    /// Notified when the connection must close.
    pub(super) evict: tokio::sync::Notify,
}

/// A connection admitted: its slot, freed when dropped.
pub(super) struct Admitted {
    conns: Arc<Conns>,
    id: u64,
    pub(super) slot: Arc<Slot>,
}

impl Conns {
    /// At most `max` connections; their series in `reg` when given.
    pub(super) fn new(max: usize, reg: Option<&Registry>) -> Arc<Conns> {
        let closed = |r: &Registry, reason: &str| {
            r.counter(
                "fermata_http_connections_closed_total",
                "HTTP connections closed by the server's connection cap: `evicted` (the longest-waiting, to admit a new one), `refused` (a new one, none waiting).",
                &[("reason", reason)],
            )
        };
        Arc::new(Conns {
            max: max.max(1),
            start: Instant::now(),
            table: Mutex::new(Table::default()),
            open: reg.map(|r| r.gauge("fermata_http_connections", "HTTP connections open.", &[])),
            evicted: reg.map(|r| closed(r, "evicted")),
            refused: reg.map(|r| closed(r, "refused")),
            room: tokio::sync::Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Admits a new connection, telling the longest-waiting one to close when
    /// at the cap; None (refuse it) when at the cap with none waiting.
    pub(super) fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut t = self.table.lock().expect("conns lock");
        if t.slots.len() - t.closing >= self.max {
            if !Self::evict_locked(&mut t) {
                drop(t);
                if let Some(c) = &self.refused {
                    c.inc();
                }
                return None;
            }
            if let Some(c) = &self.evicted {
                c.inc();
            }
        }
        let id = t.next;
        t.next += 1;
        let slot = Arc::new(Slot {
            waiting_since: AtomicU64::new(self.now_ms()),
            evict: tokio::sync::Notify::new(),
        });
        t.slots.insert(id, slot.clone());
        self.set_open(&t);
        Some(Admitted {
            conns: self.clone(),
            id,
            slot,
        })
    }

    /// Tells the longest-waiting connection to close (to free a file
    /// descriptor after an accept error); false when none waits.
    pub(super) fn evict_one(&self) -> bool {
        let mut t = self.table.lock().expect("conns lock");
        let done = Self::evict_locked(&mut t);
        if done {
            if let Some(c) = &self.evicted {
                c.inc();
            }
        }
        done
    }

    fn evict_locked(t: &mut Table) -> bool {
        let oldest = t
            .slots
            .values()
            .filter(|s| s.waiting_since.load(Ordering::Acquire) < EVICTED)
            .min_by_key(|s| s.waiting_since.load(Ordering::Acquire))
            .cloned();
        let Some(s) = oldest else {
            return false;
        };
        s.waiting_since.store(EVICTED, Ordering::Release);
        s.evict.notify_one();
        t.closing += 1;
        true
    }

    fn set_open(&self, t: &Table) {
        if let Some(g) = &self.open {
            g.set(t.slots.len() as f64);
        }
    }

    /// Connections open now (those told to close included).
    fn open(&self) -> usize {
        self.table.lock().expect("conns lock").slots.len()
    }

    /// Waits (at most [`SETTLE_WAIT`]) until the connections still open, those
    /// told to close included, are within the cap. A connection told to close
    /// holds its file descriptor until its task ends; the accept loop waits
    /// here before it accepts more, so a flood cannot open descriptors faster
    /// than evicted connections give theirs back (which ran the process into
    /// EMFILE under `ulimit -n 1024`).
    pub(super) async fn settle(&self) {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let ended = self.room.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.open() <= self.max {
                return;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return;
            }
        }
    }
}

/// The longest the accept loop waits for evicted connections to end (one that
/// is in a request closes once answered: it is not waited for).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

impl Admitted {
    /// The connection is in a request: it is not closed to make room.
    pub(super) fn busy(&self) {
        let _ = self
            .slot
            .waiting_since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w != EVICTED).then_some(BUSY)
            });
    }
    /// The connection's request is answered: it waits for the next one.
    pub(super) fn waiting(&self) {
        let now = self.conns.now_ms();
        let _ = self
            .slot
            .waiting_since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w != EVICTED).then_some(now)
            });
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut t = self.conns.table.lock().expect("conns lock");
        if t.slots.remove(&self.id).is_some()
            && self.slot.waiting_since.load(Ordering::Acquire) == EVICTED
        {
            t.closing -= 1;
        }
        self.conns.set_open(&t);
        drop(t);
        self.conns.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_evicts_the_longest_waiting_and_refuses_when_all_are_busy() {
        let reg = Registry::new();
        let c = Conns::new(2, Some(&reg));
        let a = c.admit().expect("a");
        std::thread::sleep(std::time::Duration::from_millis(3));
        let b = c.admit().expect("b");
        // At the cap: `a` waited longest and is told to close.
        let d = c.admit().expect("d evicts a");
        assert_eq!(a.slot.waiting_since.load(Ordering::Acquire), EVICTED);
        assert!(b.slot.waiting_since.load(Ordering::Acquire) < EVICTED);
        assert_eq!(c.open(), 3, "a is open until its connection ends");
        drop(a);
        assert_eq!(c.open(), 2);
        // Both in requests: nothing to evict, the next is refused.
        b.busy();
        d.busy();
        assert!(c.admit().is_none());
        // One answered: it gives way.
        b.waiting();
        let e = c.admit().expect("e evicts b");
        assert_eq!(b.slot.waiting_since.load(Ordering::Acquire), EVICTED);
        // An evicted connection stays evicted when its request state changes.
        b.busy();
        b.waiting();
        assert_eq!(b.slot.waiting_since.load(Ordering::Acquire), EVICTED);
        drop((b, d, e));
        assert_eq!(c.open(), 0);
        let text = reg.render();
        assert!(
            text.contains("fermata_http_connections_closed_total{reason=\"evicted\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("fermata_http_connections_closed_total{reason=\"refused\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn an_accept_error_frees_a_waiting_connection_only() {
        let c = Conns::new(8, None);
        let a = c.admit().expect("a");
        a.busy();
        assert!(!c.evict_one(), "a is in a request");
        a.waiting();
        assert!(c.evict_one());
        assert!(!c.evict_one(), "a is already closing");
    }
}
