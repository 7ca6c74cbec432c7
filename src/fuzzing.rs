//! Fuzz drivers: arbitrary bytes turned into sequences of events for each node's
//! protocol machine ([`crate::node::proto`]), into TCP region frames
//! ([`crate::transport::region_wire`]) and into the secure channel's handshake
//! and records ([`crate::transport::auth`]), with the machines' guarantees checked
//! after every step. A panic is a finding. Each driver returns how many times
//! the input reached its machine's deepest path (GPUs in service, a plan
//! queued, a request answered, a read served), so a harness can tell that the
//! inputs get past the first checks.
//!
//! Two harnesses call these: the cargo-fuzz targets in `fuzz/` (coverage-guided,
//! nightly: `cargo +nightly fuzz run sched_proto`) and `tests/fuzz_smoke.rs`
//! (seeded random inputs on stable, in CI). Harness code: no production module
//! imports it (`tests/core_purity.rs`).

use crate::core::{Dur, GpuId, ModelId, NetBudget, PlanId, TaskId, Time};
use crate::node::proto::backend::{Action as BeAction, BackendProto};
use crate::node::proto::bounds::GPU_ID_QUARANTINE;
use crate::node::proto::ledger::{Answer, Ended, RequestLedger};
use crate::node::proto::sched::{Action as SchedAction, SchedConfig, SchedProto};
use crate::transport::auth::{Accept, Channel, ClusterKey, Dial, Service, Step};
use crate::transport::region_wire::{self as rw, AnswerHeader, Request, ANS_LEN, REQ_LEN};
use crate::transport::{InputRef, Region};
use crate::wire::{
    self, task_id, DropReason, GpuInfo, ModelInfo, Msg, PlanStatus, PlanTask, RegionInfo, Role,
    SubmitTask, TaskResult, TaskStatus, WireProfile,
};
use std::collections::{HashMap, HashSet};

/// Reads fuzz bytes as choices; past the end, every read is 0.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }

    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// True one time in `n` (by the next byte).
    pub fn one_in(&mut self, n: u8) -> bool {
        self.u8().is_multiple_of(n.max(1))
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value below `n` (n > 0).
    pub fn below(&mut self, n: u32) -> u32 {
        let v = u32::from_le_bytes([self.u8(), self.u8(), 0, 0]);
        v % n.max(1)
    }

    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    /// A time or duration: often an edge (0, ±1, the ends of i64), often near
    /// `around`, else anything.
    /// A time near `around` ([`Bytes::i64_near`]).
    pub fn time_near(&mut self, around: i64) -> Time {
        Time(self.i64_near(around))
    }

    pub fn i64_near(&mut self, around: i64) -> i64 {
        match self.u8() % 8 {
            0 => 0,
            1 => i64::MAX,
            2 => i64::MIN,
            3 => -1,
            4 | 5 => {
                around.saturating_add(self.below(1 << 16) as i64 * 100_000 - (1 << 15) * 100_000)
            }
            _ => self.u64() as i64,
        }
    }

    /// A small id, sometimes a huge one.
    pub fn id(&mut self, small: u32) -> u64 {
        if self.one_in(8) {
            self.u64()
        } else {
            self.below(small) as u64
        }
    }

    pub fn string(&mut self) -> String {
        let n = self.below(12) as usize;
        (0..n).map(|_| (b'a' + self.u8() % 26) as char).collect()
    }
}

fn model(id: ModelId) -> ModelInfo {
    ModelInfo {
        id,
        name: format!("m{id}"),
        slo: Dur::from_ms(100),
        profile: WireProfile::Linear {
            alpha_ns: 1_000_000,
            beta_ns: 5_000_000,
            max_batch: 16,
        },
        input_bytes: 64,
        meta_json: String::new(),
    }
}

fn region_info(b: &mut Bytes) -> RegionInfo {
    RegionInfo {
        addr: b.string(),
        region: b.below(4),
        len: b.u64(),
        rkey: 0,
        base: 0,
    }
}

/// A task id of one of frontends 1 to 3, mostly with a small sequence number.
fn some_task(b: &mut Bytes) -> TaskId {
    task_id(1 + b.below(3), b.id(100))
}

fn plan_tasks(b: &mut Bytes, now: i64) -> Vec<PlanTask> {
    (0..b.below(4))
        .map(|_| PlanTask {
            id: some_task(b),
            deadline: b.time_near(now),
            input: b.u64(),
            cap: b.u64(),
        })
        .collect()
}

