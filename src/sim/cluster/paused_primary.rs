//! The paused-primary fault of the cluster simulator (`--paused-primary`,
//! with `--standby`), terms and fencing.
//!
//! The serving scheduler stops (as under SIGSTOP) for 1.4 to 2 s: past its
//! standby's takeover (3 heartbeats) and the nodes' scheduler timeout (1 s).
//! The standby takes over under a new term and fences the old address with
//! the production [`Fencer`]; the old primary then resumes with everything it
//! held. Late in the pause a frontend starts with the old primary's address
//! first (as one given `--scheduler OLD,NEW` would), and one node that follows
//! the new primary loses its connection (so it tries the old address next).
//! A scheduler that steps down ends, and its supervisor starts it again as the
//! standby of the serving one.
//!
//! The invariants, in every run (with or without the fault), judged by the
//! simulator's own knowledge of which scheduler began serving when (its
//! *generation*), not by the protocol's terms:
//! - at every message a node takes from its scheduler (its pongs, acks,
//!   plans, loads, frontends, capacity, drops), the sender's generation is
//!   not older than any generation that node took messages from before: no
//!   node follows two primaries at once;
//! - at the end, one scheduler serves (the newest) and every node in service
//!   follows it.
//!
//! Every request still ends exactly once (the simulator's own check).
//! `--plant no-fencing` (a takeover under the same term, no fencing) shows
//! that the checks catch a resumed primary serving beside its successor.

use super::{ClusterSim, Ev, Pid, Planted, Proc, StandbySim};
use crate::core::Dur;
use crate::node::proto::fence::{self, Fencer, FENCE_EVERY_HEARTBEATS};
use crate::transport::ConnId;
use crate::wire::Msg;
use rand::Rng;

impl ClusterSim {
    /// Standby `pid` takes over under `term`: a new generation, and the
    /// fencing of its old primary's address.
    pub(super) fn begin_term(&mut self, pid: Pid, sb: &mut StandbySim, term: u64) {
        self.generations.push(pid);
        if self.opts.planted == Some(Planted::NoFencing) {
            return sb.sched.proto.set_term(sb.proto.term().max(1));
        }
        sb.sched.proto.set_term(term);
        let every = self.heartbeat * FENCE_EVERY_HEARTBEATS;
        sb.sched.fencer = Some(Fencer::new(self.now, sb.proto.primary(), term, every));
    }

    /// Scheduler `pid`'s generation (its place in the serving order).
    fn generation(&self, pid: Pid) -> Option<usize> {
        self.generations.iter().rposition(|&p| p == pid)
    }

    /// At the end: only the newest scheduler serves, and every node in
    /// service follows it.
    pub(super) fn one_primary_at_the_end(&mut self) {
        if self.violation.is_some() {
            return;
        }
        let sp = self.sched_pid;
        let others: Vec<Pid> = (0..self.procs.len())
            .filter(|&p| {
                p != sp
                    && matches!(&self.procs[p], Proc::Sched(s) if s.proto.stepped_down().is_none())
            })
            .collect();
        if let Some(p) = others.first() {
            return self.violate(format!(
                "two schedulers serve at the end: {p} beside the newest, {sp}"
            ));
        }
        let nodes: Vec<Pid> = self
            .fe_slots
            .iter()
            .chain(&self.be_slots)
            .copied()
            .collect();
        for pid in nodes {
            let Some(c) = self.node_sched_conn(pid) else {
                continue;
            };
            let ready = match &self.procs[pid] {
                Proc::Fe(f) => f.member.is_ready(),
                Proc::Be(b) => b.proto.is_ready(),
                _ => false,
            };
            let to = self.links.get(&c).map(|l| {
                if l.ends[0] == pid {
                    l.ends[1]
                } else {
                    l.ends[0]
                }
            });
            if ready && to != Some(sp) {
                return self.violate(format!(
                    "node {pid} follows scheduler {to:?} at the end, not the serving one ({sp})"
                ));
            }
        }
    }

    /// Schedules the fault once, early enough that the run's drain shows every
    /// node back in service.
    pub(super) fn schedule_paused_primary(&mut self) {
        let end = self.opts.duration.0;
        let t = crate::core::Time(self.rng.gen_range(200_000_000..(end / 2).max(200_000_001)));
        self.at(t, Ev::PausePrimary);
    }

    /// The serving scheduler stops while its standby follows it.
    pub(super) fn pause_primary(&mut self) {
        let sp = self.sched_pid;
        let following = self
            .sched_addrs
            .iter()
            .any(|&(_, p)| matches!(self.procs[p], Proc::Standby(_)));
        if !following || !matches!(self.procs[sp], Proc::Sched(_)) || self.paused[sp] > self.now {
            // No standby yet (a restart under way): try again shortly.
            if self.now.0 < self.opts.duration.0 {
                self.at(self.now + Dur::from_ms(100), Ev::PausePrimary);
            }
            return;
        }
        self.report.primary_pauses += 1;
        let len = Dur(self.rng.gen_range(1_400_000_000..2_000_000_000));
        let back = self.now + len;
        self.paused[sp] = back;
        let addr = self.addr_of(sp);
        let late = back - Dur(self.rng.gen_range(0..300_000_000));
        self.at(late, Ev::LateFrontend { addr });
        let nudge = back - Dur(self.rng.gen_range(0..300_000_000));
        self.at(nudge, Ev::Nudge);
    }

