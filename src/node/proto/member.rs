//! A node's membership in the cluster as a pure state machine, the same for
//! frontends and backends ([`Member`]): the scheduler's connection, the clock
//! sync, `Register` and its ack, heartbeats, and — when the scheduler is lost —
//! reconnecting with backoff and registering again.
//!
//! # The cycle
//! ```text
//!  Sync ──(SYNC_SAMPLES pongs, or SYNC_MAX with one)──> Registering ──(RegisterAck)──> Ready
//!   ^                                                                                  |
//!   | handle_connected                                  lost: closed, silent, Error    |
//!  Connecting <──(backoff)── Away <──────────────────────────────────────────────────-─┘
//! ```
//! A node starts in `Sync` on the connection its driver opened. It pings every
//! [`SYNC_PING`] until it has [`SYNC_SAMPLES`] clock samples (or [`SYNC_MAX`]
//! passed with at least one), then sends its `Register`. On `RegisterAck` it is
//! in service ([`Action::Joined`]) and pings every heartbeat the ack names.
//!
//! The scheduler is **lost** when its connection closes, when it sends `Error`,
//! or when no pong came for the timeout (in any phase but `Away`). Then the
//! member closes the connection, tells its owner ([`Action::Lost`]: forget what
//! this registration had — plans, frontends; a frontend holds its pending requests
//! for the next scheduler) and waits a backoff
//! before it asks its driver for a new connection ([`Action::Connect`]) to the
//! next of the scheduler addresses it knows (a standby's too), round robin; the
//! first try after a loss, when there is another address, is at once (a hot
//! standby takes over as the primary goes). The backoff doubles from [`BACKOFF_MIN`] to [`BACKOFF_MAX`] with ±25% jitter
//! (from the node's name and the attempt, so a replay is exact) and starts
//! again from the minimum once the node is back in service. Each new connection
//! starts a new clock sync: a restarted scheduler has a new clock.
//!
//! # Terms
//! Every scheduler serves under a term (a number that only grows: a standby
//! that takes over serves one more than the highest it saw), carried by each
//! `Pong` and the `RegisterAck`. The member keeps the highest term it has seen
//! and refuses a scheduler of an older one — a primary that was replaced while
//! it was paused or cut off — as lost ([`MemberCounts::fenced`]), before its
//! clock sync ends: nothing that scheduler sends reaches the owner, since only
//! a registered member hands messages on and a member registers only after
//! pongs of a current term. Its pings carry the highest term too, so a
//! replaced scheduler that a node reaches learns of its successor (and steps
//! down, see [`super::sched`]).
//!
//! A node never gives up: a supervisor restarting it would do no better, and
//! the outage would last until a person noticed (the driver stops it on a
//! signal).

use super::check;
use crate::core::{Dur, GpuId, PullFit, Time};
use crate::node::clock::{Delays, OffsetEstimator};
use crate::transport::ConnId;
use crate::wire::{ModelInfo, Msg, NodeId};
use std::collections::VecDeque;

/// Clock samples taken before registering.
pub const SYNC_SAMPLES: usize = 8;
/// Longest clock sync before registering (with at least one sample).
pub const SYNC_MAX: Dur = Dur(2_000_000_000);
/// During the sync, a ping unanswered this long is followed by another.
pub const SYNC_PING: Dur = Dur(200_000_000);
/// The heartbeat until `RegisterAck` says otherwise.
pub const DEFAULT_HEARTBEAT: Dur = Dur(100_000_000);
/// The first wait before reconnecting, and the longest.
pub const BACKOFF_MIN: Dur = Dur(50_000_000);
pub const BACKOFF_MAX: Dur = Dur(2_000_000_000);

/// What the driver (or the owning protocol) must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Open a connection to the scheduler at this address; report it with
    /// [`Member::handle_connected`] or [`Member::handle_connect_failed`].
    Connect(String),
    /// Send a message on the scheduler's connection.
    Send(ConnId, Msg),
    /// Close the scheduler's connection (the member has already forgotten it).
    Close(ConnId, String),
    /// The offset of the scheduler's clock from ours changed (and its error bound).
    SetClock { offset: Dur, error: Dur },
    /// In service: the scheduler's `RegisterAck`. `away`: how long the node was
    /// out of service before this rejoin (None on the first join).
    Joined {
        node: NodeId,
        gpu_ids: Vec<GpuId>,
        models: Vec<ModelInfo>,
        away: Option<Dur>,
    },
    /// The scheduler is lost: the session's state is void (its plans, the
    /// frontends it announced, the requests it was told of).
    Lost(String),
}

