//! Fencing the replaced primary, as a pure state machine ([`Fencer`]): what a
//! standby that took over does towards its old primary's address while it
//! serves.
//!
//! A primary that is paused (SIGSTOP, a VM migration, a long GC-like stall)
//! or cut off long enough for its standby to take over is still a running
//! scheduler when it resumes. Nodes that follow the new primary refuse it by
//! its older term ([`super::member`]), but a node started later knows no term
//! yet and would join the first address it is given. So the new primary tells
//! the old address itself: every [`FENCE_EVERY_HEARTBEATS`] heartbeats it
//! connects there and sends `Fence { term }`.
//!
//! - A scheduler there of an older term steps down on it (an `Error` to each
//!   of its nodes, which go on to the next address; the process then ends);
//! - one of a newer term (this one was replaced in turn) answers with its own
//!   `Fence`: [`Action::StepDown`];
//! - a standby (the old primary started again as `--standby-of` the new one,
//!   on its old address) refuses the connection; nobody there: the dial
//!   fails. Either way the fencer tries again later, for as long as its
//!   scheduler serves (a dial costs one connection).
//!
//! An answer is awaited at most until the next dial; the connection is then
//! closed (a scheduler paused at that address holds it unanswered).
//!
//! # The rule, for every pair of terms
//! A serving scheduler of term `own` that receives `Fence { term }` steps down
//! when `term >= own` and answers with its own term otherwise
//! ([`on_fence`]); the fencer steps down on an answer of a term newer than
//! its own. So of the two exactly one serves on, whatever the terms: the
//! higher term, and at equal terms the fencer. Equal terms happen when a
//! standby takes over before it learnt its primary's term (the primary went
//! before its first `Pong`, itself serving a term above 1 after an earlier
//! takeover, and no node reached the standby first): a `Fence` comes only
//! from a scheduler that took over from the one at this address, so at an
//! equal term the one fenced is the one replaced.

use crate::core::{Dur, Time};
use crate::transport::ConnId;
use crate::wire::Msg;
use std::collections::VecDeque;

/// Heartbeats between two dials of the old primary's address.
pub const FENCE_EVERY_HEARTBEATS: i64 = 2;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Open a connection to this address; report it with
    /// [`Fencer::handle_connected`] or [`Fencer::handle_connect_failed`].
    Connect(String),
    Send(ConnId, Msg),
    Close(ConnId, String),
    /// A scheduler of a newer term answered: the one this fencer serves was
    /// replaced and must step down.
    StepDown {
        term: u64,
    },
}

/// What a serving scheduler does with a `Fence` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFence {
    /// It was replaced: it steps down.
    StepDown,
    /// Its term is newer: it answers `Fence` with it (the fencer steps down).
    Answer,
}

/// A serving scheduler of term `own` receiving `Fence { term: fence }`:
/// steps down at a term as new as its own or newer, answers an older one.
pub fn on_fence(own: u64, fence: u64) -> OnFence {
    if fence >= own {
        OnFence::StepDown
    } else {
        OnFence::Answer
    }
}

/// The fencing (see the module docs).
pub struct Fencer {
    addr: String,
    term: u64,
    every: Dur,
    next: Time,
    /// The dial under way, and since when.
    conn: Option<(ConnId, Time)>,
    /// Dialing (between `Connect` and its report).
    dialing: bool,
    stepped_down: bool,
    /// Fences delivered (a connection opened and `Fence` sent).
    pub sent: u64,
    out: VecDeque<Action>,
}

impl Fencer {
    /// Fences `addr` with `term` from `now` on, every `every`.
    pub fn new(now: Time, addr: &str, term: u64, every: Dur) -> Fencer {
        Fencer {
            addr: addr.to_string(),
            term,
            every: every.max(Dur::from_ms(1)),
            next: now,
            conn: None,
            dialing: false,
            stepped_down: false,
            sent: 0,
            out: VecDeque::new(),
        }
    }

