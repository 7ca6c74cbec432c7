//! A hot-standby scheduler's following as a pure state machine
//! ([`StandbyProto`]), driven by the real scheduler's event loop
//! (`src/node/scheduler/standby.rs`) and by the cluster simulator alike.
//!
//! The standby listens from the start but serves no one while it follows the
//! primary over a connection of its own, pinging it every heartbeat. The
//! primary is **gone** when that connection closes and a new one cannot be
//! opened (or closes again before a pong), or when no pong came for
//! [`SILENT_HEARTBEATS`] heartbeats. Then the standby **takes over**
//! ([`Action::TakeOver`]): it closes its connection to the primary and hands
//! its owner the messages it held, in order, for the scheduler's protocol
//! machine.
//!
//! What nodes send it meanwhile is held, not answered: a node that lost the
//! primary reaches the standby before (or just after) the standby sees the
//! primary go, and its clock sync and registration complete at the takeover.
//! A connection whose messages have waited [`HOLD_HEARTBEATS`] heartbeats
//! while the primary still answers is refused ([`Action::Refuse`]: an `Error`
//! that names the primary, then a close): that node lost only its own path to
//! the primary, or started with the standby's address first, and goes back
//! to the primary.
//!
//! The primary also tells its standby the models' states under model control
//! (`ModelStates`, as it tells its frontends: every model's when the standby
//! follows, then those that change); the standby keeps the latest of each
//! and hands them over at the takeover, so loads and unloads done at the
//! primary survive it (see [`super::control::Control::adopt`]).
//!
//! The standby keeps the highest scheduler term it saw: its primary's (each
//! `Pong` carries it), and any that nodes' pings or a `Fence` carry. It takes
//! over under the next term ([`Action::TakeOver`]'s `term`, at least 2: a
//! primary started alone serves term 1), so nodes that follow it refuse the
//! old primary should it come back, and the old primary steps down when it
//! hears of the new term (see [`super::sched`] and [`super::fence`]).

use crate::core::ModelId;
use crate::core::{Dur, Time};
use crate::transport::ConnId;
use crate::wire::{ModelStateItem, Msg, MAX_ITEMS};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A primary silent for this many heartbeats is gone.
pub const SILENT_HEARTBEATS: i64 = 3;
/// A node's messages are held at most this many heartbeats while the primary
/// lives.
pub const HOLD_HEARTBEATS: i64 = 1;
/// Messages held in all; beyond, the connection that sent the next is refused.
pub const HOLD_MAX: usize = 65_536;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Open a connection to the primary; report it with
    /// [`StandbyProto::handle_connected`] or [`StandbyProto::handle_connect_failed`].
    Connect(String),
    /// Send on the connection to the primary.
    Send(ConnId, Msg),
    /// Close a connection (the one to the primary, taking over).
    Close(ConnId, String),
    /// Answer `Error` with the reason on a node's connection, then close it.
    Refuse(ConnId, String),
    /// Serve from now on: the held messages, in the order they came, after
    /// taking the primary's last assignment of models to sub-clusters (none
    /// received: the start-up one stays).
    TakeOver {
        why: String,
        held: Vec<(ConnId, Msg)>,
        assignment: Option<Vec<u32>>,
        /// The primary's latest state of each model under model control, by
        /// model id (empty: none received; the start-up states stay).
        states: Vec<ModelStateItem>,
        /// The primary's latest latency scales, in millionths by model id
        /// (None: none received; every scale starts at 1).
        scales: Option<Vec<u32>>,
        /// The term it serves under from now on.
        term: u64,
    },
}

/// The following (see the module docs).
pub struct StandbyProto {
    primary: String,
    heartbeat: Dur,
    conn: Option<ConnId>,
    /// Connections to the primary that closed since its last pong.
    closes: u32,
    last_pong: Time,
    next_ping: Time,
    seq: u64,
    held: Vec<(ConnId, Msg)>,
    /// The primary's assignment of models to sub-clusters, as it last sent it.
    assignment: Option<Vec<u32>>,
    /// The primary's latency scales, as it last sent them.
    scales: Option<Vec<u32>>,
    /// The primary's models' states, as it last sent each (at most
    /// [`MAX_ITEMS`] models).
    states: BTreeMap<ModelId, ModelStateItem>,
    /// When each node connection's first held message came.
    held_since: HashMap<ConnId, Time>,
    /// The highest scheduler term seen (the primary's, or a node's).
    term: u64,
    done: bool,
    out: VecDeque<Action>,
}

