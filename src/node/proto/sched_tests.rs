//! The scheduler protocol's tests ([`super`]).

use super::*;
use crate::wire::{RegionInfo, WireProfile};

fn proto() -> SchedProto {
    proto_with(SubClusters::single(2))
}

fn proto_with(subclusters: SubClusters) -> SchedProto {
    proto_with_limits(subclusters, crate::node::proto::bounds::Limits::default())
}

/// A scheduler of two small models (its per-member limits given); the
/// bounds tests use it too.
pub(in crate::node::proto) fn proto_with_limits(
    subclusters: SubClusters,
    limits: crate::node::proto::bounds::Limits,
) -> SchedProto {
    // (The fuzz drivers have the same model, but production modules, their
    // tests included, must not import the fuzz drivers: tests/core_purity.rs.)
    let model = |i: u32| ModelInfo {
        id: ModelId(i),
        name: format!("m{i}"),
        slo: Dur::from_ms(100),
        profile: WireProfile::Linear {
            alpha_ns: 1_000_000,
            beta_ns: 5_000_000,
            max_batch: 16,
        },
        input_bytes: 64,
        meta_json: String::new(),
    };
    SchedProto::new(
        Time(0),
        SchedConfig {
            models: vec![model(0), model(1)],
            heartbeat: Dur::from_ms(100),
            node_timeout: Dur::from_ms(1000),
            plan_grace: crate::node::proto::plans::PLAN_GRACE,
            net_update: Dur::from_ms(200),
            floors: NetBudget::default(),
            max_ctrl: Dur::from_us(2000),
            max_data: Dur::from_us(500),
            max_margin: Dur::from_us(5000),
            limits,
            subclusters,
            latency: Default::default(),
        },
    )
}

fn frontend(p: &mut SchedProto, c: ConnId) {
    frontend_at(p, Time(0), c);
}

/// Frontend connection `c` registers at `now` (its actions left queued; the
/// bounds tests use it too).
pub(in crate::node::proto) fn frontend_at(p: &mut SchedProto, now: Time, c: ConnId) {
    p.handle_accept(now, c);
    p.handle_msg(
        now,
        c,
        Msg::Register {
            role: Role::Frontend,
            name: format!("fe{c}"),
            gpus: vec![],
            ctrl_addr: "x".into(),
            region: Some(RegionInfo {
                addr: "r".into(),
                region: 1,
                len: 1 << 20,
                rkey: 0,
                base: 0,
            }),
        },
    );
}

