//! Regression tests for the defects found by attacking the nodes with malformed
//! messages: each message below crashed a node thread, wrapped a
//! deadline, or let a peer act on what it does not own. Every test ends by showing
//! the node still serves its honest peers.

use crossbeam_channel::Receiver;
use fermata::node::frontend::{FrontendNode, FrontendOpts};
use fermata::node::scheduler::{SchedulerNode, SchedulerOpts};
use fermata::node::serve::{Cluster, ClusterOpts};
use fermata::transport::{inproc::InProc, tcp::Tcp, Conn, Event, Transport};
use fermata::wire::{
    task_id, Dur, GpuId, GpuInfo, ModelId, Msg, Outcome, PlanId, Role, SubmitTask, Time,
};
use fermata::workload::Workload;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn workload() -> Workload {
    Workload::from_toml(
        r#"
name = "hostile"
gpus = 2
rate_rps = 100
[[models]]
name = "small"
alpha_ms = 0.5
beta_ms = 2.0
slo_ms = 40
input_bytes = 64
[[models]]
name = "big"
alpha_ms = 1.0
beta_ms = 4.0
slo_ms = 60
input_bytes = 128
"#,
        None,
    )
    .unwrap()
}

/// A scheduler that does not time out silent nodes during a test: the raw peers
/// here do not send heartbeats, and on a loaded machine the steps between a
/// backend entering service and its plan can outlast the default 1 s timeout
/// (its GPUs would leave service and the task be dropped with no plan).
fn patient() -> SchedulerOpts {
    SchedulerOpts {
        node_timeout: Duration::from_secs(30),
        ..SchedulerOpts::default()
    }
}

fn tcp() -> Arc<dyn Transport> {
    Arc::new(Tcp::new().unwrap())
}

/// A backend (one emulated GPU, over TCP) that connects to a raw peer playing
/// its scheduler: the listener, the backend and the peer.
fn backend_under_raw_scheduler() -> (
    Box<dyn fermata::transport::Listener>,
    fermata::node::backend::BackendNode,
    Peer,
) {
    let tr = tcp();
    let (tx, rx) = fermata::transport::event_channel();
    let l = tr.listen("127.0.0.1:0", tx).unwrap();
    let be = fermata::node::backend::BackendNode::start(
        tr.clone(),
        fermata::node::backend::BackendOpts::emulated(&l.local_addr(), 1),
    )
    .unwrap();
    let Ok(Event::Accepted(conn)) = rx.recv_timeout(Duration::from_secs(5)) else {
        panic!("the backend did not connect")
    };
    (l, be, Peer { conn, rx })
}

/// A raw peer of the scheduler: a connection and its events.
struct Peer {
    conn: Arc<dyn Conn>,
    rx: Receiver<Event>,
}

