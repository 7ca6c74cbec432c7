//! Dialling frontends again: a backend's control connection to a frontend
//! (the one its outputs go back on) that closes while the scheduler still
//! announces the frontend is dialled again after [`REDIAL_AFTER`], and again
//! after each failed dial, until it is up or the frontend is announced down.
//! Without it a reset left the backend unable to deliver that frontend's
//! outputs until the scheduler announced the frontend again. Pure: the time
//! is an argument; the driver dials off its event loop
//! ([`super::backend::Action::Redial`]).

use crate::core::{Dur, Time};
use crate::wire::NodeId;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// How long after a frontend's connection closed, or a dial of it failed,
/// it is dialled (again).
pub const REDIAL_AFTER: Dur = Dur(500_000_000);

/// The frontends announced up and the dials of those whose connection is
/// down.
#[derive(Debug, Default)]
pub struct Redials {
    /// Each frontend announced up: its control address.
    announced: HashMap<NodeId, String>,
    /// When each frontend whose connection is down is dialled next.
    due: BTreeMap<NodeId, Time>,
    /// Frontends being dialled.
    dialling: BTreeSet<NodeId>,
}

impl Redials {
    /// Frontend `node` is announced up at `ctrl_addr` (the driver connects).
    pub fn up(&mut self, node: NodeId, ctrl_addr: &str) {
        self.announced.insert(node, ctrl_addr.to_string());
        self.due.remove(&node);
        self.dialling.remove(&node);
    }

    /// Frontend `node` is down: it is not dialled any more.
    pub fn down(&mut self, node: NodeId) {
        self.announced.remove(&node);
        self.due.remove(&node);
        self.dialling.remove(&node);
    }

    /// The scheduler is lost: every frontend is forgotten.
    pub fn clear(&mut self) {
        *self = Redials::default();
    }

    /// Frontend `node`'s connection closed at `now`.
    pub fn closed(&mut self, now: Time, node: NodeId) {
        if self.announced.contains_key(&node) && !self.dialling.contains(&node) {
            self.due.insert(node, now + REDIAL_AFTER);
        }
    }

    /// A dial of frontend `node` failed at `now`.
    pub fn failed(&mut self, now: Time, node: NodeId) {
        if self.dialling.remove(&node) && self.announced.contains_key(&node) {
            self.due.insert(node, now + REDIAL_AFTER);
        }
    }

    /// Frontend `node` is connected.
    pub fn connected(&mut self, node: NodeId) {
        self.due.remove(&node);
        self.dialling.remove(&node);
    }

    /// Whether a dial of `node` that just succeeded is still wanted (the
    /// frontend was not announced down or up again meanwhile).
    pub fn wants(&self, node: NodeId) -> bool {
        self.dialling.contains(&node) && self.announced.contains_key(&node)
    }

    /// The earliest dial due (`Time::NEVER`: none).
    pub fn next(&self) -> Time {
        self.due.values().copied().min().unwrap_or(Time::NEVER)
    }

    /// The dials due by `now` (frontend, control address), each now under way.
    pub fn take_due(&mut self, now: Time) -> Vec<(NodeId, String)> {
        let due: Vec<NodeId> = self
            .due
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(&n, _)| n)
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for n in due {
            self.due.remove(&n);
            if let Some(addr) = self.announced.get(&n) {
                self.dialling.insert(n);
                out.push((n, addr.clone()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that closes is dialled after the pause, again after a
    /// failed dial, not once it is up, and not once the frontend is down.
    #[test]
    fn a_closed_frontend_is_dialled_until_up_or_down() {
        let t0 = Time::ZERO;
        let mut r = Redials::default();
        r.up(3, "fe:1");
        assert_eq!(r.next(), Time::NEVER);
        r.closed(t0, 3);
        assert_eq!(r.next(), t0 + REDIAL_AFTER);
        assert!(r.take_due(t0).is_empty(), "not before the pause");
        assert_eq!(r.take_due(t0 + REDIAL_AFTER), vec![(3, "fe:1".to_string())]);
        assert_eq!(r.next(), Time::NEVER, "under way");
        assert!(r.wants(3));
        let t1 = t0 + REDIAL_AFTER;
        r.failed(t1, 3);
        assert!(!r.wants(3));
        assert_eq!(
            r.take_due(t1 + REDIAL_AFTER).len(),
            1,
            "again after a failure"
        );
        r.connected(3);
        assert!(!r.wants(3));
        assert_eq!(r.next(), Time::NEVER);
        // Down while a dial is due or under way: no dial, none wanted.
        r.closed(t1, 3);
        r.down(3);
        assert!(r.take_due(t1 + REDIAL_AFTER * 2).is_empty());
        r.up(4, "fe:2");
        r.closed(t1, 4);
        assert_eq!(r.take_due(t1 + REDIAL_AFTER).len(), 1);
        r.down(4);
        assert!(!r.wants(4));
        r.failed(t1, 4);
        assert_eq!(r.next(), Time::NEVER);
        // A frontend never announced, or forgotten with the scheduler.
        r.closed(t1, 9);
        r.up(5, "fe:3");
        r.clear();
        r.closed(t1, 5);
        assert_eq!(r.next(), Time::NEVER);
    }
}