fn margins_set(p: &mut SchedProto) -> Vec<Vec<Dur>> {
    std::iter::from_fn(|| p.poll_action())
        .filter_map(|a| match a {
            Action::SetMargins(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn closed(p: &mut SchedProto, c: ConnId) -> bool {
    std::iter::from_fn(|| p.poll_action()).any(|a| matches!(a, Action::Close(x, _) if x == c))
}

/// Frontends' response margins reach the core per model, the largest over
/// the frontends, clamped to the cap; they go when a frontend does.
#[test]
fn response_margins_take_the_largest_frontends_clamped() {
    let mut p = proto();
    frontend(&mut p, 1);
    frontend(&mut p, 2);
    margins_set(&mut p);
    let us = Dur::from_us;
    p.handle_msg(
        Time(1),
        1,
        Msg::Margins {
            items: vec![(ModelId(0), us(300))],
        },
    );
    assert_eq!(margins_set(&mut p), vec![vec![us(300), Dur::ZERO]]);
    // Frontend 2 answers slower for model 0, and far beyond the cap for 1.
    let items = vec![(ModelId(0), us(900)), (ModelId(1), Dur::from_ms(60))];
    p.handle_msg(Time(2), 2, Msg::Margins { items });
    assert_eq!(margins_set(&mut p), vec![vec![us(900), us(5000)]]);
    // A change under 10% (and 20 us) is not worth a message to the core.
    p.handle_msg(
        Time(3),
        2,
        Msg::Margins {
            items: vec![(ModelId(0), us(910))],
        },
    );
    assert!(margins_set(&mut p).is_empty());
    // Frontend 2 leaves: frontend 1's margins are what is left.
    p.handle_closed(Time(4), 2, "gone".into());
    assert_eq!(margins_set(&mut p), vec![vec![us(300), Dur::ZERO]]);
}

#[test]
fn margins_from_strangers_or_for_unknown_models_close_the_connection() {
    let mut p = proto();
    // Not registered.
    p.handle_accept(Time(0), 7);
    p.handle_msg(
        Time(0),
        7,
        Msg::Margins {
            items: vec![(ModelId(0), Dur(1))],
        },
    );
    assert!(closed(&mut p, 7));
    // A model id the scheduler does not serve.
    frontend(&mut p, 1);
    let items = vec![(ModelId(0), Dur(5)), (ModelId(2), Dur(1))];
    p.handle_msg(Time(1), 1, Msg::Margins { items });
    assert!(closed(&mut p, 1));
    assert!(margins_set(&mut p).is_empty());
}

fn app_counts(app: &str, outputs: u64, items: u64, requests: u64) -> Msg {
    Msg::AppCounts {
        counters: crate::wire::AppCounters {
            app: app.into(),
            fanout: vec![(outputs, items)],
            latency: vec![crate::wire::StepLatency::default(); 2],
            requests,
        },
    }
}

/// The totals answered to connection `c`: (outputs, items, requests,
/// frontends) of each.
fn totals_to(p: &mut SchedProto, c: ConnId) -> Vec<(u64, u64, u64, u32)> {
    std::iter::from_fn(|| p.poll_action())
        .filter_map(|a| match a {
            Action::Send(
                x,
                Msg::AppTotals {
                    counters,
                    frontends,
                },
            ) if x == c => Some((
                counters.fanout[0].0,
                counters.fanout[0].1,
                counters.requests,
                frontends,
            )),
            _ => None,
        })
        .collect()
}

/// Each frontend's application counters are answered with the sums over
/// every frontend that reported them, a gone frontend's included; a
/// stranger's close its connection, a misshapen report is answered with
/// nothing.
#[test]
fn application_counters_are_answered_with_the_sums_over_the_frontends() {
    let mut p = proto();
    frontend(&mut p, 1);
    frontend(&mut p, 2);
    frontend(&mut p, 3);
    while p.poll_action().is_some() {}
    p.handle_msg(Time(1), 1, app_counts("a", 100, 300, 100));
    assert_eq!(totals_to(&mut p, 1), vec![(100, 300, 100, 1)]);
    p.handle_msg(Time(2), 2, app_counts("a", 0, 0, 0));
    assert_eq!(totals_to(&mut p, 2), vec![(100, 300, 100, 2)]);
    p.handle_msg(Time(3), 1, app_counts("a", 200, 600, 200));
    assert_eq!(totals_to(&mut p, 1), vec![(200, 600, 200, 2)]);
    // Frontend 1 leaves: what it counted stays in the sums.
    p.handle_closed(Time(4), 1, "gone".into());
    p.handle_msg(Time(5), 2, app_counts("a", 10, 10, 10));
    assert_eq!(totals_to(&mut p, 2), vec![(210, 610, 210, 2)]);
    // Another shape of the same application: nothing answered, the
    // connection stays.
    let mut odd = app_counts("a", 1, 1, 1);
    if let Msg::AppCounts { counters } = &mut odd {
        counters.latency.pop();
    }
    p.handle_msg(Time(6), 3, odd);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(acts.is_empty(), "{acts:?}");
    // Not a registered frontend.
    p.handle_accept(Time(7), 9);
    p.handle_msg(Time(7), 9, app_counts("a", 1, 1, 1));
    assert!(closed(&mut p, 9));
}

fn ping(now: Time) -> Msg {
    Msg::Ping {
        seq: 0,
        sent: now,
        ctrl_delay: Dur::ZERO,
        pull: Dur::ZERO,
        pull_per_mib: Dur::ZERO,
        pull_hold: Dur::ZERO,
        pull_hold_per_mib: Dur::ZERO,
        term: 0,
    }
}

/// Records plan `id` of model 0 on GPU `gpu` of `backend`, planned
/// `exec_at`..`finish_at`, with one task (id, deadline), as the dispatch
/// path does.
fn in_flight(
    p: &SchedProto,
    backend: NodeId,
    (id, gpu): (u64, u32),
    (exec_at, finish_at): (Time, Time),
    task: (TaskId, Time),
) {
    let plan = crate::core::Plan {
        id: PlanId(id),
        model: ModelId(0),
        gpu: GpuId(gpu),
        exec_at,
        finish_at,
        tasks: Vec::new(),
    };
    p.plans().lock().unwrap().sent(&plan, backend, [task]);
}

/// A backend's report that plan `id` ran on GPU `gpu`.
fn ran(id: u64, gpu: u32, started: Time, finished: Time) -> Msg {
    Msg::PlanDone {
        id: PlanId(id),
        gpu: GpuId(gpu),
        status: crate::wire::PlanStatus::Ran,
        started,
        finished,
        missing: 0,
    }
}

/// Registers a backend with one GPU on connection `c`; its node id.
fn backend(p: &mut SchedProto, c: ConnId, now: Time) -> NodeId {
    let mut acts = register(p, c, now);
    for m in 0..2 {
        acts.extend(loaded(p, c, now, m, true));
    }
    acts.into_iter()
        .find_map(|a| match a {
            Action::GpusUp { backend, .. } => Some(backend),
            _ => None,
        })
        .expect("the backend's GPU went into service")
}

/// A backend that drains leaves the core at once, hears `Drained` only
/// when its plan in flight is reported done (and the quiet time passed),
/// is not counted as a GPU in service meanwhile, and leaves without a task
/// failed; the count of late tasks comes from the reports.
#[test]
fn a_draining_backend_finishes_its_plans_then_hears_drained() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    frontend(&mut p, 1);
    let fe = 1;
    let b1 = backend(&mut p, 2, ms(0));
    while p.poll_action().is_some() {}
    assert_eq!(p.backends()[0].name, "be2");
    let t = crate::wire::task_id(fe, 1);
    in_flight(&p, b1, (1, 0), (ms(10), ms(14)), (t, ms(15)));
    p.handle_msg(
        ms(5),
        2,
        Msg::Drain {
            reason: "scale in".into(),
        },
    );
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        acts.iter().any(|a| matches!(a, Action::GpusDraining { backend, gpus } if *backend == b1 && gpus == &vec![GpuId(0)])),
        "{acts:?}"
    );
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Send(1, Msg::Capacity { gpus: 0 }))),
        "{acts:?}"
    );
    assert!(p.backends()[0].draining);
    let drained = |p: &mut SchedProto| {
        std::iter::from_fn(|| p.poll_action()).any(|a| matches!(a, Action::Send(2, Msg::Drained)))
    };
    // The plan is still in flight: no Drained, however long.
    for k in 1..=3 {
        let now = ms(100 * k + 5);
        p.handle_msg(now, 2, ping(now));
        p.handle_timeout(now);
        assert!(!drained(&mut p));
    }
    // Done, 2 ms past the task's deadline: counted late.
    p.handle_msg(ms(310), 2, ran(1, 0, ms(10), ms(17)));
    assert_eq!(p.report().tasks_late, 1);
    p.handle_msg(ms(405), 2, ping(ms(405)));
    p.handle_timeout(ms(405));
    assert!(drained(&mut p), "told once its plans are done");
    p.handle_timeout(ms(505));
    assert!(!drained(&mut p), "told once");
    // It leaves: nothing fails, nothing is counted twice.
    p.handle_msg(
        ms(510),
        2,
        Msg::Unregister {
            reason: "drained".into(),
        },
    );
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, Action::Send(_, Msg::Dropped { .. }))),
        "{acts:?}"
    );
    assert_eq!(p.report().backends_left, 1);
    assert_eq!(p.report().backends_drained, 1);
    assert_eq!(p.report().tasks_failed_backend_lost, 0);
    assert!(p.backends().is_empty());
    // A frontend may not drain.
    p.handle_msg(ms(520), 1, Msg::Drain { reason: "x".into() });
    assert!(closed(&mut p, 1));
}