impl Peer {
    fn connect(tr: &Arc<dyn Transport>, addr: &str) -> Peer {
        let (tx, rx) = fermata::transport::event_channel();
        let conn = tr.connect(addr, tx).unwrap();
        Peer { conn, rx }
    }
    fn send(&self, m: Msg) {
        self.conn.send(m).unwrap();
    }
    /// The next message matching `f` within `t` (None: none came, or the
    /// connection closed first).
    fn wait<T>(&self, t: Duration, mut f: impl FnMut(&Msg) -> Option<T>) -> Option<T> {
        let end = Instant::now() + t;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Event::Msg(_, m)) => {
                    if let Some(x) = f(&m) {
                        return Some(x);
                    }
                }
                Ok(Event::Closed(..)) | Err(_) => return None,
                Ok(Event::Accepted(_)) => {}
            }
        }
    }
    /// An `Error` with a message containing `what`, then the close.
    fn expect_error(&self, what: &str) {
        let msg = self
            .wait(Duration::from_secs(5), |m| match m {
                Msg::Error { message } => Some(message.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("expected an Error about `{what}`"));
        assert!(
            msg.contains(what),
            "error `{msg}` does not mention `{what}`"
        );
        let closed = (0..50).any(|_| {
            matches!(
                self.rx.recv_timeout(Duration::from_millis(100)),
                Ok(Event::Closed(..)) | Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            )
        });
        assert!(closed, "the connection must close after the Error");
    }
    /// The scheduler still answers pings.
    fn alive(&self, seq: u64) -> bool {
        self.send(Msg::Ping {
            seq,
            sent: Time(0),
            ctrl_delay: Dur::ZERO,
            pull: Dur::ZERO,
            pull_per_mib: Dur::ZERO,
            pull_hold: Dur::ZERO,
            pull_hold_per_mib: Dur::ZERO,
            term: 0,
        });
        self.wait(Duration::from_secs(3), |m| match m {
            Msg::Pong { seq: s, .. } if *s == seq => Some(()),
            _ => None,
        })
        .is_some()
    }
    fn register_backend(&self, gpus: u32) {
        self.send(Msg::Register {
            role: Role::Backend,
            name: "raw".into(),
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    local: i,
                    name: "raw".into(),
                    mem_bytes: 1 << 30,
                    device: fermata::wire::DeviceKind::Emulated,
                    lanes: 1,
                })
                .collect(),
            ctrl_addr: String::new(),
            region: None,
        });
    }
    fn loaded(&self, model: u32) {
        self.send(Msg::ModelLoaded {
            model: ModelId(model),
            ok: true,
            error: String::new(),
            device_bytes: 0,
        });
    }
    /// Registers as a frontend (with a region nobody reads); its node id.
    fn register_frontend(&self, name: &str) -> u32 {
        self.send(Msg::Register {
            role: Role::Frontend,
            name: name.into(),
            gpus: vec![],
            ctrl_addr: "nowhere:1".into(),
            region: Some(fermata::wire::RegionInfo {
                addr: "nowhere:2".into(),
                region: 1,
                len: 1 << 20,
                rkey: 0,
                base: 0,
            }),
        });
        self.wait(Duration::from_secs(5), |m| match m {
            Msg::RegisterAck { node, .. } => Some(*node),
            _ => None,
        })
        .expect("frontend ack")
    }
    /// Waits for the `RegisterAck`; its GPU ids.
    /// Registers as a backend with one GPU, confirms both models and waits for
    /// the ack: the GPU's global id, when it entered service.
    fn enter_service(&self) -> Option<Vec<GpuId>> {
        self.register_backend(1);
        self.loaded(0);
        self.loaded(1);
        self.ack(Duration::from_secs(5))
    }
    /// As a backend's scheduler: loads the workload's first model and
    /// acknowledges the backend's registration, its one GPU as `gpu`.
    fn load_and_ack(&self, gpu: GpuId) {
        let model = fermata::node::exec::model_infos(&workload())[0].clone();
        self.send(Msg::LoadModel { model });
        let loaded = self.wait(Duration::from_secs(5), |m| match m {
            Msg::ModelLoaded {
                model: ModelId(0),
                ok,
                ..
            } => Some(*ok),
            _ => None,
        });
        assert_eq!(loaded, Some(true));
        self.send(Msg::RegisterAck {
            node: 1,
            gpu_ids: vec![gpu],
            models: vec![],
            heartbeat_ms: 50,
            term: 1,
        });
    }
    /// As a backend's scheduler: sends plan 1, one task of model 0 (its
    /// input at frontend 3) for `gpu`, sent at `sent`, to start at `exec_at`
    /// and end by `deadline`; the status of its `PlanDone`.
    fn plan_one(
        &self,
        gpu: GpuId,
        sent: Time,
        exec_at: Time,
        deadline: Time,
    ) -> Option<fermata::wire::PlanStatus> {
        self.send(Msg::Plan {
            id: PlanId(1),
            model: ModelId(0),
            gpu,
            exec_at,
            finish_at: exec_at.max(sent),
            sent,
            tasks: vec![fermata::wire::PlanTask {
                id: fermata::wire::task_id(3, 1),
                deadline,
                input: 0,
                cap: 1,
            }],
        });
        self.wait(Duration::from_secs(5), |m| match m {
            Msg::PlanDone {
                id: PlanId(1),
                status,
                ..
            } => Some(*status),
            _ => None,
        })
    }
    fn ack(&self, t: Duration) -> Option<Vec<GpuId>> {
        self.wait(t, |m| match m {
            Msg::RegisterAck { gpu_ids, .. } => Some(gpu_ids.clone()),
            _ => None,
        })
    }
}