/// A message a peer might send, from the fuzz bytes: every kind, with field
/// values biased towards the edges and towards ids that exist; or, one time in
/// eight, whatever the wire decoder makes of the next bytes.
pub fn msg(b: &mut Bytes, now: i64) -> Option<Msg> {
    let gpu = |b: &mut Bytes| GpuId(b.id(6) as u32);
    Some(match b.u8() % 26 {
        0 => Msg::Register {
            role: if b.bool() {
                Role::Backend
            } else {
                Role::Frontend
            },
            name: b.string(),
            gpus: (0..b.below(3))
                .map(|i| GpuInfo {
                    local: i,
                    name: b.string(),
                    mem_bytes: b.u64(),
                    device: [
                        crate::wire::DeviceKind::Gpu,
                        crate::wire::DeviceKind::Cpu,
                        crate::wire::DeviceKind::Emulated,
                    ][b.below(3) as usize],
                    lanes: b.below(3),
                })
                .collect(),
            ctrl_addr: b.string(),
            region: b.bool().then(|| region_info(b)),
        },
        1 => Msg::ModelLoaded {
            model: ModelId(b.id(4) as u32),
            ok: !b.one_in(4),
            error: b.string(),
            device_bytes: b.u64(),
        },
        2 => Msg::Submit {
            tasks: (0..b.below(4))
                .map(|_| SubmitTask {
                    id: some_task(b),
                    model: ModelId(b.id(4) as u32),
                    arrival: b.time_near(now),
                    deadline: b.time_near(now),
                    input: b.u64(),
                    cap: b.u64(),
                })
                .collect(),
        },
        3 => Msg::PlanDone {
            id: PlanId(b.id(20)),
            gpu: gpu(b),
            status: match b.u8() % 3 {
                0 => PlanStatus::Ran,
                1 => PlanStatus::TooLate,
                _ => PlanStatus::Failed,
            },
            started: b.time_near(now),
            finished: b.time_near(now),
            missing: b.below(8),
        },
        4 | 5 => Msg::Ping {
            seq: b.u64(),
            sent: b.time_near(now),
            ctrl_delay: Dur(b.i64_near(0)),
            pull: Dur(b.i64_near(0)),
            pull_per_mib: Dur(b.i64_near(0)),
            pull_hold: Dur(b.i64_near(0)),
            pull_hold_per_mib: Dur(b.i64_near(0)),
            term: b.below(3) as u64,
        },
        6 | 7 => Msg::Pong {
            seq: b.u64(),
            echo: b.time_near(now),
            sched: b.time_near(now),
            term: b.below(3) as u64,
        },
        8 => Msg::Unregister { reason: b.string() },
        9 => Msg::RegisterAck {
            node: b.id(8) as u32,
            gpu_ids: (0..b.below(4)).map(|_| gpu(b)).collect(),
            models: (0..b.below(3)).map(|i| model(ModelId(i))).collect(),
            heartbeat_ms: b.below(1000),
            term: b.below(3) as u64,
        },
        10 => Msg::LoadModel {
            model: model(ModelId(b.id(4) as u32)),
        },
        11 => Msg::UnloadModel {
            model: ModelId(b.id(4) as u32),
        },
        12 => Msg::FrontendUp {
            node: b.id(4) as u32,
            ctrl_addr: b.string(),
            region: region_info(b),
        },
        13 => Msg::FrontendDown {
            node: b.id(4) as u32,
        },
        14 | 15 => Msg::Plan {
            id: PlanId(b.id(20)),
            model: ModelId(b.id(4) as u32),
            gpu: gpu(b),
            exec_at: b.time_near(now),
            finish_at: b.time_near(now),
            sent: b.time_near(now),
            tasks: plan_tasks(b, now),
        },
        16 => Msg::Results {
            items: (0..b.below(4))
                .map(|_| TaskResult {
                    id: some_task(b),
                    status: if b.bool() {
                        TaskStatus::Ok
                    } else {
                        TaskStatus::Failed
                    },
                    started: b.time_near(now),
                    finished: b.time_near(now),
                    batch_size: b.below(64),
                    output: vec![b.u8(); b.below(4) as usize],
                    cap: b.u64(),
                })
                .collect(),
        },
        17 => Msg::Dropped {
            items: vec![(task_id(1, b.id(100)), DropReason::Expired)],
        },
        18 => Msg::Error {
            message: b.string(),
        },
        19 => Msg::Drain { reason: b.string() },
        20 => Msg::Drained,
        21 => Msg::Follow,
        22 => Msg::Assignment {
            homes: (0..b.below(4)).map(|_| b.below(4)).collect(),
        },
        23 | 24 => Msg::ModelControl {
            model: ModelId(b.below(4)),
            load: b.bool(),
        },
        _ => {
            let n = b.below(64) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| b.u8()).collect();
            return wire::decode(&bytes).ok();
        }
    })
}

/// How far the clock moves between two steps.
fn step(b: &mut Bytes) -> Dur {
    match b.u8() % 4 {
        0 => Dur::ZERO,
        1 => Dur::from_us(b.below(1000) as i64),
        2 => Dur::from_ms(b.below(2000) as i64),
        _ => Dur::from_ms(b.below(10) as i64 * 1000),
    }
}