/// The watchdog: a backend that still pings but has not reported a plan
/// done by its end plus the grace is removed and the plan's tasks fail;
/// one that reports in time stays; after a stall of the scheduler itself
/// the watchdog waits one more check.
#[test]
fn a_backend_with_an_overdue_plan_is_removed_and_its_tasks_fail() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    frontend(&mut p, 1);
    let fe = 1; // the first node id
    let b1 = backend(&mut p, 2, ms(0));
    let b2 = backend(&mut p, 3, ms(0));
    while p.poll_action().is_some() {}
    let t = crate::wire::task_id(fe, 1);
    let u = crate::wire::task_id(fe, 2);
    in_flight(&p, b1, (1, 0), (ms(10), ms(20)), (t, Time::NEVER));
    in_flight(&p, b2, (2, 1), (ms(10), ms(20)), (u, Time::NEVER));
    // b2 reports; both keep pinging; b1 never reports plan 1.
    p.handle_msg(ms(21), 3, ran(2, 1, ms(10), ms(20)));
    let mut acts = Vec::new();
    for k in 1..=6 {
        let now = ms(100 * k + 20);
        for c in [1, 2, 3] {
            p.handle_msg(now, c, ping(now));
        }
        p.handle_timeout(now);
        acts.extend(std::iter::from_fn(|| p.poll_action()));
        if k < 5 {
            assert!(
                acts.iter().all(|a| !matches!(a, Action::Close(..))),
                "within the grace (520 ms)"
            );
        }
    }
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Close(2, why) if why.contains("plan 1"))),
        "{acts:?}"
    );
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::GpusDown { backend, .. } if *backend == b1)));
    assert!(acts.iter().any(|a| matches!(a, Action::Send(1, Msg::Dropped { items }) if items.len() == 1 && items[0].0 == t)), "{acts:?}");
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Close(3, _))),
        "b2 reported in time"
    );
    assert_eq!(p.report().backends_overdue, 1);

    // A stall of the scheduler: the first check after it does not act.
    // (b3 joins once b1's GPU id is out of quarantine, and gets it.)
    let b3 = backend(&mut p, 4, ms(1200));
    in_flight(&p, b3, (3, 0), (ms(10), ms(20)), (u, Time::NEVER));
    let now = ms(2000);
    for c in [1, 3, 4] {
        p.handle_msg(now, c, ping(now));
    }
    p.handle_timeout(now);
    assert!(!closed(&mut p, 4), "the check after a stall waits");
    let now = ms(2100);
    for c in [1, 3, 4] {
        p.handle_msg(now, c, ping(now));
    }
    p.handle_timeout(now);
    assert!(closed(&mut p, 4));
}

/// A node is removed after the node timeout of silence, counted on the
/// scheduler's own checks: the time the scheduler itself was away (a gap
/// between its checks) is not the node's silence.
#[test]
fn a_silent_node_is_removed_but_not_for_the_schedulers_own_stall() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    frontend(&mut p, 1);
    frontend(&mut p, 2);
    while p.poll_action().is_some() {}
    // Checks every 100 ms; frontend 1 pings until 500 ms, frontend 2 always:
    // frontend 1 goes at the first check more than 1,000 ms after 500 ms.
    for k in 1..=16 {
        let now = ms(100 * k);
        if k <= 5 {
            p.handle_msg(now, 1, ping(now));
        }
        p.handle_msg(now, 2, ping(now));
        p.handle_timeout(now);
        assert_eq!(closed(&mut p, 1), k == 16, "check at {k}00 ms");
    }
    assert_eq!(p.report().frontends_lost, 1);
    // Frontend 2 pinged at 1,600 ms; the scheduler then runs nothing until
    // 3,000 ms: that check removes no one (1,400 ms since the ping).
    p.handle_timeout(ms(3000));
    assert!(!closed(&mut p, 2), "the scheduler's own stall");
    p.handle_msg(ms(3005), 2, ping(ms(3005)));
    // Silent from then on: removed a node timeout after its last ping.
    for k in 31..=45 {
        p.handle_timeout(ms(100 * k));
        assert_eq!(closed(&mut p, 2), k == 41, "check at {k}00 ms");
    }
    assert_eq!(p.report().frontends_lost, 2);
}

/// A backend with one GPU registers on connection `c`: what follows.
fn register(p: &mut SchedProto, c: ConnId, now: Time) -> Vec<Action> {
    register_typed(p, c, now, &["g"])
}

/// A backend on connection `c` registers one GPU of each type in `types`.
fn register_typed(p: &mut SchedProto, c: ConnId, now: Time, types: &[&str]) -> Vec<Action> {
    let gpus: Vec<_> = types
        .iter()
        .map(|t| (*t, crate::wire::DeviceKind::Emulated))
        .collect();
    register_devices(p, c, now, &gpus)
}

/// A backend on connection `c` registers one GPU of each type and kind in
/// `gpus`.
fn register_devices(
    p: &mut SchedProto,
    c: ConnId,
    now: Time,
    gpus: &[(&str, crate::wire::DeviceKind)],
) -> Vec<Action> {
    let lanes = vec![1; gpus.len()];
    register_slots(p, c, now, gpus, &lanes)
}

/// A backend on connection `c` registers one GPU slot of each type and kind
/// in `gpus`, slot i saying its device has `lanes[i]` lanes.
fn register_slots(
    p: &mut SchedProto,
    c: ConnId,
    now: Time,
    gpus: &[(&str, crate::wire::DeviceKind)],
    lanes: &[u32],
) -> Vec<Action> {
    p.handle_accept(now, c);
    p.handle_msg(
        now,
        c,
        Msg::Register {
            role: Role::Backend,
            name: format!("be{c}"),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, (t, device))| crate::wire::GpuInfo {
                    local: i as u32,
                    name: t.to_string(),
                    mem_bytes: 1 << 30,
                    device: *device,
                    lanes: lanes[i],
                })
                .collect(),
            ctrl_addr: String::new(),
            region: None,
        },
    );
    std::iter::from_fn(|| p.poll_action()).collect()
}

/// The states frontend connection `c` was told in `acts`.
fn states(acts: &[Action], c: ConnId) -> Vec<(u32, ModelAvailability, String)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(x, Msg::ModelStates { items }) if *x == c => Some(items),
            _ => None,
        })
        .flatten()
        .map(|i| (i.model.0, i.state, i.reason.clone()))
        .collect()
}

fn control(p: &mut SchedProto, now: Time, m: u32, load: bool) -> Vec<Action> {
    p.handle_msg(
        now,
        1,
        Msg::ModelControl {
            model: ModelId(m),
            load,
        },
    );
    std::iter::from_fn(|| p.poll_action()).collect()
}