impl StandbyProto {
    /// Follows `primary`, already connected as `conn` at `now`.
    pub fn new(now: Time, primary: &str, conn: ConnId, heartbeat: Dur) -> StandbyProto {
        let out = VecDeque::from([Action::Send(conn, Msg::Follow)]);
        StandbyProto {
            primary: primary.to_string(),
            heartbeat,
            conn: Some(conn),
            closes: 0,
            last_pong: now,
            next_ping: now,
            seq: 0,
            held: Vec::new(),
            assignment: None,
            scales: None,
            states: BTreeMap::new(),
            held_since: HashMap::new(),
            term: 0,
            done: false,
            out,
        }
    }

    pub fn primary(&self) -> &str {
        &self.primary
    }

    /// When the primary last answered (or the following began).
    pub fn last_pong(&self) -> Time {
        self.last_pong
    }

    /// Whether `c` is the connection to the primary.
    pub fn is_primary_conn(&self, c: ConnId) -> bool {
        self.conn == Some(c)
    }

    /// The highest scheduler term it saw.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Whether it took over (it follows no more).
    pub fn took_over(&self) -> bool {
        self.done
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// When [`StandbyProto::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Time {
        if self.done {
            return Time::NEVER;
        }
        let hold = self
            .held_since
            .values()
            .min()
            .map_or(Time::NEVER, |&t| t + self.heartbeat * HOLD_HEARTBEATS);
        self.next_ping
            .min(self.last_pong + self.heartbeat * SILENT_HEARTBEATS)
            .min(hold)
    }

    /// The connection to the primary asked for is up.
    pub fn handle_connected(&mut self, now: Time, conn: ConnId) {
        if self.done {
            return self
                .out
                .push_back(Action::Close(conn, "standby took over".into()));
        }
        self.conn = Some(conn);
        self.next_ping = now;
        self.out.push_back(Action::Send(conn, Msg::Follow));
    }

    /// The primary's assignment as it last sent it.
    pub fn assignment(&self) -> Option<&[u32]> {
        self.assignment.as_deref()
    }

    /// The primary's models' states as it last sent them, by model id.
    pub fn model_states(&self) -> Vec<ModelStateItem> {
        self.states.values().cloned().collect()
    }

    /// The connection to the primary could not be opened: it is gone.
    pub fn handle_connect_failed(&mut self, _now: Time, why: &str) {
        self.take_over(format!("it cannot be reached: {why}"));
    }

    /// Connection `c` closed.
    pub fn handle_closed(&mut self, _now: Time, c: ConnId, why: &str) {
        if self.done {
            return;
        }
        if self.conn == Some(c) {
            self.conn = None;
            self.closes += 1;
            if self.closes > 1 {
                return self
                    .take_over(format!("its connection closed again before a pong ({why})"));
            }
            // A connection can end for other reasons than the primary's
            // death: one new connection that answers says it lives.
            let p = self.primary.clone();
            return self.out.push_back(Action::Connect(p));
        }
        self.held.retain(|(x, _)| *x != c);
        self.held_since.remove(&c);
    }

    /// A message on connection `c` (the primary's, or a node's: held).
    pub fn handle_msg(&mut self, now: Time, c: ConnId, msg: Msg) {
        if self.done {
            return;
        }
        if self.conn == Some(c) {
            match msg {
                Msg::Pong { term, .. } => {
                    self.last_pong = now;
                    self.closes = 0;
                    self.term = self.term.max(term);
                }
                Msg::Assignment { homes } => self.assignment = Some(homes),
                Msg::LatencyScales { ppm } => self.scales = Some(ppm),
                Msg::ModelStates { items } => {
                    for i in items {
                        if self.states.len() < MAX_ITEMS || self.states.contains_key(&i.model) {
                            self.states.insert(i.model, i);
                        }
                    }
                }
                _ => {}
            }
            return;
        }
        match &msg {
            Msg::Ping { term, .. } => self.term = self.term.max(*term),
            &Msg::Fence { term } => {
                // A scheduler that took over from this one's old self (this
                // address) tells its term: learnt; nothing to answer.
                self.term = self.term.max(term);
                return self.refuse(c, "this is a standby scheduler".into());
            }
            _ => {}
        }
        if self.held.len() >= HOLD_MAX {
            return self.refuse(c, "standby: too many messages held".into());
        }
        self.held_since.entry(c).or_insert(now);
        self.held.push((c, msg));
    }

