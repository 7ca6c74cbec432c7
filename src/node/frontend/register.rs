//! Joining the scheduler at start-up: clock sync (pings until the offset is
//! known), `Register` with the frontend's addresses, then the `RegisterAck` (the
//! node id, the models, the heartbeat) and the first `Capacity`. Other events
//! that come meanwhile are kept for the event loop.

use super::options::FrontendOpts;
use crate::core::Dur;
use crate::node::clock::{OffsetEstimator, SchedClock};
use crate::transport::{Conn, ConnId, Event};
use crate::wire::{ModelInfo, Msg, NodeId, RegionInfo, Role};
use anyhow::{bail, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// What registration gave the frontend.
pub(super) struct Registered {
    /// The clock offset's estimator (it goes on with the loop's pongs).
    pub(super) est: OffsetEstimator,
    pub(super) node: NodeId,
    pub(super) models: Vec<ModelInfo>,
    pub(super) heartbeat_ms: u32,
    /// GPUs in service.
    pub(super) gpus: u32,
    /// Events that came meanwhile, for the event loop.
    pub(super) early: Vec<Event>,
}

/// A ping to the scheduler (the loop's heartbeats too).
pub(super) fn ping(clock: &SchedClock, seq: u64) -> Msg {
    Msg::Ping {
        seq,
        sent: clock.local().now(),
        ctrl_delay: Dur::ZERO,
        pull: Dur::ZERO,
    }
}

/// Syncs `clock` with the scheduler on `sched`, registers, and waits for the ack
/// and the GPUs in service.
pub(super) fn register(
    sched: &dyn Conn,
    rx: &Receiver<Event>,
    clock: &SchedClock,
    opts: &FrontendOpts,
    ctrl_addr: String,
    region: RegionInfo,
) -> Result<Registered> {
    let mut early = Vec::new();
    let est = sync_clock(sched, rx, clock, &mut early)?;
    if est.samples() == 0 {
        bail!("the scheduler at {} does not answer pings", opts.scheduler);
    }
    sched
        .send(Msg::Register {
            role: Role::Frontend,
            name: opts.name.clone(),
            gpus: Vec::new(),
            ctrl_addr,
            region: Some(region),
        })
        .map_err(|e| anyhow::anyhow!("cannot register: {e}"))?;
    let (node, models, heartbeat_ms) = await_ack(sched.id(), rx, &mut early)?;
    let gpus = await_capacity(sched.id(), rx, &mut early)?;
    Ok(Registered {
        est,
        node,
        models,
        heartbeat_ms,
        gpus,
        early,
    })
}

/// Pings the scheduler until 8 pongs (or 2 s) have set `clock`'s offset.
fn sync_clock(
    sched: &dyn Conn,
    rx: &Receiver<Event>,
    clock: &SchedClock,
    early: &mut Vec<Event>,
) -> Result<OffsetEstimator> {
    let mut est = OffsetEstimator::new();
    let sched_id = sched.id();
    let t0 = Instant::now();
    let mut seq = 0;
    while est.samples() < 8 && t0.elapsed() < Duration::from_secs(2) {
        seq += 1;
        let _ = sched.send(ping(clock, seq));
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Msg(c, Msg::Pong { echo, sched, .. })) if c == sched_id => {
                est.add(echo, sched, clock.local().now(), clock);
            }
            Ok(Event::Closed(c, r)) if c == sched_id => {
                bail!("the scheduler closed the connection: {r}")
            }
            Ok(ev) => early.push(ev),
            Err(_) => {}
        }
    }
    Ok(est)
}

/// The scheduler's `RegisterAck`: (node id, models, heartbeat in ms).
fn await_ack(
    sched_id: ConnId,
    rx: &Receiver<Event>,
    early: &mut Vec<Event>,
) -> Result<(NodeId, Vec<ModelInfo>, u32)> {
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Msg(
                c,
                Msg::RegisterAck {
                    node,
                    models,
                    heartbeat_ms,
                    ..
                },
            )) if c == sched_id => return Ok((node, models, heartbeat_ms)),
            Ok(Event::Msg(c, Msg::Error { message })) if c == sched_id => {
                bail!("the scheduler refused the frontend: {message}")
            }
            Ok(Event::Closed(c, r)) if c == sched_id => {
                bail!("the scheduler closed the connection: {r}")
            }
            Ok(ev) => early.push(ev),
            Err(RecvTimeoutError::Timeout) => {
                bail!("no registration answer from the scheduler in 5 s")
            }
            Err(RecvTimeoutError::Disconnected) => bail!("event channel closed"),
        }
    }
}

/// The GPUs in service (the `Capacity` that follows the ack at once).
fn await_capacity(sched_id: ConnId, rx: &Receiver<Event>, early: &mut Vec<Event>) -> Result<u32> {
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Msg(c, Msg::Capacity { gpus })) if c == sched_id => return Ok(gpus),
            Ok(Event::Closed(c, r)) if c == sched_id => {
                bail!("the scheduler closed the connection: {r}")
            }
            Ok(ev) => early.push(ev),
            Err(_) => bail!("no capacity message from the scheduler in 5 s"),
        }
    }
}