/// Explicit model control: a model not loaded at start is on no backend
/// and takes no task; a load asked by a client loads it on the backends
/// and makes it ready once they confirm; an unload stops new tasks at
/// once and unloads it only after the latest deadline it was given; every
/// change reaches the frontends.
#[test]
fn explicit_model_control_loads_then_drains_before_it_unloads() {
    use ModelAvailability::*;
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    p.set_model_control(ControlMode::Explicit, &[ModelId(0)]);
    frontend(&mut p, 1);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(
        states(&acts, 1),
        vec![(0, Ready, String::new()), (1, Unavailable, String::new())]
    );
    let acts = register(&mut p, 2, ms(0));
    assert_eq!(loads(&acts, 2), (vec![0], vec![]), "only the loaded model");
    loaded(&mut p, 2, ms(0), 0, true);
    let acts = submit(&mut p, ms(1), 1, 1, ms(50));
    assert!(
        acts.iter().any(|a| matches!(a, Action::Send(1, Msg::Dropped { items }) if items[0].1 == DropReason::ModelRemoved)),
        "{acts:?}"
    );
    // Load model 1.
    let acts = control(&mut p, ms(2), 1, true);
    assert_eq!(loads(&acts, 2), (vec![1], vec![]));
    assert_eq!(states(&acts, 1), vec![(1, Loading, String::new())]);
    let acts = loaded(&mut p, 2, ms(3), 1, true);
    assert_eq!(states(&acts, 1), vec![(1, Ready, String::new())]);
    let acts = control(&mut p, ms(3), 1, true);
    assert_eq!(states(&acts, 1), vec![(1, Ready, String::new())], "as is");
    let acts = submit(&mut p, ms(4), 2, 1, ms(300));
    assert!(
        acts.iter().any(|a| matches!(a, Action::Submit(_))),
        "{acts:?}"
    );
    // Unload it: new tasks are dropped at once, the backend keeps it
    // until the latest deadline given (300 ms) has passed.
    let acts = control(&mut p, ms(5), 1, false);
    assert_eq!(states(&acts, 1), vec![(1, Unloading, String::new())]);
    assert_eq!(loads(&acts, 2), (vec![], vec![]));
    let acts = submit(&mut p, ms(6), 3, 1, ms(400));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Submit(_))),
        "{acts:?}"
    );
    p.handle_timeout(ms(350));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(
        loads(&acts, 2),
        (vec![], vec![]),
        "still draining: {acts:?}"
    );
    p.handle_timeout(ms(500));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(loads(&acts, 2), (vec![], vec![1]));
    assert_eq!(states(&acts, 1), vec![(1, Unavailable, String::new())]);
    // A failed load: unavailable, with the backend's reason.
    control(&mut p, ms(600), 1, true);
    let acts = loaded(&mut p, 2, ms(601), 1, false);
    let st = states(&acts, 1);
    assert_eq!((st[0].0, st[0].1), (1, Unavailable), "{st:?}");
    assert!(st[0].2.contains("failed to load"), "{st:?}");
    assert_eq!(loads(&acts, 2), (vec![], vec![1]));
    // A model not loaded does not move.
    assert!(!p.move_model(ms(700), ModelId(1), 0));
    // With none, a load is refused with the reason.
    let mut q = proto();
    frontend(&mut q, 1);
    std::iter::from_fn(|| q.poll_action()).for_each(drop);
    let acts = control(&mut q, ms(1), 0, false);
    let st = states(&acts, 1);
    assert!(
        st[0].1 == Ready && st[0].2.contains("model-control-mode none"),
        "{st:?}"
    );
}

/// A backend's lanes: one count for all its slots, 1 to 64, whole devices,
/// else it is refused with the reason; the view gives each backend's lanes.
#[test]
fn a_backend_registers_whole_devices_of_one_lane_count() {
    let mut p = proto();
    frontend(&mut p, 1);
    let emu = |n: usize| vec![("x", crate::wire::DeviceKind::Emulated); n];
    let refused = |acts: &[Action], c: ConnId, what: &str| {
        acts.iter().any(|a| {
            matches!(a, Action::Send(x, Msg::Error { message }) if *x == c && message.contains(what))
        }) && acts.iter().any(|a| matches!(a, Action::Close(x, _) if *x == c))
    };
    for (c, lanes, what) in [
        (2, vec![2, 2, 1, 1], "one lane count; got 2 and 1"),
        (3, vec![0, 0], "lanes must be 1 to 64, got 0"),
        (4, vec![65], "lanes must be 1 to 64, got 65"),
        (
            5,
            vec![2, 2, 2],
            "3 GPU slots are not whole devices of 2 lanes",
        ),
    ] {
        let acts = register_slots(&mut p, c, Time(0), &emu(lanes.len()), &lanes);
        assert!(refused(&acts, c, what), "{lanes:?}: {acts:?}");
    }
    let acts = register_slots(&mut p, 6, Time(0), &emu(4), &[2; 4]);
    for m in loads(&acts, 6).0 {
        loaded(&mut p, 6, Time(0), m, true);
    }
    let b = p.backends();
    assert_eq!(b.len(), 1);
    assert_eq!((b[0].gpus.len(), b[0].lanes), (4, 2));
}

/// Typed sub-clusters: a backend joins one of its GPUs' type; one of a
/// type no sub-cluster has, or of mixed types, is refused with the reason;
/// an epoch's answer never moves a model to another type.
#[test]
fn a_backend_joins_a_subcluster_of_its_gpu_type_and_models_stay_on_theirs() {
    let ms = |m: i64| Time(m * 1_000_000);
    let subs = SubClusters::new(2, vec![0, 1])
        .unwrap()
        .with_types(vec!["A100".into(), "T4".into()])
        .unwrap();
    let mut p = proto_with(subs);
    frontend(&mut p, 1);
    // Two T4 backends: both in sub-cluster 1, though 0 has fewer GPUs.
    for c in [2, 3] {
        let acts = register_typed(&mut p, c, ms(0), &["t4"]);
        assert_eq!(loads(&acts, c), (vec![1], vec![]), "{acts:?}");
        loaded(&mut p, c, ms(0), 1, true);
    }
    let acts = register_typed(&mut p, 4, ms(0), &["A100", "A100"]);
    assert_eq!(loads(&acts, 4), (vec![0], vec![]));
    loaded(&mut p, 4, ms(0), 0, true);
    let mut subs: Vec<u32> = p.backends().iter().map(|b| b.subcluster).collect();
    subs.sort_unstable();
    assert_eq!(subs, vec![0, 1, 1]);
    let refused = |acts: &[Action], c: ConnId, what: &str| {
        acts.iter().any(|a| {
            matches!(a, Action::Send(x, Msg::Error { message }) if *x == c && message.contains(what))
        }) && acts.iter().any(|a| matches!(a, Action::Close(x, _) if *x == c))
    };
    let acts = register_typed(&mut p, 5, ms(0), &["H100"]);
    assert!(
        refused(&acts, 5, "no sub-cluster takes GPUs of type \"H100\""),
        "{acts:?}"
    );
    let acts = register_typed(&mut p, 6, ms(0), &["A100", "T4"]);
    assert!(refused(&acts, 6, "of one type"), "{acts:?}");
    assert_eq!(p.backends().len(), 3);
    // Model 1 (T4) cannot be moved to the A100 sub-cluster.
    assert_eq!(p.repartition(ms(1), &[0, 0]), 0);
    assert_eq!(p.subclusters().homes(), &[0, 1]);
}