/// What a well-behaved peer of the scheduler sends next on a connection: a
/// backend registers, then confirms each model; a frontend registers, then
/// submits well-formed tasks. Mixed with arbitrary messages, these let the
/// inputs reach the machine's deep states.
fn good_for_sched(step: usize, backend: bool, node: Option<u32>, now: Time) -> Option<Msg> {
    let region = RegionInfo {
        addr: "r".into(),
        region: 1,
        len: 1 << 20,
        rkey: 0,
        base: 0,
    };
    Some(match (step, backend) {
        (0, _) => Msg::Register {
            role: if backend {
                Role::Backend
            } else {
                Role::Frontend
            },
            name: "n".into(),
            gpus: if backend {
                vec![GpuInfo {
                    local: 0,
                    name: "g".into(),
                    mem_bytes: 1 << 30,
                    device: crate::wire::DeviceKind::Emulated,
                    lanes: 1,
                }]
            } else {
                vec![]
            },
            ctrl_addr: "c".into(),
            region: (!backend).then_some(region),
        },
        (1..=3, true) => Msg::ModelLoaded {
            model: ModelId(step as u32 - 1),
            ok: true,
            error: String::new(),
            device_bytes: 1 << 20,
        },
        // A backend asks to drain now and then (the scheduler then stops
        // planning on it and answers once its plans are done).
        (s, true) if s % 13 == 12 => Msg::Drain {
            reason: "fuzz".into(),
        },
        // Application counters, now and then of another shape (the
        // scheduler refuses those and answers the others with sums).
        (s, false) if s % 11 == 10 => Msg::AppCounts {
            counters: crate::wire::AppCounters {
                app: format!("app{}", s % 3),
                fanout: vec![(s as u64, 3 * s as u64); 1 + s % 2],
                latency: vec![crate::wire::StepLatency::default(); 2],
                requests: s as u64,
            },
        },
        (s, false) if s % 7 == 6 => Msg::Margins {
            items: vec![(ModelId(s as u32 % 4), Dur::from_us(s as i64 * 100))],
        },
        (_, false) => Msg::Submit {
            tasks: vec![SubmitTask {
                id: task_id(node?, step as u64),
                model: ModelId(0),
                arrival: now,
                deadline: now + Dur::from_ms(100),
                input: InputRef { offset: 0, len: 8 }.pack(),
                cap: step as u64 + 1,
            }],
        },
        _ => Msg::Ping {
            seq: step as u64,
            sent: now,
            ctrl_delay: Dur::from_us(50),
            pull: Dur::from_us(1),
            pull_per_mib: Dur::from_us(1),
            pull_hold: Dur::ZERO,
            pull_hold_per_mib: Dur::ZERO,
            term: 1,
        },
    })
}

/// The scheduler's protocol under arbitrary connections, messages, closes and
/// timeouts, from peers that follow the protocol and peers that do not.
/// Checks: no panic; every connection it closes stays closed (no message is
/// sent on it after); a GPU id goes down only while up, and up again only
/// after it went down and its quarantine passed.
pub fn sched_proto(data: &[u8]) -> u64 {
    let mut b = Bytes::new(data);
    let mut now = Time(1_000_000_000);
    let mut p = SchedProto::new(
        now,
        SchedConfig {
            models: (0..3).map(|i| model(ModelId(i))).collect(),
            heartbeat: Dur::from_ms(100),
            node_timeout: Dur::from_ms(1000),
            plan_grace: crate::node::proto::plans::PLAN_GRACE,
            net_update: Dur::from_ms(200),
            floors: NetBudget::default(),
            max_ctrl: Dur::from_us(2000),
            max_data: Dur::from_us(500),
            max_margin: Dur::from_us(5000),
            limits: crate::node::proto::bounds::Limits::default(),
            subclusters: crate::node::proto::subclusters::SubClusters::new(2, vec![0, 1, 0])
                .expect("two sub-clusters"),
            latency: Default::default(),
        },
    );
    if b.bool() {
        // Explicit model control, model 0 loaded at start: frontends'
        // loads and unloads reach the deep states of the drain.
        p.set_model_control(
            crate::node::proto::control::ControlMode::Explicit,
            &[ModelId(0)],
        );
    }
    let mut closed: HashSet<u64> = HashSet::new();
    let mut up: HashSet<GpuId> = HashSet::new();
    let mut down: HashMap<GpuId, Time> = HashMap::new();
    // Open connections: (id, well-behaved step, backend?).
    let mut open: Vec<(u64, usize, bool)> = Vec::new();
    let mut nodes: HashMap<u64, u32> = HashMap::new();
    let mut next = 0;
    let mut deep = 0;
    while !b.done() {
        now += step(&mut b);
        match b.u8() % 8 {
            0 => {
                next += 1;
                p.handle_accept(now, next);
                open.push((next, 0, b.bool()));
            }
            1 if !open.is_empty() && b.one_in(4) => {
                let (c, ..) = open.remove(b.below(open.len() as u32) as usize);
                p.handle_closed(now, c, "fuzz".into());
                closed.insert(c);
            }
            2 if now >= p.poll_timeout() => p.handle_timeout(now),
            3..=5 if !open.is_empty() => {
                let i = b.below(open.len() as u32) as usize;
                let (c, k, be) = open[i];
                open[i].1 += 1;
                if let Some(m) = good_for_sched(k, be, nodes.get(&c).copied(), now) {
                    p.handle_msg(now, c, m);
                }
            }
            // Models move between the two sub-clusters at any time.
            7 if b.one_in(3) => {
                p.move_model(now, ModelId(b.below(3)), b.below(2));
            }
            _ if !open.is_empty() => {
                let (c, ..) = open[b.below(open.len() as u32) as usize];
                if let Some(m) = msg(&mut b, now.0) {
                    p.handle_msg(now, c, m);
                }
            }
            _ => {}
        }
        while let Some(a) = p.poll_action() {
            match a {
                SchedAction::Send(c, m) => {
                    assert!(!closed.contains(&c), "sent on closed {c}");
                    if let Msg::RegisterAck { node, .. } = m {
                        nodes.insert(c, node);
                    }
                }
                SchedAction::Close(c, _) => {
                    open.retain(|o| o.0 != c);
                    closed.insert(c);
                }
                SchedAction::GpusUp { gpus, .. } => {
                    deep += 1;
                    for g in gpus {
                        assert!(up.insert(g), "GPU {g} up twice");
                        if let Some(t) = down.remove(&g) {
                            assert!(now - t >= GPU_ID_QUARANTINE, "GPU {g} given again too soon");
                        }
                    }
                }
                SchedAction::GpusDown { gpus, .. } => {
                    for g in gpus {
                        assert!(up.remove(&g), "GPU {g} down while not up");
                        down.insert(g, now);
                    }
                }
                SchedAction::Submit(t) => deep += t.len() as u64,
                _ => {}
            }
        }
    }
    deep
}