/// What a member counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberCounts {
    /// Times in service: the first join and every rejoin.
    pub joins: u64,
    /// Times the scheduler was lost.
    pub lost: u64,
    /// Connection attempts that failed at once.
    pub connect_failures: u64,
    /// Messages on the scheduler's connection that make no sense now, ignored.
    pub unexpected: u64,
    /// Schedulers refused for a term older than one seen.
    pub fenced: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the driver to report the connection asked for.
    Connecting,
    /// Pinging; registers once the clock is known.
    Sync {
        since: Time,
    },
    /// Registered, waiting for `RegisterAck`.
    Registering,
    Ready,
    /// Lost; reconnects at `retry`.
    Away {
        retry: Time,
    },
}

/// A node's membership (see the module docs). Times passed in are on the
/// node's own clock.
pub struct Member {
    addrs: Vec<String>,
    /// Index in `addrs` of the scheduler connected to (or tried next).
    addr: usize,
    conn: Option<ConnId>,
    register: Msg,
    phase: Phase,
    timeout: Dur,
    heartbeat: Dur,
    est: OffsetEstimator,
    rtt: Delays,
    last_pong: Time,
    next_ping: Time,
    seq: u64,
    /// What the pings carry: the node's control delay, pull cost and what a
    /// pull holds a GPU's puller.
    ctrl_delay: Dur,
    pull: PullFit,
    hold: PullFit,
    attempt: u32,
    jitter_seed: u64,
    /// When the node last left service (None while in service).
    lost_at: Option<Time>,
    /// The highest scheduler term seen, and the term of the scheduler on the
    /// connection now (None before its first pong).
    term: u64,
    conn_term: Option<u64>,
    counts: MemberCounts,
    out: VecDeque<Action>,
}