/// Connection `c`'s backend confirms model `m` (or fails to load it).
fn loaded(p: &mut SchedProto, c: ConnId, now: Time, m: u32, ok: bool) -> Vec<Action> {
    p.handle_msg(
        now,
        c,
        Msg::ModelLoaded {
            model: ModelId(m),
            ok,
            error: if ok {
                String::new()
            } else {
                "no memory".into()
            },
            device_bytes: 0,
        },
    );
    std::iter::from_fn(|| p.poll_action()).collect()
}

/// The models a list of actions tells connection `c` to load / unload.
fn loads(acts: &[Action], c: ConnId) -> (Vec<u32>, Vec<u32>) {
    let mut v = (Vec::new(), Vec::new());
    for a in acts {
        match a {
            Action::Send(x, Msg::LoadModel { model }) if *x == c => v.0.push(model.id.0),
            Action::Send(x, Msg::UnloadModel { model }) if *x == c => v.1.push(model.0),
            _ => {}
        }
    }
    v
}

fn submit(p: &mut SchedProto, now: Time, seq: u64, model: u32, deadline: Time) -> Vec<Action> {
    p.handle_msg(
        now,
        1,
        Msg::Submit {
            tasks: vec![crate::wire::SubmitTask {
                id: crate::wire::task_id(1, seq),
                model: ModelId(model),
                arrival: now,
                deadline,
                input: 0,
                cap: 1,
            }],
        },
    );
    std::iter::from_fn(|| p.poll_action()).collect()
}

/// A model moves live between two sub-clusters: the target's backends load
/// it while tasks still go to the source; once they confirm, new tasks go
/// to the target; the source unloads it only after the latest deadline it
/// was given and once its plans of the model are done.
#[test]
fn a_model_moves_live_load_switch_then_unload_after_the_source_drains() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
    frontend(&mut p, 1);
    // Each backend joins the sub-cluster with the fewest GPUs and loads
    // only that sub-cluster's models.
    let acts = register(&mut p, 2, ms(0));
    assert_eq!(loads(&acts, 2), (vec![0], vec![]));
    let acts = loaded(&mut p, 2, ms(0), 0, true);
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::GpusUp { subcluster: 0, .. })));
    let acts = register(&mut p, 3, ms(0));
    assert_eq!(loads(&acts, 3), (vec![1], vec![]));
    let acts = loaded(&mut p, 3, ms(0), 1, true);
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::GpusUp { subcluster: 1, .. })));
    let a = p.backends()[0].node;
    assert_eq!(
        p.backends()
            .iter()
            .map(|b| b.subcluster)
            .collect::<Vec<_>>(),
        vec![0, 1]
    );

    let acts = submit(&mut p, ms(1), 1, 0, ms(50));
    assert!(acts.iter().any(|a| matches!(a, Action::Submit(_))));
    assert!(p.move_model(ms(2), ModelId(0), 1));
    assert!(!p.move_model(ms(2), ModelId(0), 1), "one move at a time");
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(loads(&acts, 3), (vec![0], vec![]), "{acts:?}");
    assert_eq!(loads(&acts, 2), (vec![], vec![]));
    assert!(!acts.iter().any(|a| matches!(a, Action::Route { .. })));
    // Still loading: the task goes to the source (its home).
    submit(&mut p, ms(3), 2, 0, ms(60));
    assert_eq!(p.subclusters().home(ModelId(0)), 0);
    // A backend joining the target now loads the moving model too.
    let acts = register(&mut p, 4, ms(3));
    assert_eq!(
        loads(&acts, 4),
        (vec![0], vec![]),
        "fewest GPUs: sub-cluster 0"
    );
    // The target confirms: the switch.
    let acts = loaded(&mut p, 3, ms(4), 0, true);
    assert!(
        acts.iter().any(|a| matches!(
            a,
            Action::Route {
                model: ModelId(0),
                subcluster: 1
            }
        )),
        "{acts:?}"
    );
    assert_eq!(p.subclusters().home(ModelId(0)), 1);
    // A plan of model 0 at the source, in flight.
    let task = crate::wire::task_id(1, 2);
    in_flight(&p, a, (7, 0), (ms(40), ms(45)), (task, ms(60)));
    // Past the last deadline (60 ms) and the quiet time, but the plan is in
    // flight: no unload.
    for k in 1..=3 {
        let now = ms(100 * k + 100);
        for c in [2, 3] {
            p.handle_msg(now, c, ping(now));
        }
        p.handle_timeout(now);
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(loads(&acts, 2), (vec![], vec![]), "{acts:?}");
    }
    p.handle_msg(ms(410), 2, ran(7, 0, ms(40), ms(45)));
    p.handle_timeout(ms(500));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(loads(&acts, 2), (vec![], vec![0]), "{acts:?}");
    assert_eq!(loads(&acts, 4), (vec![], vec![0]), "the loading one too");
    assert_eq!(p.report().moves.done, 1);
    assert!(!p.subclusters().holds(0, ModelId(0)));
}

/// What was sent on connection `c`.
fn sent_on(acts: &[Action], c: ConnId) -> Vec<&Msg> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(x, m) if *x == c => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn a_following_standby_is_sent_the_assignment_when_it_changes() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = two_subclusters();
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    p.handle_accept(ms(1), 9);
    p.handle_msg(ms(1), 9, Msg::Follow);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(
            &sent_on(&acts, 9)[..],
            [Msg::Assignment { homes }, Msg::LatencyScales { ppm }, Msg::ModelStates { items }]
                if homes == &vec![0, 1] && ppm == &vec![1_000_000; 2] && items.len() == 2
        ),
        "{acts:?}"
    );
    // Unchanged: a ping gets its pong only.
    p.handle_msg(ms(2), 9, ping(ms(2)));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(&sent_on(&acts, 9)[..], [Msg::Pong { .. }]),
        "{acts:?}"
    );
    // A move switches model 0 to sub-cluster 1: the next ping carries it.
    assert!(p.move_model(ms(3), ModelId(0), 1));
    loaded(&mut p, 3, ms(4), 0, true);
    assert_eq!(p.subclusters().home(ModelId(0)), 1);
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    p.handle_msg(ms(5), 9, ping(ms(5)));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(&sent_on(&acts, 9)[..], [Msg::Pong { .. }, Msg::Assignment { homes }] if homes == &vec![1, 1]),
        "{acts:?}"
    );
    // Backends are not sent it; a registered node may not follow.
    p.handle_msg(ms(6), 2, ping(ms(6)));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(&sent_on(&acts, 2)[..], [Msg::Pong { .. }]),
        "{acts:?}"
    );
    p.handle_msg(ms(6), 2, Msg::Follow);
    assert!(closed(&mut p, 2));
}