/// The backend's protocol under arbitrary scheduler and frontend messages, load
/// results and timeouts, mixed with what a well-behaved scheduler would send
/// next (a pong for the last ping, the ack after the registration, models, then
/// plans for its GPUs). Checks: no panic; a queued plan is for one of its GPUs
/// and a model every GPU loaded; after `Lost` nothing goes to the scheduler
/// until the backend asked for a new connection and got it (the fuzzer's
/// scheduler then starts over, on connection 1 again).
pub fn backend_proto(data: &[u8]) -> u64 {
    let mut b = Bytes::new(data);
    let mut now = Time(1_000_000_000);
    let gpus = 1 + b.below(3);
    let infos = (0..gpus)
        .map(|local| GpuInfo {
            local,
            name: "f".into(),
            mem_bytes: 1 << 30,
            device: crate::wire::DeviceKind::Emulated,
            lanes: 1,
        })
        .collect();
    let addrs = vec!["sched".to_string()];
    let mut p = BackendProto::new(now, 1, addrs, "be".into(), infos, Dur::from_ms(1000));
    let mut gone = false;
    let mut next_conn = 100;
    let mut deep = 0;
    // What a good scheduler knows: the last ping's time, whether the backend
    // registered, was acked, and how many models it was sent.
    let mut last_ping = None;
    let (mut registered, mut acked, mut models) = (false, false, 0u32);
    while !b.done() {
        now += step(&mut b);
        match b.u8() % 10 {
            0 => {
                if now >= p.poll_timeout() {
                    p.handle_timeout(now);
                }
            }
            1 => {
                let res = if b.one_in(4) {
                    Err("no".into())
                } else {
                    Ok(Some(b.u64()))
                };
                p.handle_loaded(ModelId(b.id(4) as u32), res);
            }
            2 => {
                next_conn += 1;
                p.handle_connected(b.id(4) as u32, next_conn);
            }
            3 if b.one_in(4) => {
                let c = if b.bool() { 1 } else { next_conn };
                p.handle_closed(now, c, "fuzz")
            }
            4..=6 => {
                let m = if !registered {
                    last_ping.map(|sent: Time| Msg::Pong {
                        seq: 0,
                        echo: sent,
                        sched: sent + Dur::from_us(7),
                        term: 1,
                    })
                } else if !acked {
                    acked = true;
                    Some(Msg::RegisterAck {
                        node: 5,
                        gpu_ids: (0..gpus).map(|g| GpuId(10 + g)).collect(),
                        models: vec![],
                        heartbeat_ms: 100,
                        term: 1,
                    })
                } else if models < 2 {
                    models += 1;
                    Some(Msg::LoadModel {
                        model: model(ModelId(models - 1)),
                    })
                } else {
                    Some(Msg::Plan {
                        id: PlanId(b.id(20)),
                        model: ModelId(b.below(2)),
                        gpu: GpuId(10 + b.below(gpus)),
                        exec_at: now + Dur::from_ms(5),
                        finish_at: now + Dur::from_ms(10),
                        sent: now,
                        tasks: plan_tasks(&mut b, now.0),
                    })
                };
                if let Some(m) = m {
                    let loads = matches!(m, Msg::LoadModel { .. });
                    p.handle_msg(now, 1, m);
                    for _ in 0..gpus * u32::from(loads) {
                        p.handle_loaded(ModelId(models - 1), Ok(None));
                    }
                }
            }
            _ => {
                let c = if b.one_in(8) { next_conn } else { 1 };
                if let Some(m) = msg(&mut b, now.0) {
                    p.handle_msg(now, c, m);
                }
            }
        }
        while let Some(a) = p.poll_action() {
            if gone {
                assert!(
                    !matches!(a, BeAction::Send(1, _)),
                    "a send to the lost scheduler: {a:?}"
                );
            }
            match a {
                BeAction::Send(1, Msg::Ping { sent, .. }) => last_ping = Some(sent),
                BeAction::Send(1, Msg::Register { .. }) => registered = true,
                BeAction::Queue { gpu, plan } => {
                    assert!(gpu < gpus as usize);
                    assert!(p.has_loaded(plan.model), "plan for a model not loaded");
                    deep += 1;
                }
                BeAction::Lost(_) => gone = true,
                BeAction::Connect(_) => {
                    // A new connection: the fuzzer's scheduler starts over.
                    gone = false;
                    (registered, acked, models, last_ping) = (false, false, 0, None);
                    if b.one_in(4) {
                        p.handle_sched_connect_failed(now, "fuzz");
                    } else {
                        p.handle_sched_connected(now, 1);
                    }
                }
                _ => {}
            }
        }
    }
    deep
}