impl Member {
    /// A node whose driver connected to `addrs[0]` as `conn` at `now`; it
    /// starts the clock sync at once and will send `register` (a
    /// `Msg::Register`) when done. `timeout`: the scheduler is lost after this
    /// long without a pong.
    pub fn new(now: Time, conn: ConnId, addrs: Vec<String>, register: Msg, timeout: Dur) -> Self {
        let name = match &register {
            Msg::Register { name, .. } => name.clone(),
            _ => String::new(),
        };
        let mut m = Member {
            addrs,
            addr: 0,
            conn: Some(conn),
            register,
            phase: Phase::Connecting,
            timeout,
            heartbeat: DEFAULT_HEARTBEAT,
            est: OffsetEstimator::new(),
            rtt: Delays::new(256),
            last_pong: now,
            next_ping: now,
            seq: 0,
            ctrl_delay: Dur::ZERO,
            pull: PullFit::default(),
            hold: PullFit::default(),
            attempt: 0,
            jitter_seed: fnv(name.as_bytes()),
            lost_at: None,
            term: 0,
            conn_term: None,
            counts: MemberCounts::default(),
            out: VecDeque::new(),
        };
        m.start_sync(now);
        m
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// When [`Member::handle_timeout`] is next due (our clock).
    pub fn poll_timeout(&self) -> Time {
        match self.phase {
            Phase::Connecting => Time::NEVER,
            Phase::Away { retry } => retry,
            Phase::Sync { since } => self
                .next_ping
                .min(since + SYNC_MAX)
                .min(self.last_pong + self.timeout),
            Phase::Registering | Phase::Ready => self.next_ping.min(self.last_pong + self.timeout),
        }
    }

    /// Where the membership is, for a report: its phase and the scheduler
    /// address it is at (or tries next).
    pub fn describe(&self) -> String {
        let phase = match self.phase {
            Phase::Connecting => "connecting".to_string(),
            Phase::Away { retry } => format!("away until {retry}"),
            Phase::Sync { since } => format!("syncing the clock since {since}"),
            Phase::Registering => "registering".to_string(),
            Phase::Ready => "in service".to_string(),
        };
        format!("{phase}, scheduler `{}`", self.addr())
    }

    /// In service: registered and acknowledged.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// The scheduler's connection, while there is one.
    pub fn conn(&self) -> Option<ConnId> {
        self.conn
    }

    /// The address of the scheduler connected to (or tried next).
    pub fn addr(&self) -> &str {
        self.addrs.get(self.addr).map_or("", |s| s.as_str())
    }

    pub fn counts(&self) -> MemberCounts {
        self.counts
    }

    /// The highest scheduler term seen (0: none yet).
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The term of the scheduler on the connection now, once it answered a
    /// ping (never older than [`Member::term`]: an older one is refused).
    pub fn conn_term(&self) -> Option<u64> {
        self.conn_term.filter(|_| self.conn.is_some())
    }

    /// The scheduler's clock minus ours (0 before the first pong of this
    /// connection).
    pub fn offset(&self) -> Dur {
        self.est.best().map_or(Dur::ZERO, |b| b.0)
    }

    /// The clock offset's error bound (0 before the first pong).
    pub fn offset_error(&self) -> Dur {
        self.est.best().map_or(Dur::ZERO, |b| b.1.max(Dur::ZERO))
    }

    /// The ping round trip's tail at quantile `q` (0 before the first pong).
    pub fn rtt_tail(&self, q: f64) -> Dur {
        Dur(self.rtt.tail(q))
    }

    /// What the next pings carry (clamped like every measured delay).
    pub fn set_report(&mut self, ctrl_delay: Dur, pull: PullFit, hold: PullFit) {
        self.ctrl_delay = check::measured(ctrl_delay);
        self.pull = check::measured_pull(pull);
        self.hold = check::measured_pull(hold);
    }

    /// The owner gives the scheduler up (it cannot work with this one): as if
    /// the scheduler were lost; the member reconnects after the backoff.
    pub fn leave(&mut self, now: Time, why: &str) {
        self.lose(now, why.to_string());
    }

    /// The connection asked for by [`Action::Connect`] is up.
    pub fn handle_connected(&mut self, now: Time, conn: ConnId) {
        if self.phase != Phase::Connecting {
            // Not asked for (or no longer wanted).
            self.counts.unexpected += 1;
            return self.out.push_back(Action::Close(conn, "not wanted".into()));
        }
        self.conn = Some(conn);
        self.start_sync(now);
    }

    /// The connection asked for by [`Action::Connect`] could not be opened.
    pub fn handle_connect_failed(&mut self, now: Time, why: &str) {
        if self.phase != Phase::Connecting {
            return;
        }
        self.counts.connect_failures += 1;
        tracing::debug!(addr = %self.addr(), reason = %why, "cannot reach the scheduler; retrying");
        self.next_addr();
        self.away(now);
    }

    /// Connection `conn` closed. True when it was the scheduler's (the member
    /// handled it); false for another connection (the owner's business).
    pub fn handle_closed(&mut self, now: Time, conn: ConnId, why: &str) -> bool {
        if self.conn != Some(conn) {
            return false;
        }
        self.conn = None;
        self.lose(now, format!("the scheduler's connection closed: {why}"));
        true
    }

    /// A message on the scheduler's connection: the member takes pongs, the
    /// ack and errors; any other message is handed back for the owner, but only
    /// while the node is registered or registering (before that, and while away,
    /// none is expected: ignored and counted).
    pub fn handle_msg(&mut self, now: Time, msg: Msg) -> Option<Msg> {
        match msg {
            Msg::Pong {
                echo, sched, term, ..
            } => {
                if self.current(now, term) {
                    self.pong(now, echo, sched);
                }
                None
            }
            Msg::RegisterAck {
                node,
                gpu_ids,
                models,
                heartbeat_ms,
                term,
            } => {
                if self.current(now, term) {
                    self.registered(now, node, gpu_ids, models, heartbeat_ms);
                }
                None
            }
            Msg::Error { message } => {
                self.lose(now, format!("the scheduler closed us: {message}"));
                None
            }
            other if matches!(self.phase, Phase::Registering | Phase::Ready) => Some(other),
            _ => {
                self.counts.unexpected += 1;
                None
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        match self.phase {
            Phase::Connecting => {}
            Phase::Away { retry } => {
                if now >= retry {
                    self.phase = Phase::Connecting;
                    let addr = self.addr().to_string();
                    self.out.push_back(Action::Connect(addr));
                }
            }
            Phase::Sync { since } => {
                if now - self.last_pong >= self.timeout {
                    self.lose(now, "the scheduler does not answer pings".into());
                } else if now >= since + SYNC_MAX {
                    self.end_sync(now);
                } else if now >= self.next_ping {
                    self.ping(now);
                }
            }
            Phase::Registering | Phase::Ready => {
                if now - self.last_pong >= self.timeout {
                    let why = format!("the scheduler is silent: no pong for {:?}", self.timeout);
                    return self.lose(now, why);
                }
                if now >= self.next_ping {
                    self.ping(now);
                }
            }
        }
    }

    /// Whether a scheduler that says it serves `term` is current: not older
    /// than the highest term seen (that one becomes the highest); an older one
    /// is refused as lost.
    fn current(&mut self, now: Time, term: u64) -> bool {
        if matches!(self.phase, Phase::Connecting | Phase::Away { .. }) {
            return true; // Ignored there anyway.
        }
        if term < self.term {
            self.counts.fenced += 1;
            let why = format!(
                "the scheduler at {} serves term {term}, older than term {} seen: a replaced primary",
                self.addr(),
                self.term
            );
            self.lose(now, why);
            return false;
        }
        self.term = term;
        self.conn_term = Some(term);
        true
    }

    fn start_sync(&mut self, now: Time) {
        self.phase = Phase::Sync { since: now };
        self.conn_term = None;
        // A new connection may be a new scheduler, with a new clock.
        self.est = OffsetEstimator::new();
        self.rtt = Delays::new(256);
        self.heartbeat = DEFAULT_HEARTBEAT;
        self.last_pong = now;
        self.ping(now);
    }

    fn ping(&mut self, now: Time) {
        self.seq += 1;
        self.next_ping = now
            + match self.phase {
                Phase::Sync { .. } => SYNC_PING,
                _ => self.heartbeat,
            };
        self.send(Msg::Ping {
            seq: self.seq,
            sent: now,
            ctrl_delay: self.ctrl_delay,
            pull: self.pull.fixed,
            pull_per_mib: self.pull.per_mib,
            pull_hold: self.hold.fixed,
            pull_hold_per_mib: self.hold.per_mib,
            term: self.term,
        });
    }

    fn send(&mut self, m: Msg) {
        if let Some(c) = self.conn {
            self.out.push_back(Action::Send(c, m));
        }
    }

    fn end_sync(&mut self, now: Time) {
        if self.est.samples() == 0 {
            return self.lose(now, "the scheduler does not answer pings".into());
        }
        self.phase = Phase::Registering;
        self.last_pong = now;
        self.next_ping = now + self.heartbeat;
        let reg = self.register.clone();
        self.send(reg);
    }

    fn pong(&mut self, now: Time, echo: Time, sched: Time) {
        if matches!(self.phase, Phase::Connecting | Phase::Away { .. })
            || echo > now
            || now - echo > check::MAX_MEASURED
        {
            // Not a time we sent lately: ignore rather than skew the clock.
            self.counts.unexpected += 1;
            return;
        }
        self.last_pong = now;
        let rtt = self.est.push(echo, sched, now);
        self.rtt.push(now, rtt.0);
        if let Some((offset, error)) = self.est.best() {
            self.out.push_back(Action::SetClock { offset, error });
        }
        if let Phase::Sync { .. } = self.phase {
            if self.est.samples() >= SYNC_SAMPLES {
                self.end_sync(now);
            } else {
                self.ping(now);
            }
        }
    }

    fn registered(
        &mut self,
        now: Time,
        node: NodeId,
        gpu_ids: Vec<GpuId>,
        models: Vec<ModelInfo>,
        heartbeat_ms: u32,
    ) {
        if self.phase != Phase::Registering {
            self.counts.unexpected += 1;
            return;
        }
        self.heartbeat = Dur::from_ms(heartbeat_ms.clamp(1, 60_000) as i64);
        self.next_ping = self.next_ping.min(now + self.heartbeat);
        self.phase = Phase::Ready;
        self.attempt = 0;
        // Time away only for a rejoin (a failed first attempt is no absence).
        let away = self.lost_at.take().filter(|_| self.counts.joins > 0);
        let away = away.map(|t| now - t);
        self.counts.joins += 1;
        self.out.push_back(Action::Joined {
            node,
            gpu_ids,
            models,
            away,
        });
    }

    /// The scheduler is lost: close its connection, tell the owner, back off.
    fn lose(&mut self, now: Time, why: String) {
        if matches!(self.phase, Phase::Away { .. } | Phase::Connecting) {
            return;
        }
        if let Some(c) = self.conn.take() {
            self.out.push_back(Action::Close(c, why.clone()));
        }
        self.counts.lost += 1;
        if self.lost_at.is_none() {
            self.lost_at = Some(now);
        }
        tracing::warn!(addr = %self.addr(), reason = %why, "lost the scheduler; will reconnect");
        self.out.push_back(Action::Lost(why));
        self.next_addr();
        if self.addrs.len() > 1 && self.attempt == 0 {
            // Another address is a standby taking over now: try it at once
            // (its failover is what the node waits for). Should it fail, the
            // backoff starts from its minimum.
            self.phase = Phase::Away { retry: now };
            return;
        }
        self.away(now);
    }

    /// The next attempt goes to the next address (a standby's), round robin.
    fn next_addr(&mut self) {
        if !self.addrs.is_empty() {
            self.addr = (self.addr + 1) % self.addrs.len();
        }
    }

    fn away(&mut self, now: Time) {
        if self.lost_at.is_none() {
            self.lost_at = Some(now);
        }
        let wait = backoff(self.attempt, self.jitter_seed);
        self.attempt = self.attempt.saturating_add(1);
        self.phase = Phase::Away { retry: now + wait };
    }
}

/// The wait before reconnect attempt `attempt` (0 first): doubling from
/// [`BACKOFF_MIN`] to [`BACKOFF_MAX`], ±25% jitter drawn from `seed` and the
/// attempt (so nodes that lost the scheduler together do not all come back at
/// once, and a simulated run replays exactly).
pub fn backoff(attempt: u32, seed: u64) -> Dur {
    let base = BACKOFF_MIN
        .0
        .saturating_mul(1i64 << attempt.min(20))
        .min(BACKOFF_MAX.0);
    let r = splitmix(seed ^ attempt as u64);
    // In [0.75, 1.25).
    let f = 0.75 + (r >> 11) as f64 / (1u64 << 53) as f64 * 0.5;
    Dur((base as f64 * f) as i64)
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: i64) -> Time {
        Time(v * 1_000_000)
    }

    fn drain(m: &mut Member) -> Vec<Action> {
        std::iter::from_fn(|| m.poll_action()).collect()
    }

    fn member(addrs: &[&str]) -> Member {
        let reg = Msg::Register {
            role: crate::wire::Role::Frontend,
            name: "fe".into(),
            gpus: vec![],
            ctrl_addr: String::new(),
            region: None,
        };
        let addrs = addrs.iter().map(|s| s.to_string()).collect();
        Member::new(ms(0), 1, addrs, reg, Dur::from_ms(500))
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_with_bounded_jitter() {
        for attempt in 0..30 {
            let base = (BACKOFF_MIN.0 << attempt.min(20)).min(BACKOFF_MAX.0) as f64;
            for seed in 0..20 {
                let d = backoff(attempt, seed).0 as f64;
                assert!(
                    d >= 0.75 * base && d <= 1.25 * base,
                    "{attempt} {seed}: {d}"
                );
            }
        }
        // Jitter: nodes that lost the scheduler together spread out.
        let spread: std::collections::HashSet<i64> = (0..20).map(|s| backoff(0, s).0).collect();
        assert!(spread.len() > 10);
    }

    #[test]
    fn a_lost_scheduler_is_retried_at_the_next_address_until_one_answers() {
        let mut m = member(&["a", "b"]);
        m.handle_closed(ms(1), 1, "reset");
        let acts = drain(&mut m);
        assert!(matches!(
            &acts[..],
            [Action::Send(1, Msg::Ping { .. }), Action::Lost(_)]
        ));
        assert!(!m.is_ready());
        // The other address (a standby) is tried at once.
        let t = m.poll_timeout();
        assert_eq!(t, ms(1));
        m.handle_timeout(t);
        assert_eq!(drain(&mut m), vec![Action::Connect("b".into())]);
        m.handle_connect_failed(t, "refused");
        let t2 = m.poll_timeout();
        assert!(t2 - t >= Dur(BACKOFF_MIN.0 * 3 / 4), "then the backoff");
        m.handle_timeout(t2);
        assert_eq!(drain(&mut m), vec![Action::Connect("a".into())]);
        m.handle_connect_failed(t2, "refused");
        let t3 = m.poll_timeout();
        assert!(t3 - t2 >= Dur(BACKOFF_MIN.0 * 2 * 3 / 4), "the wait grows");
        let t2 = t3;
        m.handle_timeout(t2);
        assert_eq!(drain(&mut m), vec![Action::Connect("b".into())]);
        m.handle_connected(t2, 9);
        // A new clock sync on the new connection, then the registration and the
        // ack (the node's first join: no time away to report).
        for i in 0..SYNC_SAMPLES as i64 {
            let sent = t2 + Dur::from_ms(i);
            let pong = Msg::Pong {
                seq: 0,
                echo: sent,
                sched: Time(77),
                term: 1,
            };
            assert_eq!(m.handle_msg(sent + Dur::from_us(10), pong), None);
        }
        let acts = drain(&mut m);
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::Send(9, Msg::Register { .. }))));
        let ack = Msg::RegisterAck {
            node: 5,
            gpu_ids: vec![],
            models: vec![],
            heartbeat_ms: 100,
            term: 1,
        };
        let now = t2 + Dur::from_ms(20);
        assert_eq!(m.handle_msg(now, ack), None);
        let acts = drain(&mut m);
        assert!(acts.iter().any(|a| matches!(
            a,
            Action::Joined {
                node: 5,
                away: None,
                ..
            }
        )));
        assert!(m.is_ready());
        // Other messages go to the owner now.
        assert_eq!(
            m.handle_msg(now, Msg::Capacity { gpus: 3 }),
            Some(Msg::Capacity { gpus: 3 })
        );
        assert_eq!(m.counts().joins, 1);
        assert_eq!(m.counts().lost, 1);
        assert_eq!(m.counts().connect_failures, 2);
    }