    pub fn handle_timeout(&mut self, now: Time) {
        if self.done {
            return;
        }
        let silent = now - self.last_pong;
        if silent >= self.heartbeat * SILENT_HEARTBEATS {
            return self.take_over(format!("no pong for {:.0} ms", silent.as_ms_f64()));
        }
        let limit = self.heartbeat * HOLD_HEARTBEATS;
        let mut late: Vec<ConnId> = self
            .held_since
            .iter()
            .filter(|(_, &t)| now - t >= limit)
            .map(|(&c, _)| c)
            .collect();
        late.sort_unstable();
        for c in late {
            let why = format!(
                "this is a standby scheduler and its primary at {} is alive: connect there",
                self.primary
            );
            self.refuse(c, why);
        }
        if now >= self.next_ping {
            self.seq += 1;
            self.next_ping = now + self.heartbeat;
            if let Some(c) = self.conn {
                self.out.push_back(Action::Send(
                    c,
                    Msg::Ping {
                        seq: self.seq,
                        sent: now,
                        ctrl_delay: Dur::ZERO,
                        pull: Dur::ZERO,
                        pull_per_mib: Dur::ZERO,
                        pull_hold: Dur::ZERO,
                        pull_hold_per_mib: Dur::ZERO,
                        term: self.term,
                    },
                ));
            }
        }
    }

    fn refuse(&mut self, c: ConnId, why: String) {
        self.held.retain(|(x, _)| *x != c);
        self.held_since.remove(&c);
        self.out.push_back(Action::Refuse(c, why));
    }

    fn take_over(&mut self, why: String) {
        self.done = true;
        if let Some(c) = self.conn.take() {
            self.out
                .push_back(Action::Close(c, "standby taking over".into()));
        }
        self.held_since.clear();
        let held = std::mem::take(&mut self.held);
        self.out.push_back(Action::TakeOver {
            why: format!("primary {}: {why}", self.primary),
            held,
            assignment: self.assignment.take(),
            states: std::mem::take(&mut self.states).into_values().collect(),
            scales: self.scales.take(),
            // (Saturating: a member may send any term.)
            term: self.term.max(1).saturating_add(1),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: i64) -> Time {
        Time(Dur::from_ms(v).0)
    }

    fn drain(p: &mut StandbyProto) -> Vec<Action> {
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    fn ping() -> Msg {
        Msg::ListModels
    }

    #[test]
    fn it_follows_while_the_primary_answers_and_holds_what_nodes_send() {
        let hb = Dur::from_ms(100);
        let mut p = StandbyProto::new(ms(0), "a", 1, hb);
        p.handle_timeout(ms(0));
        assert!(matches!(
            &drain(&mut p)[..],
            [
                Action::Send(1, Msg::Follow),
                Action::Send(1, Msg::Ping { .. })
            ]
        ));
        let pong = Msg::Pong {
            seq: 1,
            echo: ms(0),
            sched: ms(0),
            term: 1,
        };
        for t in [100, 200, 300, 400] {
            p.handle_msg(ms(t - 1), 1, pong.clone());
            p.handle_timeout(ms(t));
        }
        assert!(!p.took_over());
        // A node's messages are held, then refused after the hold while the
        // primary lives.
        p.handle_msg(ms(410), 7, ping());
        p.handle_msg(ms(420), 7, ping());
        drain(&mut p);
        for t in [500, 600, 700] {
            p.handle_msg(ms(t - 1), 1, pong.clone());
            p.handle_timeout(ms(t));
        }
        p.handle_timeout(ms(710));
        let acts = drain(&mut p);
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Refuse(7, why) if why.contains("primary at a"))),
            "{acts:?}"
        );
        assert!(!p.took_over());
    }