#[test]
fn a_huge_slo_is_refused_and_the_frontend_goes_on() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr: Arc<dyn Transport> = Arc::new(InProc::global());
    let w = workload();
    let o = ClusterOpts {
        host: "hugeslo".into(),
        region_bytes: 16 << 20,
        ..ClusterOpts::default()
    };
    let c = Cluster::start(tr.clone(), &w, &o).unwrap();
    let p = Peer::connect(&tr, &c.frontend_addrs()[0]);
    let reply = |req: u64| {
        p.wait(Duration::from_secs(10), |m| match m {
            Msg::InferReply {
                req: r,
                status,
                message,
                ..
            } if *r == req => Some((*status, message.clone())),
            _ => None,
        })
        .expect("a reply")
    };
    // Today's main: `arrival + slo` overflows (a panic in the frontend's thread in
    // a debug build, a deadline wrapped negative in release).
    for (req, slo) in [(1u64, i64::MAX), (2, i64::MAX - 1_000), (3, i64::MAX / 2)] {
        p.send(Msg::Infer {
            req,
            model: "small".into(),
            slo: Dur(slo),
            input: vec![1; 64].into(),
        });
        let (status, message) = reply(req);
        assert_eq!(status, Outcome::Failed, "{message}");
        assert!(message.contains("one hour"), "{message}");
    }
    // The frontend still answers: a valid request ends (a lone request may be
    // dropped or late on a busy machine; what matters is that it is answered).
    p.send(Msg::Infer {
        req: 10,
        model: "small".into(),
        slo: Dur::ZERO,
        input: vec![1; 64].into(),
    });
    let (status, message) = reply(10);
    assert_ne!(status, Outcome::Failed, "{message}");
    c.stop().unwrap();
}

#[test]
fn a_huge_ctrl_delay_in_a_ping_does_not_kill_the_scheduler() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = tcp();
    let s = SchedulerNode::start(tr.clone(), &workload(), SchedulerOpts::default()).unwrap();
    let p = Peer::connect(&tr, s.addr());
    // Today's main: `rtt + rtt / 10` overflows in the scheduler's network thread
    // when this backend's GPUs enter service.
    p.send(Msg::Ping {
        seq: 1,
        sent: Time(i64::MIN),
        ctrl_delay: Dur(i64::MAX),
        pull: Dur(i64::MAX),
        pull_per_mib: Dur(i64::MAX),
        pull_hold: Dur(i64::MAX),
        pull_hold_per_mib: Dur(i64::MAX),
        term: 0,
    });
    assert!(p.enter_service().is_some(), "backend enters service");
    let q = Peer::connect(&tr, s.addr());
    assert!(q.alive(7), "the scheduler's network thread must survive");
    drop(p);
    drop(q);
    let rep = s.stop().unwrap();
    // Whatever a node reports, the budget stays within its caps.
    let cap = SchedulerOpts::default();
    assert!(
        rep.d_ctrl_us <= cap.max_ctrl.as_us_f64(),
        "{}",
        rep.d_ctrl_us
    );
    assert!(
        rep.d_data_us <= cap.max_data.as_us_f64(),
        "{}",
        rep.d_data_us
    );
    assert!(
        rep.d_data_fixed_us <= 10.0 * cap.max_data.as_us_f64(),
        "{}",
        rep.d_data_fixed_us
    );
}

#[test]
fn a_backend_enters_service_only_when_each_model_is_loaded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = tcp();
    let s = SchedulerNode::start(tr.clone(), &workload(), SchedulerOpts::default()).unwrap();
    let p = Peer::connect(&tr, s.addr());
    p.register_backend(1);
    // Today's main counts ModelLoaded messages: the same model twice was enough.
    p.loaded(0);
    p.loaded(0);
    assert!(
        p.ack(Duration::from_millis(500)).is_none(),
        "model 1 is not loaded: no RegisterAck yet"
    );
    p.loaded(1);
    assert!(p.ack(Duration::from_secs(5)).is_some());
    // A model id the scheduler does not serve is a protocol error.
    let q = Peer::connect(&tr, s.addr());
    q.register_backend(1);
    q.loaded(9);
    q.expect_error("model 9");
    let r = Peer::connect(&tr, s.addr());
    assert!(r.alive(3));
    drop((p, q, r));
    let rep = s.stop().unwrap();
    assert_eq!(rep.backends_registered, 1);
}