    /// A frontend starts with `addr` (the paused primary's) first.
    pub(super) fn late_frontend(&mut self, addr: &'static str) {
        self.report.late_frontends += 1;
        let slot = self.fe_slots.len();
        self.fe_slots.push(usize::MAX);
        self.first_addr = Some(addr);
        self.start_frontend(slot);
        self.first_addr = None;
    }

    /// One node in service loses its scheduler's connection.
    pub(super) fn nudge(&mut self) {
        let conns: Vec<ConnId> = self
            .fe_slots
            .iter()
            .chain(&self.be_slots)
            .filter_map(|&p| match &self.procs[p] {
                Proc::Fe(f) if f.member.is_ready() => f.member.conn(),
                Proc::Be(b) if b.proto.is_ready() => b.proto.sched_conn(),
                _ => None,
            })
            .collect();
        if conns.is_empty() {
            return;
        }
        let c = conns[self.rng.gen_range(0..conns.len())];
        self.break_link(c, "connection reset");
    }

    /// A message on scheduler `pid`'s fencing connection.
    pub(super) fn fencer_msg(&mut self, pid: Pid, conn: ConnId, msg: Msg) {
        if let Proc::Sched(s) = &mut self.procs[pid] {
            if let Some(f) = s.fencer.as_mut() {
                f.handle_msg(self.now, conn, msg);
            }
        }
        self.fencer_apply(pid);
    }

    /// Carries out what scheduler `pid`'s fencer decided.
    pub(super) fn fencer_apply(&mut self, pid: Pid) {
        loop {
            let now = self.now;
            let Proc::Sched(s) = &mut self.procs[pid] else {
                return;
            };
            let Some(a) = s.fencer.as_mut().and_then(|f| f.poll_action()) else {
                break;
            };
            match a {
                fence::Action::Connect(addr) => {
                    let c = self.connect(pid, self.pid_at(&addr));
                    self.report.fences_sent += 1;
                    if let Proc::Sched(s) = &mut self.procs[pid] {
                        if let Some(f) = s.fencer.as_mut() {
                            f.handle_connected(now, c);
                        }
                    }
                }
                fence::Action::Send(c, m) => self.send(pid, c, m),
                fence::Action::Close(c, why) => self.break_link(c, &why),
                fence::Action::StepDown { term } => s.proto.handle_fenced(term),
            }
        }
        self.sched_apply(pid);
    }

    /// Scheduler `sp` stepped down for a newer term: its process ends, and its
    /// supervisor starts it again as the standby of the serving one.
    pub(super) fn sched_step_down(&mut self, sp: Pid, _term: u64) {
        self.report.step_downs += 1;
        let addr = self.addr_of(sp);
        self.kill(sp, "stepped down");
        let back = self.now + Dur(self.rng.gen_range(200_000_000..600_000_000));
        self.at(back, Ev::SchedRestart { addr });
    }

    /// What a node takes from scheduler connection `conn` comes from the
    /// scheduler at its other end: before `msg` is handled, that scheduler's
    /// generation (if `msg` is one a node takes from its scheduler and `conn`
    /// is `pid`'s scheduler connection).
    pub(super) fn term_before(&self, pid: Pid, conn: ConnId, msg: &Msg) -> Option<usize> {
        let carries = matches!(
            msg,
            Msg::Pong { .. }
                | Msg::RegisterAck { .. }
                | Msg::Plan { .. }
                | Msg::LoadModel { .. }
                | Msg::UnloadModel { .. }
                | Msg::FrontendUp { .. }
                | Msg::FrontendDown { .. }
                | Msg::Capacity { .. }
                | Msg::Dropped { .. }
                | Msg::Drained
        );
        if !carries || self.node_sched_conn(pid) != Some(conn) {
            return None;
        }
        let l = self.links.get(&conn)?;
        let from = if l.ends[0] == pid {
            l.ends[1]
        } else {
            l.ends[0]
        };
        self.generation(from)
    }

    /// After node `pid` handled a message of a scheduler of generation `term`
    /// on `conn`: if it took it (the connection is still its scheduler's, of
    /// a known term), the generation must not be older than one it took
    /// before.
    pub(super) fn check_term(&mut self, pid: Pid, conn: ConnId, term: usize, kind: &str) {
        let took = match &self.procs[pid] {
            Proc::Fe(f) => f.member.conn() == Some(conn) && f.member.conn_term().is_some(),
            Proc::Be(b) => b.proto.sched_conn() == Some(conn) && b.proto.terms().1.is_some(),
            _ => false,
        };
        if !took {
            return;
        }
        let seen = self.node_terms.entry(pid).or_insert(0);
        if term < *seen {
            let what = format!(
                "node {pid} took a {kind} from the scheduler of generation {term} after taking messages of generation {seen}: it follows two primaries"
            );
            return self.violate(what);
        }
        *seen = term;
    }

    /// Node `pid`'s scheduler connection.
    fn node_sched_conn(&self, pid: Pid) -> Option<ConnId> {
        match &self.procs[pid] {
            Proc::Fe(f) => f.member.conn(),
            Proc::Be(b) => b.proto.sched_conn(),
            _ => None,
        }
    }

    /// Schedulers refused by nodes for an older term (over the nodes alive).
    pub(super) fn fenced_refusals(&self) -> u64 {
        self.procs
            .iter()
            .map(|p| match p {
                Proc::Fe(f) => f.member.counts().fenced,
                Proc::Be(b) => b.proto.member_counts().fenced,
                _ => 0,
            })
            .sum()
    }
}