    /// The address it fences.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether `c` is its connection.
    pub fn is_conn(&self, c: ConnId) -> bool {
        self.conn.is_some_and(|(x, _)| x == c)
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// When [`Fencer::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Time {
        if self.stepped_down || self.dialing {
            return Time::NEVER;
        }
        match self.conn {
            Some((_, since)) => since + self.every,
            None => self.next,
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        if self.stepped_down || self.dialing {
            return;
        }
        if let Some((c, since)) = self.conn {
            if now < since + self.every {
                return;
            }
            self.conn = None;
            self.out
                .push_back(Action::Close(c, "fence: no answer".into()));
        }
        if now >= self.next {
            self.next = now + self.every;
            self.dialing = true;
            self.out.push_back(Action::Connect(self.addr.clone()));
        }
    }

    /// The connection asked for is up: the fence goes out.
    pub fn handle_connected(&mut self, now: Time, c: ConnId) {
        self.dialing = false;
        if self.stepped_down {
            return self.out.push_back(Action::Close(c, "stepped down".into()));
        }
        self.conn = Some((c, now));
        self.sent += 1;
        self.out
            .push_back(Action::Send(c, Msg::Fence { term: self.term }));
    }

    /// Nobody there (or it cannot be reached): tried again later.
    pub fn handle_connect_failed(&mut self, _now: Time) {
        self.dialing = false;
    }

    /// A message on connection `c`: a newer term steps this scheduler down;
    /// anything else ends the dial.
    pub fn handle_msg(&mut self, _now: Time, c: ConnId, msg: Msg) {
        if !self.is_conn(c) || self.stepped_down {
            return;
        }
        self.conn = None;
        if let Msg::Fence { term } = msg {
            if term > self.term {
                self.stepped_down = true;
                self.out.push_back(Action::Close(c, "fenced".into()));
                return self.out.push_back(Action::StepDown { term });
            }
        }
        self.out
            .push_back(Action::Close(c, "fence delivered".into()));
    }

    pub fn handle_closed(&mut self, _now: Time, c: ConnId) {
        if self.is_conn(c) {
            self.conn = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: i64) -> Time {
        Time(v * 1_000_000)
    }

    fn drain(f: &mut Fencer) -> Vec<Action> {
        std::iter::from_fn(|| f.poll_action()).collect()
    }

    /// For every pair of terms (ties, 0, the largest included), a fence
    /// between two serving schedulers leaves exactly one serving: the
    /// higher term, and at equal terms the fencer.
    #[test]
    fn a_fence_leaves_exactly_one_scheduler_serving_for_every_pair_of_terms() {
        let terms = [0, 1, 2, 3, 4, 7, u64::MAX - 1, u64::MAX];
        for &fencer_term in &terms {
            for &fenced_term in &terms {
                let mut f = Fencer::new(ms(0), "old", fencer_term, Dur::from_ms(200));
                f.handle_timeout(ms(0));
                f.handle_connected(ms(1), 3);
                drain(&mut f);
                // The fenced scheduler's side.
                let fenced_serves = match on_fence(fenced_term, fencer_term) {
                    OnFence::StepDown => false,
                    OnFence::Answer => {
                        f.handle_msg(ms(2), 3, Msg::Fence { term: fenced_term });
                        true
                    }
                };
                let fencer_serves = !drain(&mut f)
                    .iter()
                    .any(|a| matches!(a, Action::StepDown { .. }));
                assert!(
                    fencer_serves != fenced_serves,
                    "fencer {fencer_term}, fenced {fenced_term}: exactly one serves"
                );
                let winner = if fencer_serves {
                    fencer_term
                } else {
                    fenced_term
                };
                assert_eq!(winner, fencer_term.max(fenced_term));
                if fencer_term == fenced_term {
                    assert!(fencer_serves, "a tie goes to the fencer");
                }
            }
        }
    }

    #[test]
    fn it_dials_the_old_address_again_and_again_and_sends_its_term() {
        let mut f = Fencer::new(ms(0), "old", 2, Dur::from_ms(200));
        assert_eq!(f.poll_timeout(), ms(0));
        f.handle_timeout(ms(0));
        assert_eq!(drain(&mut f), vec![Action::Connect("old".into())]);
        assert_eq!(f.poll_timeout(), Time::NEVER, "one dial at a time");
        f.handle_connect_failed(ms(1));
        assert_eq!(f.poll_timeout(), ms(200));
        f.handle_timeout(ms(200));
        assert_eq!(drain(&mut f), vec![Action::Connect("old".into())]);
        f.handle_connected(ms(201), 5);
        assert_eq!(drain(&mut f), vec![Action::Send(5, Msg::Fence { term: 2 })]);
        // A scheduler of an older term closes after it hears it: next dial later.
        f.handle_closed(ms(202), 5);
        f.handle_timeout(ms(400));
        assert_eq!(drain(&mut f), vec![Action::Connect("old".into())]);
        // One paused there holds the connection: closed at the next dial.
        f.handle_connected(ms(400), 6);
        drain(&mut f);
        f.handle_timeout(ms(600));
        assert_eq!(
            drain(&mut f),
            vec![
                Action::Close(6, "fence: no answer".into()),
                Action::Connect("old".into())
            ]
        );
        assert_eq!(f.sent, 2);
    }

    #[test]
    fn a_newer_term_answering_steps_its_scheduler_down() {
        let mut f = Fencer::new(ms(0), "old", 2, Dur::from_ms(200));
        f.handle_timeout(ms(0));
        f.handle_connected(ms(1), 5);
        drain(&mut f);
        // An older or equal term, or a refusal, is no reason to step down.
        f.handle_msg(ms(2), 5, Msg::Fence { term: 2 });
        assert_eq!(
            drain(&mut f),
            vec![Action::Close(5, "fence delivered".into())]
        );
        f.handle_timeout(ms(200));
        f.handle_connected(ms(201), 6);
        drain(&mut f);
        f.handle_msg(ms(202), 7, Msg::Fence { term: 9 });
        assert!(drain(&mut f).is_empty(), "not its connection");
        f.handle_msg(ms(202), 6, Msg::Fence { term: 3 });
        assert_eq!(
            drain(&mut f),
            vec![
                Action::Close(6, "fenced".into()),
                Action::StepDown { term: 3 }
            ]
        );
        assert_eq!(f.poll_timeout(), Time::NEVER);
    }
}