#[test]
fn plan_done_is_checked_against_the_senders_gpus_and_plans() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = tcp();
    let w = workload();
    let s = SchedulerNode::start(tr.clone(), &w, patient()).unwrap();
    // Two raw backends with one GPU each: ids 0 and 1.
    let a = Peer::connect(&tr, s.addr());
    let ga = a.enter_service().expect("a in service");
    let b = Peer::connect(&tr, s.addr());
    let gb = b.enter_service().expect("b in service");
    assert_ne!(ga, gb);
    // A frontend whose tasks make plans.
    let mut fo = FrontendOpts::new(s.addr());
    fo.region_bytes = 16 << 20;
    fo.grace = Duration::from_millis(200);
    let fe = FrontendNode::start(tr.clone(), fo).unwrap();
    let h = fe.handle();
    // A lone request may be dropped before it is planned on a busy machine: send
    // until a plan arrives (a bounded number of times).
    let plan = |peer: &Peer| {
        peer.wait(Duration::from_millis(500), |m| match m {
            Msg::Plan { id, gpu, .. } => Some((*id, *gpu)),
            _ => None,
        })
    };
    let mut got = None;
    for _ in 0..20 {
        let _answer = h.infer("small", Dur(0), vec![3; 64], std::time::Instant::now());
        if let Some(p) = plan(&a) {
            got = Some((p, true));
            break;
        }
        if let Some(p) = plan(&b) {
            got = Some((p, false));
            break;
        }
    }
    let ((plan_a, gpu_a), on_a) = got.expect("a plan for one of the backends");
    // Name them so that `a` got the plan.
    let (a, b, ga, gb) = if on_a { (a, b, ga, gb) } else { (b, a, gb, ga) };
    assert_eq!(vec![gpu_a], ga);
    // Backend b claims a's plan: today's main took it (and freed a's GPU).
    b.send(Msg::PlanDone {
        id: plan_a,
        gpu: gb[0],
        status: fermata::wire::PlanStatus::Ran,
        started: Time(0),
        finished: Time(1),
        missing: 0,
    });
    b.expect_error("plan");
    // Backend a reports on a GPU that is not its own.
    a.send(Msg::PlanDone {
        id: plan_a,
        gpu: gb[0],
        status: fermata::wire::PlanStatus::Ran,
        started: Time(i64::MIN),
        finished: Time(i64::MAX),
        missing: 0,
    });
    a.expect_error("GPU");
    // The scheduler survived both (today's main: `finished - started` overflowed).
    let q = Peer::connect(&tr, s.addr());
    assert!(q.alive(5));
    fe.stop();
    drop((a, b, q));
    let rep = s.stop().unwrap();
    assert_eq!(rep.connections_closed_for_errors, 2);
}

#[test]
fn extreme_times_in_plan_done_do_not_overflow() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = tcp();
    let w = workload();
    let s = SchedulerNode::start(tr.clone(), &w, patient()).unwrap();
    let a = Peer::connect(&tr, s.addr());
    let ga = a.enter_service().expect("in service");
    // A raw frontend submits one task by hand.
    let f = Peer::connect(&tr, s.addr());
    let node = f.register_frontend("rawfe");
    let id = task_id(node, 1);
    let now = f
        .wait(Duration::from_secs(5), |m| match m {
            Msg::Capacity { .. } => Some(()),
            _ => None,
        })
        .map(|_| {
            f.send(Msg::Ping {
                seq: 1,
                sent: Time(0),
                ctrl_delay: Dur::ZERO,
                pull: Dur::ZERO,
                pull_per_mib: Dur::ZERO,
                pull_hold: Dur::ZERO,
                pull_hold_per_mib: Dur::ZERO,
                term: 0,
            });
            f.wait(Duration::from_secs(5), |m| match m {
                Msg::Pong { sched, .. } => Some(*sched),
                _ => None,
            })
            .expect("pong")
        })
        .expect("capacity");
    f.send(Msg::Submit {
        tasks: vec![SubmitTask {
            id,
            model: ModelId(0),
            arrival: now,
            deadline: now + Dur::from_ms(40),
            input: 0,
            cap: 42,
        }],
    });
    let (plan, gpu) = a
        .wait(Duration::from_secs(5), |m| match m {
            Msg::Plan { id, gpu, .. } => Some((*id, *gpu)),
            _ => None,
        })
        .expect("a plan");
    assert_eq!(vec![gpu], ga);
    // Its own plan on its own GPU, with times at the ends of i64.
    a.send(Msg::PlanDone {
        id: plan,
        gpu,
        status: fermata::wire::PlanStatus::Ran,
        started: Time(i64::MIN),
        finished: Time(i64::MAX),
        missing: 0,
    });
    let q = Peer::connect(&tr, s.addr());
    assert!(q.alive(9), "the scheduler survives");
    drop((a, f, q));
    let rep = s.stop().unwrap();
    assert_eq!(rep.plans_done, 1);
}