#[test]
fn a_standby_taking_over_adopts_the_assignment_before_backends_register() {
    let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
    frontend(&mut p, 1);
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    for (bad, why) in [(vec![0], "names 1 models"), (vec![0, 2], "sub-cluster 2")] {
        let e = p.adopt_assignment(&bad).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
    assert_eq!(p.adopt_assignment(&[1, 1]), Ok(1));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(
            &acts[..],
            [Action::Route {
                model: ModelId(0),
                subcluster: 1
            }]
        ),
        "{acts:?}"
    );
    assert_eq!(p.subclusters().homes(), &[1, 1]);
    // Backends joining now load what the adopted homes say.
    let acts = register(&mut p, 2, Time(0));
    assert_eq!(
        loads(&acts, 2),
        (vec![], vec![]),
        "sub-cluster 0 holds none"
    );
    let acts = register(&mut p, 3, Time(0));
    assert_eq!(loads(&acts, 3), (vec![0, 1], vec![]));
    let e = p.adopt_assignment(&[0, 1]).unwrap_err();
    assert!(e.contains("backends registered"), "{e}");
}

/// Two sub-clusters, model 0 in the first and model 1 in the second, a
/// one-GPU backend in each (connections 2 and 3).
fn two_subclusters() -> SchedProto {
    let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
    for (c, m) in [(2, 0), (3, 1)] {
        register(&mut p, c, Time(0));
        loaded(&mut p, c, Time(0), m, true);
    }
    p
}

/// A model that fails to load at its target stays home; the backend that
/// failed stays in service.
#[test]
fn a_failed_load_aborts_the_move() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = two_subclusters();
    assert!(p.move_model(ms(1), ModelId(1), 0));
    while p.poll_action().is_some() {}
    let acts = loaded(&mut p, 2, ms(2), 1, false);
    assert_eq!(loads(&acts, 2), (vec![], vec![1]), "{acts:?}");
    assert!(!acts
        .iter()
        .any(|a| matches!(a, Action::Route { .. } | Action::Close(..))));
    assert_eq!(p.subclusters().home(ModelId(1)), 1);
    assert_eq!(p.report().moves.aborted, 1);
    assert_eq!(p.backends().len(), 2);
}

/// A load that never confirms: after [`MOVE_LOAD_TIMEOUT`] the move is off.
#[test]
fn a_load_that_hangs_aborts_the_move_in_time() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = two_subclusters();
    assert!(p.move_model(ms(1), ModelId(0), 1));
    let step = |p: &mut SchedProto, now: Time| {
        for c in [2, 3] {
            p.handle_msg(now, c, ping(now));
        }
        p.handle_timeout(now);
        std::iter::from_fn(|| p.poll_action()).collect::<Vec<_>>()
    };
    let early = MOVE_LOAD_TIMEOUT - Dur::from_ms(10);
    assert_eq!(loads(&step(&mut p, ms(1) + early), 3).1, Vec::<u32>::new());
    // (The next heartbeat check after the timeout.)
    let acts = step(&mut p, ms(1) + MOVE_LOAD_TIMEOUT + Dur::from_ms(200));
    assert_eq!(loads(&acts, 3), (vec![], vec![0]), "{acts:?}");
    assert_eq!(p.subclusters().home(ModelId(0)), 0);
    assert_eq!(p.report().moves.aborted, 1);
}

fn ping_of(term: u64) -> Msg {
    match ping(Time(0)) {
        Msg::Ping {
            seq,
            sent,
            ctrl_delay,
            pull,
            pull_per_mib,
            pull_hold,
            pull_hold_per_mib,
            ..
        } => Msg::Ping {
            seq,
            sent,
            ctrl_delay,
            pull,
            pull_per_mib,
            pull_hold,
            pull_hold_per_mib,
            term,
        },
        _ => unreachable!(),
    }
}

fn stepped(acts: &[Action]) -> Option<u64> {
    acts.iter().find_map(|a| match a {
        Action::StepDown { term, .. } => Some(*term),
        _ => None,
    })
}

/// Pongs and acks carry the term; a followed scheduler that hears of a
/// newer term from a node steps down: an `Error` to every connection, and
/// nothing after (no timers, new connections refused).
#[test]
fn a_followed_scheduler_steps_down_on_a_node_s_newer_term() {
    let mut p = proto();
    assert_eq!(p.term(), 1);
    frontend(&mut p, 1);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        sent_on(&acts, 1)
            .iter()
            .any(|m| matches!(m, Msg::RegisterAck { term: 1, .. })),
        "{acts:?}"
    );
    p.handle_msg(Time(1), 1, ping_of(1));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(&sent_on(&acts, 1)[..], [Msg::Pong { term: 1, .. }]),
        "{acts:?}"
    );
    // A standby follows it, then a node pings with term 2.
    p.handle_accept(Time(2), 9);
    p.handle_msg(Time(2), 9, Msg::Follow);
    p.handle_accept(Time(3), 5);
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    p.handle_msg(Time(3), 5, ping_of(2));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(stepped(&acts), Some(2), "{acts:?}");
    for c in [1, 5, 9] {
        assert!(
            matches!(&sent_on(&acts, c)[..], [Msg::Error { message }] if message.contains("term 2")),
            "{c}: {acts:?}"
        );
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::Close(x, _) if *x == c)));
    }
    assert_eq!(p.stepped_down(), Some(2));
    assert_eq!(p.poll_timeout(), Time::NEVER);
    p.handle_accept(Time(4), 6);
    p.handle_msg(Time(4), 6, ping_of(0));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(
        matches!(&sent_on(&acts, 6)[..], [Msg::Error { .. }]),
        "{acts:?}"
    );
}