/// A frontend's request ledger under arbitrary admissions, answers (for its own
/// requests and others'), sweeps, failures and lost schedulers (pending
/// requests orphaned, then readmitted under new ids or ended). Checks: no
/// panic; every request ends exactly once; the counts add up; nothing is
/// pending after `fail_all`; a result needs its task's capability.
pub fn frontend_ledger(data: &[u8]) -> u64 {
    let mut b = Bytes::new(data);
    let mut now = Time(b.i64_near(1_000_000_000).clamp(i64::MIN / 4, i64::MAX / 4));
    let mut l: RequestLedger<TaskId> = RequestLedger::new(2, Dur::from_ms(3000));
    let mut admitted: Vec<TaskId> = Vec::new();
    // Every id a request had (readmitted ones too) and its capability.
    let mut ids: Vec<TaskId> = Vec::new();
    let mut caps: HashMap<TaskId, u64> = HashMap::new();
    let mut ended: HashSet<TaskId> = HashSet::new();
    let end = |client: TaskId, ended: &mut HashSet<TaskId>| {
        assert!(ended.insert(client), "request {client} ended twice");
    };
    while !b.done() {
        now += step(&mut b);
        match b.u8() % 7 {
            0 | 1 => {
                let slo = Dur(b.i64_near(100_000_000).clamp(1, 3_600_000_000_000));
                let id = l.next_id();
                let input = InputRef { offset: 0, len: 8 };
                let t = l.admit(now, 0, ModelId(0), slo, id, input, cap_of(id));
                assert_eq!((t.id, t.cap), (id, cap_of(id)));
                admitted.push(id);
                ids.push(id);
                caps.insert(id, t.cap);
            }
            2 => {
                let id = match ids.len() {
                    n if n > 0 && !b.one_in(4) => ids[b.below(n as u32) as usize],
                    _ => TaskId(b.u64()),
                };
                let answer = match b.u8() % 3 {
                    0 => Answer::of_drop(DropReason::Expired),
                    1 => Answer::Failed(Ended::Failed, "fuzz".into()),
                    _ => Answer::Output {
                        output: vec![1],
                        started: b.time_near(now.0),
                        finished: b.time_near(now.0),
                        batch_size: b.below(64),
                    },
                };
                if let Some(f) = l.finish(now, id, answer) {
                    end(f.client, &mut ended);
                }
            }
            5 => {
                // A backend's result, with the task's capability or not: only
                // the right one may end a request.
                let id = match ids.len() {
                    n if n > 0 && !b.one_in(4) => ids[b.below(n as u32) as usize],
                    _ => TaskId(b.u64()),
                };
                let right = !b.one_in(3);
                let real = caps.get(&id).copied().unwrap_or(cap_of(id));
                let cap = if right { real } else { !real };
                let pending = l.contains(id);
                let r = TaskResult {
                    id,
                    status: TaskStatus::Ok,
                    started: now,
                    finished: now,
                    batch_size: 1,
                    output: vec![],
                    cap,
                };
                let f = l.result(now, r);
                assert_eq!(f.is_some(), pending && right, "capability check");
                if let Some(f) = f {
                    end(f.client, &mut ended);
                }
            }
            3 => {
                for f in l.handle_timeout(now) {
                    end(f.client, &mut ended);
                }
            }
            4 if b.one_in(8) => {
                for f in l.fail_all(now, Ended::NoScheduler, "fuzz") {
                    end(f.client, &mut ended);
                }
                assert!(l.is_empty());
            }
            6 if b.one_in(4) => {
                // The scheduler is lost: each pending request is handed to
                // the next one under a new id, or ends without one.
                let orphans = l.orphan_all();
                assert!(l.is_empty());
                for o in orphans {
                    if b.bool() {
                        let (cap, old) = (o.cap, o.id);
                        let t = l.readmit(o, ModelId(0), now, now + Dur::from_ms(50));
                        assert!(t.id != old && t.cap == cap);
                        ids.push(t.id);
                        caps.insert(t.id, cap);
                    } else {
                        let f = l.end_orphan(o, Ended::NoScheduler, "fuzz", Dur::ZERO);
                        end(f.client, &mut ended);
                    }
                }
            }
            _ => {}
        }
        let c = l.counts();
        assert_eq!(c.admitted, admitted.len() as u64);
        assert_eq!(c.good + c.late + c.dropped + c.failed, ended.len() as u64);
        assert_eq!(admitted.len(), ended.len() + l.len());
    }
    for f in l.fail_all(now, Ended::NoScheduler, "end") {
        end(f.client, &mut ended);
    }
    assert_eq!(ended.len(), admitted.len(), "a request never ended");
    l.counts().good + l.counts().late
}