#[test]
fn a_submit_with_a_task_of_another_frontend_or_a_wild_deadline_is_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = tcp();
    let w = workload();
    let s = SchedulerNode::start(tr.clone(), &w, SchedulerOpts::default()).unwrap();
    let reg = |name: &str| {
        let f = Peer::connect(&tr, s.addr());
        let node = f.register_frontend(name);
        (f, node)
    };
    let (f1, n1) = reg("one");
    let task = |owner: u32, deadline_ns: i64| SubmitTask {
        id: task_id(owner, 1),
        model: ModelId(0),
        arrival: Time(0),
        deadline: Time(deadline_ns),
        input: 0,
        cap: 1,
    };
    // A task id that another frontend owns.
    f1.send(Msg::Submit {
        tasks: vec![task(n1 + 1, 1_000_000)],
    });
    f1.expect_error("task");
    let (f2, n2) = reg("two");
    f2.send(Msg::Submit {
        tasks: vec![task(n2, i64::MAX)],
    });
    f2.expect_error("deadline");
    let q = Peer::connect(&tr, s.addr());
    assert!(q.alive(11));
    drop((f1, f2, q));
    let rep = s.stop().unwrap();
    assert_eq!(rep.connections_closed_for_errors, 2);
}

/// A scheduler that echoes a wild time in a `Pong` (the clock estimate's
/// `t2 - t0` overflowed and killed the backend's network thread) and then plans
/// a batch for the end of time (the GPU's worker would have slept on it for
/// ever): the backend ignores the first, refuses the second with
/// `PlanDone{Failed}`, and keeps serving.
#[test]
fn a_wild_pong_and_a_plan_for_the_end_of_time_do_not_stop_a_backend() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (l, be, sched) = backend_under_raw_scheduler();
    // Answer pings, the first one with a wild echo, until it registers.
    let mut wild = true;
    let registered = sched.wait(Duration::from_secs(10), |m| match m {
        Msg::Ping { seq, sent, .. } => {
            let (echo, sched_t) = if wild {
                (Time(i64::MIN), Time(i64::MAX))
            } else {
                (*sent, *sent)
            };
            wild = false;
            sched.send(Msg::Pong {
                seq: *seq,
                echo,
                sched: sched_t,
                term: 1,
            });
            None
        }
        Msg::Register { .. } => Some(()),
        _ => None,
    });
    assert!(registered.is_some(), "the backend died on the wild pong");
    sched.load_and_ack(GpuId(7));
    let done = sched.plan_one(GpuId(7), Time(0), Time(i64::MAX), Time(i64::MAX));
    assert_eq!(done, Some(fermata::wire::PlanStatus::Failed));
    // Still alive: it goes on pinging.
    let ping = sched.wait(Duration::from_secs(5), |m| {
        matches!(m, Msg::Ping { .. }).then_some(())
    });
    assert!(ping.is_some());
    assert!(!be.is_finished());
    drop(l);
    be.crash();
}

/// A plan that reaches its backend after its tasks' deadlines is not pulled:
/// its task ends dropped as too late (its frontend is not even connected,
/// so a read would have failed it), the plan is reported too late, and the
/// backend counts the input as skipped, not missing.
#[test]
fn a_plan_already_too_late_is_not_pulled() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (l, be, sched) = backend_under_raw_scheduler();
    // The scheduler's clock is the backend's: every pong echoes its ping.
    let mut now = Time(0);
    let registered = sched.wait(Duration::from_secs(10), |m| match m {
        Msg::Ping { seq, sent, .. } => {
            now = *sent;
            sched.send(Msg::Pong {
                seq: *seq,
                echo: *sent,
                sched: *sent,
                term: 1,
            });
            None
        }
        Msg::Register { .. } => Some(()),
        _ => None,
    });
    assert!(registered.is_some());
    sched.load_and_ack(GpuId(0));
    // Planned to start a second ago, for a deadline a moment after that.
    let start = now - Dur::from_ms(1_000);
    let done = sched.plan_one(GpuId(0), start, start, start + Dur::from_ms(20));
    assert_eq!(done, Some(fermata::wire::PlanStatus::TooLate));
    drop(l);
    let r = be.crash();
    assert_eq!((r.inputs_skipped, r.inputs_missing), (1, 0), "{r:?}");
}