/// No standby ever followed it: a node's newer term is an earlier
/// cluster's, and it serves on above it (the node gets its pong).
#[test]
fn a_never_followed_scheduler_serves_on_above_a_node_s_term() {
    let mut p = proto();
    p.handle_accept(Time(1), 5);
    p.handle_msg(Time(1), 5, ping_of(7));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(stepped(&acts), None);
    assert_eq!(p.term(), 8);
    assert!(
        matches!(&sent_on(&acts, 5)[..], [Msg::Pong { term: 8, .. }]),
        "{acts:?}"
    );
    // Any term a member sends is taken without overflow.
    p.handle_msg(Time(2), 5, ping_of(u64::MAX));
    assert_eq!(p.term(), u64::MAX);
}

/// A `Fence` of a newer term steps any scheduler down; one of an older term
/// is answered with this scheduler's term (its sender steps down), then
/// closed; one from a registered node is a protocol error.
#[test]
fn fences_step_down_or_are_answered() {
    let mut p = proto();
    p.set_term(3);
    p.handle_accept(Time(1), 5);
    p.handle_msg(Time(1), 5, Msg::Fence { term: 2 });
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(sent_on(&acts, 5), vec![&Msg::Fence { term: 3 }]);
    assert!(acts.iter().any(|a| matches!(a, Action::Close(5, _))));
    assert_eq!(stepped(&acts), None);
    frontend(&mut p, 1);
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    p.handle_msg(Time(2), 1, Msg::Fence { term: 9 });
    assert!(closed(&mut p, 1), "a node may not fence");
    assert_eq!(p.stepped_down(), None);
    p.handle_accept(Time(3), 6);
    p.handle_msg(Time(3), 6, Msg::Fence { term: 4 });
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(stepped(&acts), Some(4));
    // A fence of its own term: the fencer took over from it before it
    // learnt this term; the tie goes to the fencer.
    let mut e = proto();
    e.set_term(2);
    e.handle_accept(Time(1), 5);
    e.handle_msg(Time(1), 5, Msg::Fence { term: 2 });
    let acts: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
    assert_eq!(stepped(&acts), Some(2), "{acts:?}");
    assert!(sent_on(&acts, 5)
        .iter()
        .all(|m| !matches!(m, Msg::Fence { .. })));
    // Its own fencer hearing a newer term does the same.
    let mut q = proto();
    q.handle_fenced(1);
    assert_eq!(q.stepped_down(), None, "not newer");
    q.handle_fenced(2);
    assert_eq!(q.stepped_down(), Some(2));
}

/// What frontend connection `c` was told in `acts` of what runs each model.
fn devices_told(acts: &[Action], c: ConnId) -> Vec<(u32, crate::wire::DeviceCounts)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(x, Msg::ModelStates { items }) if *x == c => Some(items),
            _ => None,
        })
        .flatten()
        .map(|i| (i.model.0, i.devices))
        .collect()
}

/// Frontends hear what runs each model's GPUs (its home sub-cluster's GPUs
/// in service, by kind) when it changes, with no model control asked: a
/// backend of CPU executors enters service, one of real GPUs joins the
/// other sub-cluster, a model moves there, that backend is lost.
#[test]
fn frontends_hear_what_runs_each_model_as_it_changes() {
    use crate::wire::{DeviceCounts, DeviceKind};
    let c = |gpu, cpu, emulated| DeviceCounts { gpu, cpu, emulated };
    let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
    frontend(&mut p, 1);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(
        devices_told(&acts, 1),
        vec![(0, c(0, 0, 0)), (1, c(0, 0, 0))],
        "none in service yet"
    );
    let cpu = [("onnxruntime-cpu", DeviceKind::Cpu); 2];
    assert_eq!(
        loads(&register_devices(&mut p, 2, Time(0), &cpu), 2).0,
        vec![0]
    );
    let acts = loaded(&mut p, 2, Time(0), 0, true);
    assert_eq!(devices_told(&acts, 1), vec![(0, c(0, 2, 0))]);
    let gpu = [("H100", DeviceKind::Gpu)];
    assert_eq!(
        loads(&register_devices(&mut p, 3, Time(0), &gpu), 3).0,
        vec![1]
    );
    let acts = loaded(&mut p, 3, Time(0), 1, true);
    assert_eq!(devices_told(&acts, 1), vec![(1, c(1, 0, 0))]);
    // Model 0 moves to the GPU: its frontends hear it at the switch.
    assert!(p.move_model(Time(1), ModelId(0), 1));
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert!(devices_told(&acts, 1).is_empty(), "not switched yet");
    let acts = loaded(&mut p, 3, Time(2), 0, true);
    assert_eq!(devices_told(&acts, 1), vec![(0, c(1, 0, 0))]);
    assert_eq!(p.model_states()[0].devices, c(1, 0, 0));
    p.handle_closed(Time(3), 3, "gone".into());
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(
        devices_told(&acts, 1),
        vec![(0, c(0, 0, 0)), (1, c(0, 0, 0))]
    );
}

/// A following standby hears the models' states (all of them when it
/// follows, then each change); a successor that adopts them before any
/// backend registers serves what was loaded and unloaded at its primary.
#[test]
fn a_standby_hears_the_model_states_and_a_successor_adopts_them() {
    use ModelAvailability::*;
    let ms = |m: i64| Time(m * 1_000_000);
    let heard = |acts: &[Action]| -> Vec<(u32, ModelAvailability)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send(9, Msg::ModelStates { items }) => Some(items),
                _ => None,
            })
            .flatten()
            .map(|i| (i.model.0, i.state))
            .collect()
    };
    let mut p = proto();
    p.set_model_control(ControlMode::Explicit, &[ModelId(0)]);
    frontend(&mut p, 1);
    register(&mut p, 2, ms(0));
    loaded(&mut p, 2, ms(0), 0, true);
    std::iter::from_fn(|| p.poll_action()).for_each(drop);
    p.handle_accept(ms(1), 9);
    p.handle_msg(ms(1), 9, Msg::Follow);
    let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
    assert_eq!(heard(&acts), vec![(0, Ready), (1, Unavailable)]);
    let mut acts = control(&mut p, ms(2), 1, true);
    acts.extend(loaded(&mut p, 2, ms(3), 1, true));
    // A task of model 0 keeps it draining past its unload.
    acts.extend(submit(&mut p, ms(3), 1, 0, ms(500)));
    acts.extend(control(&mut p, ms(4), 0, false));
    assert_eq!(heard(&acts), vec![(1, Loading), (1, Ready), (0, Unloading)]);
    let last: Vec<crate::wire::ModelStateItem> = p.model_states();
    // The standby takes over while model 0 drains at its primary.
    let mut q = proto();
    q.set_model_control(ControlMode::Explicit, &[ModelId(0)]);
    assert_eq!(q.adopt_model_states(&last), Ok(2));
    assert_eq!(
        q.model_states().iter().map(|i| i.state).collect::<Vec<_>>(),
        vec![Unavailable, Ready]
    );
    let acts = register(&mut q, 2, ms(5));
    assert_eq!(
        loads(&acts, 2),
        (vec![1], vec![]),
        "only the model loaded there"
    );
    let e = q.adopt_model_states(&last).unwrap_err();
    assert!(e.contains("backends registered"), "{e}");
    let mut r = proto();
    r.set_model_control(ControlMode::Explicit, &[]);
    let mut bad = last.clone();
    bad[0].model = ModelId(7);
    assert!(r.adopt_model_states(&bad).is_err());
}