    /// Syncs and registers (on the connection it has) with a scheduler of `term`.
    fn join(m: &mut Member, at: Time, term: u64) -> Vec<Action> {
        for i in 0..SYNC_SAMPLES as i64 {
            let sent = at + Dur::from_ms(i);
            let pong = Msg::Pong {
                seq: 0,
                echo: sent,
                sched: Time(77),
                term,
            };
            m.handle_msg(sent + Dur::from_us(10), pong);
        }
        let ack = Msg::RegisterAck {
            node: 5,
            gpu_ids: vec![],
            models: vec![],
            heartbeat_ms: 100,
            term,
        };
        m.handle_msg(at + Dur::from_ms(20), ack);
        drain(m)
    }

    /// A node that followed term 2 refuses a scheduler of term 1 (a replaced
    /// primary) at its first pong, hands nothing of it on, and goes to the next
    /// address; its pings tell the highest term it saw.
    #[test]
    fn a_scheduler_of_an_older_term_is_refused() {
        let mut m = member(&["old", "new"]);
        // Joined the new primary (term 2) after the old one was lost.
        m.handle_closed(ms(1), 1, "reset");
        m.handle_timeout(ms(1));
        drain(&mut m);
        m.handle_connected(ms(1), 2);
        let acts = join(&mut m, ms(1), 2);
        assert!(acts.iter().any(|a| matches!(a, Action::Joined { .. })));
        assert_eq!((m.term(), m.conn_term()), (2, Some(2)));
        // That one is lost too; the old primary answers at the next address.
        m.handle_closed(ms(100), 2, "reset");
        let t = m.poll_timeout();
        m.handle_timeout(t);
        assert_eq!(
            drain(&mut m)
                .iter()
                .filter(|a| matches!(a, Action::Connect(x) if x == "old"))
                .count(),
            1
        );
        m.handle_connected(t, 3);
        let acts = drain(&mut m);
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Send(3, Msg::Ping { term: 2, .. }))),
            "{acts:?}"
        );
        let pong = Msg::Pong {
            seq: 0,
            echo: t,
            sched: Time(5),
            term: 1,
        };
        assert_eq!(m.handle_msg(t + Dur::from_us(10), pong), None);
        let acts = drain(&mut m);
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Lost(why) if why.contains("term 1"))),
            "{acts:?}"
        );
        assert!(acts.iter().any(|a| matches!(a, Action::Close(3, _))));
        assert_eq!(m.counts().fenced, 1);
        assert_eq!((m.term(), m.conn_term()), (2, None));
        // Nothing it sends after is handed on.
        assert_eq!(m.handle_msg(t, Msg::Capacity { gpus: 4 }), None);
    }

    #[test]
    fn nothing_is_handed_on_while_away_and_stale_connections_are_closed() {
        let mut m = member(&["a"]);
        m.handle_msg(
            ms(1),
            Msg::Error {
                message: "no".into(),
            },
        );
        drain(&mut m);
        assert_eq!(m.handle_msg(ms(2), Msg::Capacity { gpus: 1 }), None);
        assert_eq!(m.counts().unexpected, 1);
        // A connection the member did not ask for is closed.
        m.handle_connected(ms(3), 4);
        assert_eq!(drain(&mut m), vec![Action::Close(4, "not wanted".into())]);
    }
}
