//! Joining the scheduler at start-up: the membership machine ([`Member`]: clock
//! sync, `Register`, the ack) driven on this thread until the frontend is in
//! service and has heard the GPUs in service (`Capacity`). Other events that
//! come meanwhile are kept for the event loop, which then drives the same
//! machine (heartbeats, and rejoining whenever the scheduler is lost).

use super::options::FrontendOpts;
use crate::core::Dur;
use crate::node::clock::SchedClock;
use crate::node::proto::member::{self, Member};
use crate::transport::{Conn, Event, EventTx, Transport};
use crate::wire::{ModelInfo, Msg, NodeId, RegionInfo, Role};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a frontend waits at start-up for the scheduler's ack and the
/// GPUs in service.
const JOIN_MAX: Duration = Duration::from_secs(10);

/// What registration gave the frontend.
pub(super) struct Registered {
    /// The membership, in service (the loop goes on driving it).
    pub(super) member: Member,
    pub(super) sched: Arc<dyn Conn>,
    pub(super) node: NodeId,
    pub(super) models: Vec<ModelInfo>,
    /// GPUs in service.
    pub(super) gpus: u32,
    /// Events that came meanwhile, for the event loop.
    pub(super) early: Vec<Event>,
}

/// Carries out a membership action that concerns only the scheduler's
/// connection `sched` or the `clock` (sends, closes, the offset); hands back
/// the others (connect, joined, lost) for the caller.
pub(super) fn carry(
    a: member::Action,
    sched: &dyn Conn,
    clock: &SchedClock,
) -> Option<member::Action> {
    match a {
        member::Action::Send(c, m) => {
            if c == sched.id() {
                let _ = sched.send(m);
            }
        }
        member::Action::Close(c, why) => {
            if c == sched.id() {
                sched.close(&why);
            }
        }
        member::Action::SetClock { offset, error } => clock.set(offset.0, error.0),
        other => return Some(other),
    }
    None
}

/// The `Register` of this frontend.
pub(super) fn register_msg(opts: &FrontendOpts, ctrl_addr: String, region: RegionInfo) -> Msg {
    Msg::Register {
        role: Role::Frontend,
        name: opts.name.clone(),
        gpus: Vec::new(),
        ctrl_addr,
        region: Some(region),
    }
}

/// Connects to the scheduler, syncs `clock`, registers, and waits for the ack
/// and the GPUs in service. A scheduler lost meanwhile (it refused us, or
/// stepped down for a newer term) is followed by the next address; when each
/// address was lost once, or nothing answered in [`JOIN_MAX`], it is an error.
pub(super) fn register(
    transport: &dyn Transport,
    events: EventTx,
    rx: &Receiver<Event>,
    clock: &SchedClock,
    opts: &FrontendOpts,
    register: Msg,
) -> Result<Registered> {
    let (mut sched, addrs) =
        crate::node::connect_scheduler(transport, &opts.scheduler, events.clone())
            .with_context(|| format!("cannot reach the scheduler at {}", opts.scheduler))?;
    let mut sched_id = sched.id();
    let tries = addrs.len();
    let mut losses = 0;
    let local = clock.local();
    let mut member = Member::new(
        local.now(),
        sched_id,
        addrs,
        register,
        Dur::from_std(opts.scheduler_timeout),
    );
    let t0 = Instant::now();
    let mut early = Vec::new();
    let mut joined: Option<(NodeId, Vec<ModelInfo>)> = None;
    let mut gpus = None;
    loop {
        while let Some(a) = member.poll_action() {
            // A send that fails closes the connection: the member hears of it.
            match carry(a, &*sched, clock) {
                None => {}
                Some(member::Action::Joined { node, models, .. }) => joined = Some((node, models)),
                Some(member::Action::Lost(why)) => {
                    losses += 1;
                    if losses >= tries {
                        bail!("cannot join the scheduler at {}: {why}", opts.scheduler)
                    }
                    tracing::warn!(reason = %why, "frontend: joining the next scheduler address");
                    (joined, gpus) = (None, None);
                }
                Some(member::Action::Connect(addr)) => {
                    let now = local.now();
                    match transport.connect(&addr, events.clone()) {
                        Ok(c) => {
                            sched_id = c.id();
                            sched = c;
                            member.handle_connected(now, sched_id);
                        }
                        Err(e) => member.handle_connect_failed(now, &format!("{e:#}")),
                    }
                }
                Some(_) => {}
            }
        }
        if let (Some((node, models)), Some(gpus)) = (&joined, gpus) {
            return Ok(Registered {
                member,
                sched,
                node: *node,
                models: models.clone(),
                gpus,
                early,
            });
        }
        if t0.elapsed() > JOIN_MAX {
            bail!(
                "no registration answer from the scheduler at {} in {JOIN_MAX:?}",
                opts.scheduler
            );
        }
        let wait = (member.poll_timeout() - local.now()).clamp(Dur::ZERO, Dur::from_ms(50));
        match rx.recv_timeout(Duration::from_nanos(wait.0 as u64)) {
            Ok(Event::Msg(c, m)) if c == sched_id => match member.handle_msg(local.now(), m) {
                Some(Msg::Capacity { gpus: g }) if joined.is_some() => gpus = Some(g),
                Some(m) => early.push(Event::Msg(c, m)),
                None => {}
            },
            Ok(Event::Closed(c, r)) if c == sched_id => {
                member.handle_closed(local.now(), c, &r);
            }
            Ok(ev) => early.push(ev),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("event channel closed"),
        }
        let now = local.now();
        if now >= member.poll_timeout() {
            member.handle_timeout(now);
        }
    }
}