    #[test]
    fn a_closed_primary_that_cannot_be_reached_is_taken_over_with_the_held_messages() {
        let mut p = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        assert_eq!(drain(&mut p), vec![Action::Send(1, Msg::Follow)]);
        p.handle_msg(ms(5), 7, ping());
        p.handle_msg(ms(6), 8, ping());
        p.handle_msg(ms(7), 7, Msg::ListModels);
        p.handle_closed(ms(10), 8, "gone");
        p.handle_closed(ms(10), 1, "reset");
        assert_eq!(drain(&mut p), vec![Action::Connect("a".into())]);
        p.handle_connect_failed(ms(10), "refused");
        let acts = drain(&mut p);
        match &acts[..] {
            [Action::TakeOver {
                why,
                held,
                assignment: None,
                states,
                scales: None,
                term: 2,
            }] => {
                assert!(states.is_empty(), "none received");
                assert!(
                    why.contains("primary a") && why.contains("refused"),
                    "{why}"
                );
                assert_eq!(held.len(), 2, "node 8's message went with its connection");
                assert!(held.iter().all(|(c, _)| *c == 7));
            }
            other => panic!("{other:?}"),
        }
        assert!(p.took_over());
        assert_eq!(p.poll_timeout(), Time::NEVER);
        // A connection closing again before a pong is the same verdict.
        let mut q = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        q.handle_closed(ms(1), 1, "reset");
        drain(&mut q);
        q.handle_connected(ms(1), 2);
        q.handle_closed(ms(2), 2, "refused");
        assert!(q.took_over());
        // One that answers again resets it.
        let mut r = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        r.handle_closed(ms(1), 1, "reset");
        r.handle_connected(ms(1), 2);
        r.handle_msg(
            ms(2),
            2,
            Msg::Pong {
                seq: 1,
                echo: ms(1),
                sched: ms(1),
                term: 1,
            },
        );
        r.handle_closed(ms(50), 2, "reset");
        assert!(!r.took_over());
    }