/// Plan `i` of model 0 (l(1) = 6 ms), one task, in flight on backend `b`'s
/// GPU 0 from `100 i` ms; `b` (connection 2) reports it ended 9 ms later
/// (1.5x the profile) with `status` and `missing` inputs.
fn slow_plan_done(
    p: &mut SchedProto,
    b: NodeId,
    i: u64,
    status: crate::wire::PlanStatus,
    missing: u32,
) {
    let t0 = Time(100_000_000 * i as i64);
    let task = (crate::wire::task_id(1, i), t0 + Dur::from_ms(50));
    in_flight(p, b, (i, 0), (t0, t0 + Dur::from_ms(6)), task);
    let msg = Msg::PlanDone {
        id: PlanId(i),
        gpu: GpuId(0),
        status,
        started: t0,
        finished: t0 + Dur::from_ms(9),
        missing,
    };
    p.handle_msg(t0 + Dur::from_ms(9), 2, msg);
}

/// Plans that backends report run 1.5x their model's profile move its
/// latency scale once enough say so (an action for the core, the report);
/// a report of another status, or with missing inputs, is no sample.
#[test]
fn batches_slower_than_their_profile_rescale_the_model() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    frontend(&mut p, 1);
    let b = backend(&mut p, 2, ms(0));
    while p.poll_action().is_some() {}
    let scales = |p: &mut SchedProto| -> Vec<Vec<f64>> {
        std::iter::from_fn(|| p.poll_action())
            .filter_map(|a| match a {
                Action::SetLatencyScales(k) => Some(k),
                _ => None,
            })
            .collect()
    };
    // Model 0: l(1) = 6 ms; each plan one task, run 9 ms.
    let done = |p: &mut SchedProto, i: u64, status, missing| {
        slow_plan_done(p, b, i, status, missing);
        let t0 = ms(100 * i as i64);
        p.handle_msg(t0 + Dur::from_ms(9), 2, ping(t0));
    };
    use crate::wire::PlanStatus;
    for i in 1..=30 {
        done(&mut p, i, PlanStatus::TooLate, 0);
        done(&mut p, 100 + i, PlanStatus::Ran, 1);
    }
    assert!(scales(&mut p).is_empty());
    assert_eq!(p.report().latency.samples, 0);
    for i in 1..=19 {
        done(&mut p, 200 + i, PlanStatus::Ran, 0);
    }
    assert!(scales(&mut p).is_empty());
    done(&mut p, 300, PlanStatus::Ran, 0);
    assert_eq!(scales(&mut p), vec![vec![1.5, 1.0]]);
    assert_eq!(p.report().model_latency_scale["m0"], 1.5);
    assert_eq!(p.report().model_latency_scale["m1"], 1.0);
    assert_eq!(p.report().latency.changes, 1);
}

/// A following standby hears the latency scales with the answer to
/// `Follow` and at its next ping after one changed (not before); a
/// successor that adopts them plans with them (an action for the core, the
/// report); scales that do not fit change nothing.
#[test]
fn a_standby_hears_the_latency_scales_and_a_successor_adopts_them() {
    let ms = |m: i64| Time(m * 1_000_000);
    let mut p = proto();
    frontend(&mut p, 1);
    let b = backend(&mut p, 2, ms(0));
    p.handle_accept(ms(1), 9);
    p.handle_msg(ms(1), 9, Msg::Follow);
    let heard = |p: &mut SchedProto| -> Vec<Vec<u32>> {
        std::iter::from_fn(|| p.poll_action())
            .filter_map(|a| match a {
                Action::Send(9, Msg::LatencyScales { ppm }) => Some(ppm),
                _ => None,
            })
            .collect()
    };
    assert_eq!(heard(&mut p), vec![vec![1_000_000; 2]]);
    p.handle_msg(ms(2), 9, ping(ms(2)));
    assert!(heard(&mut p).is_empty(), "unchanged: not sent again");
    // Model 0's batches run 1.5x its profile (l(1) = 6 ms, run 9 ms).
    for i in 1..=20u64 {
        slow_plan_done(&mut p, b, i, crate::wire::PlanStatus::Ran, 0);
    }
    assert!(heard(&mut p).is_empty(), "sent at the standby's ping");
    p.handle_msg(ms(3000), 9, ping(ms(3000)));
    let ppm = heard(&mut p);
    assert_eq!(ppm, vec![vec![1_500_000, 1_000_000]]);
    // The successor plans with them.
    let mut q = proto();
    while q.poll_action().is_some() {}
    assert!(q.adopt_latency_scales(&[1_500_000]).is_err());
    assert!(std::iter::from_fn(|| q.poll_action()).next().is_none());
    q.adopt_latency_scales(&ppm[0]).unwrap();
    let set: Vec<Vec<f64>> = std::iter::from_fn(|| q.poll_action())
        .filter_map(|a| match a {
            Action::SetLatencyScales(k) => Some(k),
            _ => None,
        })
        .collect();
    assert_eq!(set, vec![vec![1.5, 1.0]]);
    assert_eq!(q.report().model_latency_scale["m0"], 1.5);
    assert_eq!(q.latency().scaler().scale(ModelId(0)), 1.5);
    // Beyond the settings' bounds: held to them (at most 4x by default).
    q.adopt_latency_scales(&[100_000_000, 500_000]).unwrap();
    assert_eq!(q.latency().scaler().scales(), vec![4.0, 1.0]);
}