/// The capability the ledger fuzzer gives request `id`.
fn cap_of(id: TaskId) -> u64 {
    id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The TCP region protocol's frames: hello and welcome parse without panics and
/// round-trip; a region server answers arbitrary request bytes with one answer
/// per whole request, in order, each with the bytes asked for or an
/// out-of-bounds or denied status, never more than the region holds, and the
/// slot's bytes only to a read with its capability that stays within it.
pub fn region_frames(data: &[u8]) -> u64 {
    let mut h = [0u8; rw::HELLO_LEN];
    let mut w = [0u8; rw::WELCOME_LEN];
    for (i, x) in data.iter().take(rw::WELCOME_LEN).enumerate() {
        if i < rw::HELLO_LEN {
            h[i] = *x;
        }
        w[i] = *x;
    }
    if let Ok(r) = rw::parse_hello(&h) {
        assert_eq!(rw::hello(r), h);
    }
    if let Ok((st, len)) = rw::parse_welcome(&w) {
        assert_eq!(rw::welcome(st, len), w);
    }
    const CAP: u64 = 0xc0ff_ee00_1234_5678;
    let region = Region::new(1, 4096).expect("region");
    let slot = region.put(7, CAP, b"input bytes").expect("room");
    // The first byte picks how often the server flushes; the rest are requests,
    // whose offsets and capabilities are steered towards the slot's (a quarter
    // each its offset, its capability, a probe's).
    let flush_at = 1 + data.first().copied().unwrap_or(0) as usize * 64;
    let mut data = data.get(1..).unwrap_or_default().to_vec();
    for r in data.chunks_exact_mut(REQ_LEN) {
        let off = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
        if off % 4 == 0 {
            r[8..16].copy_from_slice(&slot.offset.to_le_bytes());
        }
        let cap = u64::from_le_bytes(r[20..28].try_into().expect("8 bytes"));
        match cap % 4 {
            0 => r[20..28].copy_from_slice(&CAP.to_le_bytes()),
            1 => r[20..28].copy_from_slice(&crate::transport::PROBE_CAP.to_le_bytes()),
            _ => {}
        }
    }
    let data = &data[..];
    let mut out = Vec::new();
    let mut pos = 0;
    let mut answers = Vec::new();
    let mut served = 0;
    while data.len() - pos >= REQ_LEN {
        let used = rw::serve_requests(&data[pos..], &region, &mut out, flush_at);
        assert!(used > 0 && used.is_multiple_of(REQ_LEN) && pos + used <= data.len());
        // Parse what was answered.
        let mut at = 0;
        for k in 0..used / REQ_LEN {
            let mut r = [0u8; REQ_LEN];
            r.copy_from_slice(&data[pos + k * REQ_LEN..pos + (k + 1) * REQ_LEN]);
            let req = Request::decode(&r);
            let mut hb = [0u8; ANS_LEN];
            hb.copy_from_slice(&out[at..at + ANS_LEN]);
            let a = AnswerHeader::decode(&hb);
            assert_eq!(a.id, req.id);
            at += ANS_LEN;
            if a.status == rw::ST_OK {
                assert_eq!(a.len, req.len);
                assert!(req.offset.saturating_add(req.len as u64) <= region.len());
                let mut want = Vec::new();
                if req.cap == crate::transport::PROBE_CAP {
                    want.resize(req.len as usize, 0);
                } else {
                    assert_eq!(req.cap, CAP, "served without the capability");
                    assert_eq!(req.offset, slot.offset, "served outside the slot");
                    assert!(req.len <= slot.len, "served past the slot");
                    region
                        .read_into(req.offset, req.len, &mut want)
                        .expect("in bounds");
                }
                assert_eq!(&out[at..at + a.len as usize], &want[..]);
                at += a.len as usize;
                served += 1;
            } else {
                assert!(a.status == rw::ST_OOB || a.status == rw::ST_DENIED, "{a:?}");
                assert_eq!(a.len, 0);
            }
            answers.push(a.id);
        }
        assert_eq!(at, out.len(), "bytes beyond the answers");
        out.clear();
        pos += used;
    }
    assert_eq!(answers.len(), data.len() / REQ_LEN);
    // The server's streamed form (a probe's zeros written by the caller, not
    // buffered) puts the same bytes on the wire, and never holds a probe's
    // zeros in its buffer.
    let (mut wire, mut whole, mut buf, mut pos) = (Vec::new(), Vec::new(), Vec::new(), 0);
    loop {
        let (used, zeros) = rw::serve_requests_streamed(&data[pos..], &region, &mut buf, flush_at);
        assert!(buf.len() < flush_at + ANS_LEN + slot.len as usize);
        wire.append(&mut buf);
        wire.resize(wire.len() + zeros as usize, 0);
        pos += used;
        if used == 0 {
            break;
        }
    }
    let mut pos = 0;
    while data.len() - pos >= REQ_LEN {
        pos += rw::serve_requests(&data[pos..], &region, &mut whole, usize::MAX);
    }
    assert_eq!(wire, whole, "the streamed answers differ");
    served
}

/// Runs a secure-channel handshake between a dialer and a listener of `key`
/// in memory, `tamper` changing each of the dialer's flights (its index, its
/// bytes) on the way: the dialer's and the listener's channels (an error or
/// a stall is None).
fn channel_pair(
    key: &ClusterKey,
    dialed: &str,
    port: u16,
    mut tamper: impl FnMut(usize, &mut Vec<u8>),
) -> (Option<Channel>, Option<Channel>) {
    let Ok((mut d, first)) = Dial::start(key, Service::Control, dialed) else {
        return (None, None);
    };
    let mut a = Accept::new(key, Service::Control, port);
    let (mut to_l, mut to_d) = (Vec::new(), Vec::new());
    let mut flight = 0;
    let mut d_need = match first {
        Step::SendThenRead(mut b, n) => {
            tamper(flight, &mut b);
            flight += 1;
            to_l.extend_from_slice(&b);
            n
        }
        _ => return (None, None),
    };
    let mut a_need = a.first();
    let (mut dc, mut lc) = (None, None);
    let (mut d_over, mut l_over) = (false, false);
    loop {
        if !l_over && to_l.len() >= a_need {
            let b: Vec<u8> = to_l.drain(..a_need).collect();
            match a.take(&b) {
                Ok(Step::Read(n)) => a_need = n,
                Ok(Step::SendThenRead(out, n)) => {
                    to_d.extend_from_slice(&out);
                    a_need = n;
                }
                Ok(Step::Done(_, ch)) => {
                    lc = Some(ch);
                    l_over = true;
                }
                Err(_) => l_over = true,
            }
        } else if !d_over && to_d.len() >= d_need {
            let b: Vec<u8> = to_d.drain(..d_need).collect();
            match d.take(&b) {
                Ok(Step::Read(n)) => d_need = n,
                Ok(Step::SendThenRead(mut out, n)) => {
                    tamper(flight, &mut out);
                    flight += 1;
                    to_l.extend_from_slice(&out);
                    d_need = n;
                }
                Ok(Step::Done(mut out, ch)) => {
                    tamper(flight, &mut out);
                    flight += 1;
                    to_l.extend_from_slice(&out);
                    dc = Some(ch);
                    d_over = true;
                }
                Err(_) => d_over = true,
            }
        } else {
            return (dc, lc);
        }
    }
}

/// The secure channel ([`crate::transport::auth`]) under arbitrary bytes:
/// garbage fed to a listener's handshake in the sizes it asks for never opens
/// a channel; a real handshake whose dialer flights get bytes changed (which,
/// where, to what: from the fuzz bytes) never opens one on the listener's
/// side, and one left alone always does; then records of arbitrary bytes,
/// sealed and cut at arbitrary points, open to exactly those bytes, and a
/// record stream with one byte changed yields an error, never other bytes.
/// Returns 1 when a channel opened and carried records.
pub fn channel_handshake(data: &[u8]) -> u64 {
    let key = ClusterKey::new(b"fuzzing-cluster-secret").expect("key");
    // 1. Garbage to a listener.
    let mut a = Accept::new(&key, Service::Control, 7300);
    let mut need = a.first();
    let mut pos = 0;
    while pos + need <= data.len() {
        match a.take(&data[pos..pos + need]) {
            Ok(Step::Read(n)) | Ok(Step::SendThenRead(_, n)) => {
                pos += need;
                need = n;
                assert!(n <= 65537, "a handshake asks for at most one message");
            }
            Ok(Step::Done(..)) => panic!("arbitrary bytes opened a channel"),
            Err(_) => break,
        }
    }
    // 2. A real handshake, maybe changed on the way.
    let mut b = Bytes::new(data);
    let change = b.bool();
    let (which, at, xor) = (b.below(3) as usize, b.below(400) as usize, b.u8() | 1);
    let mut changed = false;
    let (dc, lc) = channel_pair(&key, "sched:7300", 7300, |i, bytes| {
        if change && i == which && !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] ^= xor;
            changed = true;
        }
    });
    if changed {
        assert!(lc.is_none(), "a changed handshake opened a channel");
        return 0;
    }
    let (Some(mut dc), Some(mut lc)) = (dc, lc) else {
        panic!("a handshake left alone failed");
    };
    // 3. Records.
    let n = b.below(4096) as usize + b.below(3) as usize * 70_000;
    let (flip_it, flip_at, flip_xor) = (b.one_in(3), b.below(u32::MAX) as usize, b.u8() | 1);
    let plain: Vec<u8> = (0..n).map(|i| (i as u8) ^ b.u8()).collect();
    let mut stream = Vec::new();
    dc.sealer.seal(&plain, &mut stream).expect("seal");
    let flip = flip_it.then(|| flip_at % stream.len().max(1));
    if let Some(f) = flip {
        if !stream.is_empty() {
            stream[f] ^= flip_xor;
        }
    }
    let mut got = Vec::new();
    let mut raw = Vec::new();
    let mut failed = false;
    let mut p = 0;
    while p < stream.len() {
        let cut = (1 + b.below(20_000) as usize).min(stream.len() - p);
        raw.extend_from_slice(&stream[p..p + cut]);
        p += cut;
        let before = got.len();
        match lc.opener.open(&raw, &mut got) {
            Ok(used) => {
                raw.drain(..used);
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
        // What this call opened; the whole prefix once more below, a failed
        // call included: nothing of a record that did not verify is kept.
        // (Checking the prefix after every cut was quadratic in the stream.)
        assert!(
            got.len() >= before && plain.get(before..got.len()) == got.get(before..),
            "a record opened to other bytes"
        );
    }
    assert!(plain.starts_with(&got), "a record opened to other bytes");
    match flip {
        Some(_) if !stream.is_empty() => {
            assert!(failed || !raw.is_empty(), "a changed record stream opened");
            0
        }
        _ => {
            assert!(!failed && raw.is_empty() && got == plain);
            u64::from(n > 0)
        }
    }
}

/// Members joining and leaving the scheduler as the bytes say: backends
/// registering up to 20 GPUs (the limit here is 16 per member and 8 members),
/// confirming their models or not, leaving with `Unregister`, by a close or
/// by silence; frontends registering and leaving; time passing. Checks after
/// every step: a registration past a limit gets an `Error` before its close;
/// no GPU id is given while in service or within its quarantine; the GPU
/// slots never exceed the most GPUs owned at once; members never exceed the
/// limit; and once every member is gone and the quarantine has passed, the
/// per-member state is empty again.
pub fn sched_churn(data: &[u8]) -> u64 {
    use crate::node::proto::bounds::Limits;
    let mut b = Bytes::new(data);
    let mut now = Time(1_000_000_000);
    let limits = Limits {
        max_gpus_per_member: 16,
        max_members: 8,
    };
    let mut p = SchedProto::new(
        now,
        SchedConfig {
            models: (0..2).map(|i| model(ModelId(i))).collect(),
            heartbeat: Dur::from_ms(100),
            node_timeout: Dur::from_ms(1000),
            plan_grace: crate::node::proto::plans::PLAN_GRACE,
            net_update: Dur::from_ms(200),
            floors: NetBudget::default(),
            max_ctrl: Dur::from_us(2000),
            max_data: Dur::from_us(500),
            max_margin: Dur::from_us(5000),
            subclusters: crate::node::proto::subclusters::SubClusters::single(2),
            limits,
            latency: Default::default(),
        },
    );
    let mut open: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut up: HashSet<GpuId> = HashSet::new();
    let mut down: HashMap<GpuId, Time> = HashMap::new();
    let (mut peak, mut deep) = (0usize, 0u64);
    let mut refused = 0u64;
    let register = |backend: bool, gpus: u32| Msg::Register {
        role: if backend {
            Role::Backend
        } else {
            Role::Frontend
        },
        name: "m".into(),
        gpus: (0..gpus)
            .map(|local| GpuInfo {
                local,
                name: "g".into(),
                mem_bytes: 1 << 30,
                device: crate::wire::DeviceKind::Emulated,
                lanes: 1,
            })
            .collect(),
        ctrl_addr: "c".into(),
        region: (!backend).then(|| RegionInfo {
            addr: "r".into(),
            region: 1,
            len: 1 << 20,
            rkey: 0,
            base: 0,
        }),
    };
    let mut finish = false;
    loop {
        if b.done() && !finish {
            // Everyone leaves; time passes the quarantine.
            finish = true;
            for c in open.drain(..) {
                p.handle_closed(now, c, "end".into());
            }
            now += GPU_ID_QUARANTINE + Dur::from_ms(1);
            p.handle_timeout(now);
        } else if !finish {
            now += match b.u8() % 4 {
                0 => Dur::ZERO,
                1 => Dur::from_ms(b.below(100) as i64),
                _ => Dur::from_ms(b.below(600) as i64),
            };
            match b.u8() % 8 {
                0..=2 => {
                    next += 1;
                    p.handle_accept(now, next);
                    open.push(next);
                    let backend = !b.one_in(4);
                    p.handle_msg(now, next, register(backend, 1 + b.below(20)));
                    if backend && !b.one_in(8) {
                        for m in 0..2 {
                            let loaded = Msg::ModelLoaded {
                                model: ModelId(m),
                                ok: true,
                                error: String::new(),
                                device_bytes: 0,
                            };
                            p.handle_msg(now, next, loaded);
                        }
                    }
                }
                3 | 4 if !open.is_empty() => {
                    let c = open.remove(b.below(open.len() as u32) as usize);
                    if b.bool() {
                        let bye = Msg::Unregister { reason: "b".into() };
                        p.handle_msg(now, c, bye);
                    } else {
                        p.handle_closed(now, c, "gone".into());
                    }
                }
                5 if !open.is_empty() => {
                    // A member pings (the others fall silent).
                    let c = open[b.below(open.len() as u32) as usize];
                    let ping = Msg::Ping {
                        seq: 0,
                        sent: now,
                        ctrl_delay: Dur::ZERO,
                        pull: Dur::ZERO,
                        pull_per_mib: Dur::ZERO,
                        pull_hold: Dur::ZERO,
                        pull_hold_per_mib: Dur::ZERO,
                        term: 0,
                    };
                    p.handle_msg(now, c, ping);
                }
                _ => {}
            }
            if now >= p.poll_timeout() {
                p.handle_timeout(now);
            }
        }
        let mut errors: HashSet<u64> = HashSet::new();
        while let Some(a) = p.poll_action() {
            match a {
                SchedAction::Send(c, Msg::Error { .. }) => {
                    errors.insert(c);
                }
                SchedAction::Close(c, why) => {
                    open.retain(|&o| o != c);
                    if why.contains("--max-") {
                        assert!(errors.contains(&c), "refused without an Error: {why}");
                    }
                }
                SchedAction::GpusUp { gpus, .. } => {
                    deep += 1;
                    for g in gpus {
                        assert!(up.insert(g), "GPU {g} given while in service");
                        if let Some(t) = down.remove(&g) {
                            assert!(now - t >= GPU_ID_QUARANTINE, "GPU {g} given too soon");
                        }
                    }
                    // (Others may leave later in the same step.)
                    peak = peak.max(up.len());
                }
                SchedAction::GpusDown { gpus, .. } => {
                    for g in gpus {
                        assert!(up.remove(&g), "GPU {g} down while not up");
                        down.insert(g, now);
                    }
                }
                _ => {}
            }
        }
        let s = p.state_sizes();
        let r = p.report().refused_for_limits;
        assert!(r >= refused);
        refused = r;
        assert_eq!(s.gpus_owned, up.len(), "{s:?}");
        peak = peak.max(s.gpus_owned);
        assert!(
            s.gpu_slots <= peak,
            "{s:?}, at most {peak} GPUs owned at once"
        );
        assert!(
            s.names + s.frontends <= limits.max_members as usize,
            "{s:?}"
        );
        if finish {
            assert_eq!(
                (
                    s.conns,
                    s.frontends,
                    s.names,
                    s.gpus_owned,
                    s.gpus_quarantined
                ),
                (0, 0, 0, 0, 0),
                "{s:?}"
            );
            return deep;
        }
    }
}