    #[test]
    fn a_silent_primary_is_taken_over_after_three_heartbeats() {
        let mut p = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        p.handle_timeout(ms(0));
        p.handle_timeout(ms(299));
        assert!(!p.took_over());
        assert_eq!(p.poll_timeout(), ms(300));
        p.handle_timeout(ms(300));
        assert!(p.took_over());
        let acts = drain(&mut p);
        assert!(acts.contains(&Action::Close(1, "standby taking over".into())));
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::TakeOver { why, .. } if why.contains("no pong"))));
    }

    /// The takeover's term is one more than the highest seen: the primary's
    /// pongs', a node's pings', a fence's (refused: a standby serves no one).
    #[test]
    fn it_takes_over_under_the_term_after_the_highest_it_saw() {
        let mut p = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        let pong = Msg::Pong {
            seq: 1,
            echo: ms(0),
            sched: ms(0),
            term: 4,
        };
        p.handle_msg(ms(1), 1, pong);
        assert_eq!(p.term(), 4);
        p.handle_msg(ms(2), 7, Msg::Fence { term: 6 });
        p.handle_timeout(ms(400));
        let acts = drain(&mut p);
        assert!(acts.iter().any(|a| matches!(a, Action::Refuse(7, _))));
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::TakeOver { term: 7, .. })),
            "{acts:?}"
        );
    }

    /// A standby whose primary went before its first pong knows no term:
    /// it takes over under 2, or above the term a node's held ping carried.
    /// (Its old primary may serve a higher term, or the same: the fence
    /// settles both, `super::super::fence::on_fence`.)
    #[test]
    fn a_standby_that_never_heard_a_pong_takes_over_under_the_term_after_what_nodes_told_it() {
        let mut p = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        p.handle_timeout(ms(400));
        assert!(
            drain(&mut p)
                .iter()
                .any(|a| matches!(a, Action::TakeOver { term: 2, .. })),
            "no term seen: 2"
        );
        let mut q = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        let ping = Msg::Ping {
            seq: 1,
            sent: ms(0),
            ctrl_delay: Dur::ZERO,
            pull: Dur::ZERO,
            pull_per_mib: Dur::ZERO,
            pull_hold: Dur::ZERO,
            pull_hold_per_mib: Dur::ZERO,
            term: 5,
        };
        q.handle_msg(ms(350), 7, ping);
        q.handle_timeout(ms(400));
        match &drain(&mut q)[..] {
            [.., Action::TakeOver { term: 6, held, .. }] => assert_eq!(held.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn it_takes_over_with_the_primary_s_last_assignment_and_latency_scales() {
        let hb = Dur::from_ms(100);
        let mut p = StandbyProto::new(ms(0), "a", 1, hb);
        assert_eq!(drain(&mut p), vec![Action::Send(1, Msg::Follow)]);
        p.handle_msg(ms(1), 1, Msg::Assignment { homes: vec![0, 1] });
        p.handle_msg(ms(2), 1, Msg::Assignment { homes: vec![1, 1] });
        assert_eq!(p.assignment(), Some(&[1, 1][..]));
        p.handle_msg(
            ms(2),
            1,
            Msg::LatencyScales {
                ppm: vec![1_500_000, 1_000_000],
            },
        );
        // Scales a node sends are held like anything it sends, not taken.
        p.handle_msg(ms(2), 7, Msg::LatencyScales { ppm: vec![9; 2] });
        // An Assignment from a node is held like anything it sends, not taken.
        p.handle_msg(ms(3), 7, Msg::Assignment { homes: vec![0, 0] });
        assert_eq!(p.assignment(), Some(&[1, 1][..]));
        // A new connection to the primary asks again.
        p.handle_closed(ms(4), 1, "reset");
        assert_eq!(drain(&mut p), vec![Action::Connect("a".into())]);
        p.handle_connected(ms(5), 2);
        assert_eq!(drain(&mut p), vec![Action::Send(2, Msg::Follow)]);
        p.handle_timeout(ms(5));
        drain(&mut p);
        p.handle_timeout(ms(400));
        let acts = drain(&mut p);
        match &acts[..] {
            [Action::Close(2, _), Action::TakeOver {
                held,
                assignment,
                scales,
                ..
            }] => {
                assert_eq!(assignment.as_deref(), Some(&[1, 1][..]));
                assert_eq!(scales.as_deref(), Some(&[1_500_000, 1_000_000][..]));
                assert_eq!(held.len(), 2);
            }
            other => panic!("{other:?}"),
        }
    }

    /// The primary's models' states are kept, the latest of each model, and
    /// handed over at the takeover; states a node sends are held like
    /// anything it sends, not taken.
    #[test]
    fn it_takes_over_with_the_primary_s_last_model_states() {
        use crate::wire::ModelAvailability::*;
        let item = |m: u32, state| ModelStateItem {
            model: ModelId(m),
            state,
            reason: String::new(),
            devices: Default::default(),
        };
        let mut p = StandbyProto::new(ms(0), "a", 1, Dur::from_ms(100));
        drain(&mut p);
        let all = vec![item(0, Ready), item(1, Unavailable), item(2, Ready)];
        p.handle_msg(ms(1), 1, Msg::ModelStates { items: all });
        p.handle_msg(
            ms(2),
            1,
            Msg::ModelStates {
                items: vec![item(1, Loading)],
            },
        );
        p.handle_msg(
            ms(3),
            1,
            Msg::ModelStates {
                items: vec![item(1, Ready), item(2, Unloading)],
            },
        );
        p.handle_msg(
            ms(4),
            7,
            Msg::ModelStates {
                items: vec![item(0, Unavailable)],
            },
        );
        let want = vec![item(0, Ready), item(1, Ready), item(2, Unloading)];
        assert_eq!(p.model_states(), want);
        p.handle_timeout(ms(400));
        match &drain(&mut p)[..] {
            [.., Action::TakeOver { states, .. }] => assert_eq!(states, &want),
            other => panic!("{other:?}"),
        }
    }
}
