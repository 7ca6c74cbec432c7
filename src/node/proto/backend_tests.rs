//! The backend protocol's tests ([`super`]).

use super::*;
use crate::core::Dur;

fn ms(v: i64) -> Time {
    Time(v * 1_000_000)
}

fn gpus(n: u32) -> Vec<GpuInfo> {
    (0..n)
        .map(|local| GpuInfo {
            local,
            name: "t".into(),
            mem_bytes: 1 << 30,
            device: crate::wire::DeviceKind::Emulated,
            lanes: 1,
        })
        .collect()
}

fn new_proto(n: u32) -> BackendProto {
    let addrs = vec!["sched".to_string()];
    BackendProto::new(ms(0), 1, addrs, "be".into(), gpus(n), Dur::from_ms(500))
}

fn drain(p: &mut BackendProto) -> Vec<Action> {
    std::iter::from_fn(|| p.poll_action()).collect()
}

fn model(id: u32) -> ModelInfo {
    ModelInfo {
        id: ModelId(id),
        name: format!("m{id}"),
        slo: Dur(100_000_000),
        profile: crate::wire::WireProfile::Linear {
            alpha_ns: 1_000_000,
            beta_ns: 5_000_000,
            max_batch: 32,
        },
        input_bytes: 64,
        meta_json: String::new(),
    }
}

fn pong(p: &mut BackendProto, now: Time, sent: Time) {
    pong_on(p, 1, now, sent);
}

/// The scheduler's answer on connection `c` to a ping sent at `sent`.
fn pong_on(p: &mut BackendProto, c: ConnId, now: Time, sent: Time) {
    let m = Msg::Pong {
        seq: 0,
        echo: Time(sent.0),
        sched: Time(sent.0 + 1_000),
        term: 1,
    };
    p.handle_msg(now, c, m);
}

/// A backend with 2 GPUs (global ids 10, 11), registered, with model 0
/// loaded on both.
fn ready() -> BackendProto {
    let mut p = new_proto(2);
    for i in 0..SYNC_SAMPLES as i64 {
        pong(&mut p, ms(i + 1), ms(i));
    }
    let acts = drain(&mut p);
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Send(1, Msg::Register { .. }))));
    p.handle_msg(ms(20), 1, Msg::LoadModel { model: model(0) });
    p.handle_loaded(ModelId(0), Ok(Some(7)));
    assert!(!p.has_loaded(ModelId(0)), "one GPU of two");
    p.handle_loaded(ModelId(0), Ok(Some(9)));
    assert!(p.has_loaded(ModelId(0)));
    p.handle_msg(ms(21), 1, register_ack(3, &[10, 11]));
    let acts = drain(&mut p);
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::Send(
            1,
            Msg::ModelLoaded {
                model: ModelId(0),
                ok: true,
                device_bytes: 9,
                ..
            }
        )
    )));
    assert!(acts.iter().any(
        |a| matches!(a, Action::Ready { gpus, away: None } if gpus == &vec![GpuId(10), GpuId(11)])
    ));
    p
}

/// A scheduler's `RegisterAck` (term 1, heartbeat 50 ms, no models) naming
/// the backend `node` with these GPU ids.
fn register_ack(node: NodeId, gpus: &[u32]) -> Msg {
    Msg::RegisterAck {
        node,
        heartbeat_ms: 50,
        gpu_ids: gpus.iter().map(|&g| GpuId(g)).collect(),
        models: vec![],
        term: 1,
    }
}

fn plan_msg(gpu: u32, model: u32, exec_at: Time) -> Msg {
    Msg::Plan {
        id: PlanId(5),
        model: ModelId(model),
        gpu: GpuId(gpu),
        exec_at: Time(exec_at.0),
        finish_at: Time(exec_at.0),
        sent: Time(ms(22).0),
        tasks: vec![PlanTask {
            id: crate::wire::task_id(2, 1),
            deadline: Time(ms(500).0),
            input: 0,
            cap: 1,
        }],
    }
}

#[test]
fn registers_after_the_clock_sync_and_is_ready_on_the_ack() {
    let p = ready();
    assert!(p.is_ready());
    assert_eq!(p.counts().unexpected, 0);
}

#[test]
fn a_scheduler_that_never_answers_is_left_and_tried_again() {
    let mut p = new_proto(1);
    let mut now = ms(0);
    let mut acts = Vec::new();
    while !acts.iter().any(|a| matches!(a, Action::Connect(_))) {
        now = p.poll_timeout();
        p.handle_timeout(now);
        acts.extend(drain(&mut p));
    }
    let pings = acts
        .iter()
        .filter(|a| matches!(a, Action::Send(1, Msg::Ping { .. })))
        .count();
    assert_eq!(pings, 3, "a ping every 200 ms until the 500 ms timeout");
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Lost(w) if w.contains("does not answer"))));
    assert!(acts.iter().any(|a| matches!(a, Action::Close(1, _))));
    // The first retry after about the shortest backoff.
    let lost_at = ms(500);
    assert!(now >= lost_at + Dur(member::BACKOFF_MIN.0 * 3 / 4));
    assert!(now <= lost_at + Dur(member::BACKOFF_MIN.0 * 5 / 4));
    assert!(matches!(acts.last(), Some(Action::Connect(a)) if a == "sched"));
    assert_eq!(p.poll_timeout(), Time::NEVER, "waits for the connection");
    // It cannot connect: the next wait is longer.
    p.handle_sched_connect_failed(now, "refused");
    let next = p.poll_timeout();
    assert!(next - now >= Dur(member::BACKOFF_MIN.0 * 2 * 3 / 4));
}

/// The new session's `RegisterAck` (node 4, GPUs 12 and 13) on the
/// connection 7 at `at`; what the backend does then.
fn rejoin_ack(p: &mut BackendProto, at: Time) -> Vec<Action> {
    p.handle_msg(at, 7, register_ack(4, &[12, 13]));
    drain(p)
}

#[test]
fn a_rejoin_unloads_the_models_the_new_scheduler_did_not_ask_for() {
    let mut p = ready();
    p.handle_timeout(ms(600));
    assert!(drain(&mut p).iter().any(|a| matches!(a, Action::Lost(_))));
    let t = p.poll_timeout();
    p.handle_timeout(t);
    drain(&mut p);
    p.handle_sched_connected(t, 7);
    for i in 0..SYNC_SAMPLES as i64 {
        pong_on(&mut p, 7, t + Dur::from_ms(i + 1), t + Dur::from_ms(i));
    }
    drain(&mut p);
    // The new scheduler puts the backend where model 1 is served, not 0.
    p.handle_msg(t + Dur::from_ms(20), 7, Msg::LoadModel { model: model(1) });
    assert!(matches!(drain(&mut p)[..], [Action::Load(..)]));
    p.handle_loaded(ModelId(1), Ok(Some(5)));
    p.handle_loaded(ModelId(1), Ok(Some(5)));
    drain(&mut p);
    assert!(p.has_loaded(ModelId(0)), "kept until the ack");
    let acts = rejoin_ack(&mut p, t + Dur::from_ms(22));
    let unloads: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Unload(m) => Some(*m),
            _ => None,
        })
        .collect();
    assert_eq!(unloads, vec![ModelId(0)], "{acts:?}");
    assert!(acts.iter().any(|a| matches!(a, Action::Ready { .. })));
    assert!(!p.has_loaded(ModelId(0)));
    assert!(p.has_loaded(ModelId(1)));
    assert_eq!(p.counts().stale_unloaded, 1);
    // A plan of the model dropped is refused, as for any model not loaded.
    p.handle_msg(
        t + Dur::from_ms(23),
        7,
        plan_msg(12, 0, t + Dur::from_ms(30)),
    );
    assert_eq!(p.counts().refused_not_loaded, 1);
}

#[test]
fn a_silent_scheduler_is_left_and_the_backend_rejoins_with_its_models() {
    let mut p = ready();
    p.handle_connected(2, 40);
    p.handle_timeout(ms(600));
    let acts = drain(&mut p);
    assert!(acts.iter().any(|a| matches!(a, Action::Close(1, _))));
    assert!(acts.iter().any(|a| matches!(a, Action::Lost(_))));
    assert!(
        acts.iter().any(|a| matches!(
            a,
            Action::Detach {
                node: 2,
                conn: Some(40)
            }
        )),
        "frontends are detached: {acts:?}"
    );
    assert!(!p.is_ready());
    assert_eq!(p.sched_conn(), None);
    // A plan for the old session's GPU is refused now.
    let t = p.poll_timeout();
    p.handle_timeout(t);
    assert!(matches!(drain(&mut p)[..], [Action::Connect(_)]));
    p.handle_sched_connected(t, 7);
    // Clock sync on the new connection, then Register.
    for i in 0..SYNC_SAMPLES as i64 {
        pong_on(&mut p, 7, t + Dur::from_ms(i + 1), t + Dur::from_ms(i));
    }
    let acts = drain(&mut p);
    assert!(acts
        .iter()
        .any(|a| matches!(a, Action::Send(7, Msg::Register { .. }))));
    // The same model again: confirmed by the GPUs' workers, not loaded again.
    p.handle_msg(t + Dur::from_ms(20), 7, Msg::LoadModel { model: model(0) });
    assert!(matches!(drain(&mut p)[..], [Action::Confirm(ModelId(0))]));
    p.handle_loaded(ModelId(0), Ok(None));
    assert!(drain(&mut p).is_empty(), "one GPU of two");
    p.handle_loaded(ModelId(0), Ok(None));
    let acts = drain(&mut p);
    assert!(
        matches!(
            &acts[..],
            [Action::Send(
                7,
                Msg::ModelLoaded {
                    ok: true,
                    device_bytes: 9,
                    ..
                }
            )]
        ),
        "{acts:?}"
    );
    // A model with another description is loaded.
    let mut other = model(0);
    other.input_bytes = 128;
    p.handle_msg(t + Dur::from_ms(21), 7, Msg::LoadModel { model: other });
    assert!(matches!(drain(&mut p)[..], [Action::Load(..)]));
    let acts = rejoin_ack(&mut p, t + Dur::from_ms(22));
    assert!(acts.iter().any(|a| matches!(
        a,
        Action::Ready { gpus, away: Some(d) } if gpus == &vec![GpuId(12), GpuId(13)] && *d > Dur::ZERO
    )));
    assert!(p.is_ready());
    assert_eq!(p.member_counts().joins, 2);
    assert_eq!(p.member_counts().lost, 1);
}

#[test]
fn the_old_scheduler_connection_is_not_heard_after_a_loss() {
    let mut p = ready();
    p.handle_closed(ms(30), 1, "reset");
    let acts = drain(&mut p);
    assert!(acts.iter().any(|a| matches!(a, Action::Lost(_))));
    // A late plan on the old connection: closed, not queued.
    p.handle_msg(ms(31), 1, plan_msg(10, 0, ms(40)));
    let acts = drain(&mut p);
    assert!(matches!(&acts[..], [Action::Close(1, _)]), "{acts:?}");
}

#[test]
fn plans_are_queued_only_when_they_pass_the_checks() {
    let mut p = ready();
    p.handle_connected(2, 40);
    p.handle_msg(ms(23), 1, plan_msg(11, 0, ms(30)));
    let acts = drain(&mut p);
    assert!(matches!(&acts[..], [Action::Queue { gpu: 1, plan }] if plan.id == PlanId(5)));
    // Another's GPU: the tasks fail at their frontend; the scheduler does not
    // hear of it (it would be a report on a GPU that is not ours).
    p.handle_msg(ms(23), 1, plan_msg(12, 0, ms(30)));
    let acts = drain(&mut p);
    assert_eq!(acts.len(), 1, "{acts:?}");
    match &acts[0] {
        Action::Send(40, Msg::Results { items }) => {
            assert_eq!(items[0].status, TaskStatus::Failed)
        }
        a => panic!("{a:?}"),
    }
    // A model not loaded, and an exec_at out of range: failed and reported.
    for m in [plan_msg(10, 1, ms(30)), plan_msg(10, 0, Time(i64::MAX))] {
        p.handle_msg(ms(23), 1, m);
        let acts = drain(&mut p);
        assert!(acts.iter().any(|a| matches!(
            a,
            Action::Send(
                1,
                Msg::PlanDone {
                    status: PlanStatus::Failed,
                    ..
                }
            )
        )));
    }
    // The driver found the GPU's queue full: refused the same way.
    let plan = PlanMsg {
        id: PlanId(9),
        model: ModelId(0),
        gpu: GpuId(10),
        exec_at: ms(30),
        span: ms(5) - ms(0),
        tasks: vec![],
    };
    p.handle_queue_full(ms(23), plan);
    let acts = drain(&mut p);
    assert!(matches!(
        &acts[..],
        [Action::Send(
            1,
            Msg::PlanDone {
                id: PlanId(9),
                status: PlanStatus::Failed,
                ..
            }
        )]
    ));
    assert_eq!(p.counts().plans_refused, 4);
    assert_eq!(p.counts().plans_received, 4);
}

#[test]
fn a_failed_load_is_reported_and_the_model_is_not_loaded() {
    let mut p = ready();
    p.handle_msg(ms(30), 1, Msg::LoadModel { model: model(1) });
    p.handle_loaded(ModelId(1), Err("no memory".into()));
    // The other GPU's answer comes after: ignored.
    p.handle_loaded(ModelId(1), Ok(None));
    let acts = drain(&mut p);
    let reports: Vec<_> = acts
        .iter()
        .filter(|a| matches!(a, Action::Send(1, Msg::ModelLoaded { .. })))
        .collect();
    assert_eq!(reports.len(), 1);
    assert!(
        matches!(reports[0], Action::Send(_, Msg::ModelLoaded { ok: false, error, .. }) if error == "no memory")
    );
    assert!(!p.has_loaded(ModelId(1)));
}

#[test]
fn a_frontend_that_speaks_is_closed() {
    let mut p = ready();
    p.handle_connected(2, 40);
    p.handle_msg(
        ms(30),
        40,
        Msg::Unregister {
            reason: String::new(),
        },
    );
    let acts = drain(&mut p);
    assert!(matches!(&acts[..], [Action::Close(40, _)]));
    assert_eq!(p.counts().unexpected, 1);
}

/// A frontend's connection that closes while the scheduler has it up is
/// dialled again ([`super::super::redial`]); one announced down is not.
#[test]
fn a_frontend_whose_connection_closes_is_dialled_again() {
    use crate::node::proto::redial::REDIAL_AFTER;
    let mut p = ready();
    let region = RegionInfo {
        addr: "fe:r".into(),
        region: 0,
        len: 1 << 20,
        rkey: 0,
        base: 0,
    };
    let up = Msg::FrontendUp {
        node: 2,
        ctrl_addr: "fe:c".into(),
        region,
    };
    p.handle_msg(ms(30), 1, up);
    assert!(matches!(
        &drain(&mut p)[..],
        [Action::Attach { node: 2, .. }]
    ));
    p.handle_connected(2, 40);
    p.handle_closed(ms(40), 40, "reset");
    assert_eq!(p.frontend(2), None);
    let at = ms(40) + REDIAL_AFTER;
    assert!(p.poll_timeout() <= at);
    // (The scheduler keeps answering pings.)
    pong(&mut p, at, at);
    p.handle_timeout(at);
    let acts = drain(&mut p);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Redial { node: 2, ctrl_addr } if ctrl_addr == "fe:c")),
        "{acts:?}"
    );
    assert!(p.wants_frontend(2));
    p.handle_frontend_dial_failed(at, 2);
    pong(&mut p, at + REDIAL_AFTER, at + REDIAL_AFTER);
    p.handle_timeout(at + REDIAL_AFTER);
    assert!(drain(&mut p)
        .iter()
        .any(|a| matches!(a, Action::Redial { node: 2, .. })));
    p.handle_connected(2, 41);
    assert_eq!(p.frontend(2), Some(41));
    assert!(!p.wants_frontend(2));
    // Down: its closed connection is not dialled.
    p.handle_msg(ms(2_000), 1, Msg::FrontendDown { node: 2 });
    p.handle_closed(ms(2_001), 41, "down");
    pong(&mut p, ms(2_600), ms(2_600));
    p.handle_timeout(ms(2_600));
    let acts = drain(&mut p);
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, Action::Redial { .. } | Action::Lost(_))),
        "{acts:?}"
    );
}

#[test]
fn the_queue_gives_plans_in_exec_at_order_when_due() {
    let mut q = PlanQueue::default();
    q.push(ms(5), "b");
    q.push(ms(3), "a");
    q.push(ms(5), "c");
    assert_eq!(q.next_at(), Some(ms(3)));
    assert_eq!(q.pop_due(ms(2)), None);
    assert_eq!(q.pop_due(ms(4)), Some("a"));
    assert_eq!(q.pop_due(ms(9)), Some("b"));
    assert_eq!(q.pop_due(ms(9)), Some("c"));
    assert!(q.is_empty());
}

#[test]
fn a_late_batch_leaves_out_only_what_it_must() {
    // l(b) = 1 ms * b + 5 ms.
    let p = LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap();
    // Four tasks, deadlines 9, 10, 12, 20 ms; l(4) = 9 ms.
    let d = [ms(9), ms(10), ms(12), ms(20)];
    assert_eq!(too_late_prefix(&d, ms(0), &p), 0, "on time");
    // Starting at 1 ms: 1 + 9 > 9, drop the first; 1 + l(3) = 9 <= 10: keep 3.
    assert_eq!(too_late_prefix(&d, ms(1), &p), 1);
    // Starting at 5 ms: 5 + 8 > 10, 5 + 7 <= 12: keep the last two.
    assert_eq!(too_late_prefix(&d, ms(5), &p), 2);
    assert_eq!(too_late_prefix(&d, ms(16), &p), 4, "none can make it");
    assert_eq!(too_late_prefix(&[], ms(0), &p), 0);
}

#[test]
fn a_plan_planned_slower_than_the_profile_is_judged_by_its_span() {
    // l(b) = b + 5 ms.
    let p = LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap();
    let dl = |v: &[i64]| v.iter().map(|&m| ms(m)).collect::<Vec<Time>>();
    // Four tasks, planned at 1.5x: l'(4) = 13.5 ms, l'(3) = 12 ms.
    let planned = planned_profile(&p, 4, Dur(13_500_000));
    assert_eq!(planned.latency(4), Dur(13_500_000));
    assert_eq!(planned.latency(3), Dur::from_ms(12));
    let d = dl(&[11, 12, 14, 20]);
    // The given profile runs all four from 0 (l(4) = 9 <= 11); at 1.5x the
    // earliest cannot make it (13.5 > 11), and without it l'(3) = 12 <= 12
    // keeps the other three.
    assert_eq!(too_late_prefix(&d, ms(0), &p), 0);
    assert_eq!(too_late_prefix(&d, ms(0), &planned), 1);
    // A span at or below l(b) is the given profile itself.
    assert!(matches!(
        planned_profile(&p, 4, ms(9) - ms(0)),
        Cow::Borrowed(_)
    ));
    assert!(matches!(planned_profile(&p, 4, Dur(1)), Cow::Borrowed(_)));
    assert!(matches!(
        planned_profile(&p, 0, Dur::ZERO),
        Cow::Borrowed(_)
    ));
    // An absurd span is bounded: at most ABSURD_RATIO times the profile.
    let wild = planned_profile(&p, 4, Dur(i64::MAX / 4));
    let cap = crate::node::proto::latency_scale::ABSURD_RATIO;
    assert_eq!(wild.latency(1), Dur((6e6 * cap) as i64));
}

/// A puller that starts late leaves out the tasks no start from then on
/// can serve, and gives the others until their own latest start.
#[test]
fn a_late_pull_skips_the_tasks_already_lost() {
    // l(b) = 1 ms * b + 5 ms.
    let p = LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap();
    let t = |seq: u64, dl: i64| PlanTask {
        id: crate::wire::task_id(1, seq),
        deadline: ms(dl),
        input: 0,
        cap: seq,
    };
    // Deadlines 20, 9, 10, 12 ms (unsorted); planned at 0, l(4) = 9 ms.
    let plan = PlanMsg {
        id: PlanId(3),
        model: ModelId(0),
        gpu: GpuId(0),
        exec_at: ms(0),
        span: ms(9) - ms(0),
        tasks: vec![t(1, 20), t(2, 9), t(3, 10), t(4, 12)],
    };
    // Before or at the planned start nothing is lost, and the pull may
    // take until the latest start of all four: 9 - l(4) = 0.
    assert_eq!(hopeless(&plan, Some(&p), ms(-3)), vec![false; 4]);
    assert_eq!(
        pull_budget(&plan, Some(&p), ms(-3), &[false; 4]),
        ms(3) - ms(0)
    );
    // From 5 ms only the two latest can make it (5 + l(2) = 12).
    let skip = hopeless(&plan, Some(&p), ms(5));
    assert_eq!(skip, vec![false, true, true, false]);
    // Their pull may take until 12 - l(2) = 5 ms: none left, so the floor.
    assert_eq!(pull_budget(&plan, Some(&p), ms(5), &skip), Dur::from_ms(1));
    // From 2 ms: the earliest is lost; the other three have until
    // 10 - l(3) = 2 ms, the floor again, and from 1 ms none is lost.
    assert_eq!(
        hopeless(&plan, Some(&p), ms(2)),
        vec![false, true, false, false]
    );
    assert_eq!(
        hopeless(&plan, Some(&p), ms(1)),
        vec![false, true, false, false]
    );
    assert_eq!(hopeless(&plan, Some(&p), ms(0)), vec![false; 4]);
    // Without a profile nothing is judged.
    assert_eq!(hopeless(&plan, None, ms(50)), vec![false; 4]);
}

/// An input whose read had not finished by the batch's start ends its
/// task as dropped (too late), one that could not be read as failed
/// (input missing); both count as missing in the scheduler's report.
#[test]
fn an_input_not_read_by_the_start_is_dropped_too_late_not_failed() {
    let t = |seq: u64| PlanTask {
        id: crate::wire::task_id(1, seq),
        deadline: Time(ms(50).0),
        input: 0,
        cap: seq,
    };
    let plan = PlanMsg {
        id: PlanId(2),
        model: ModelId(0),
        gpu: GpuId(0),
        exec_at: ms(0),
        span: ms(5) - ms(0),
        tasks: vec![t(1), t(2), t(3)],
    };
    let mut cut = cut_batch(&plan.tasks, &[true, false, false], ms(0), None);
    assert_eq!(cut.missing, vec![1, 2]);
    // Input 2's read timed out; input 1's slot was stale.
    cut.split_unread(|i| i == 2);
    assert_eq!(
        (cut.missing.clone(), cut.unread.clone()),
        (vec![1], vec![2])
    );
    let s = settle(&plan, &cut, ms(1), ms(6), Ok(vec![Some(vec![7])]));
    let all: Vec<&TaskResult> = s.results.iter().flat_map(|r| &r.1).collect();
    let status = |i: usize| {
        all.iter()
            .find(|r| r.id == plan.tasks[i].id)
            .unwrap()
            .status
    };
    assert_eq!(status(0), TaskStatus::Ok);
    assert_eq!(status(1), TaskStatus::InputMissing);
    assert_eq!(status(2), TaskStatus::Dropped(DropReason::TooLate));
    assert!(matches!(s.done, Msg::PlanDone { missing: 2, .. }));
}

#[test]
fn a_batch_ends_every_task_once() {
    let p = LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap();
    let t = |fe: u32, seq: u64, dl: i64| PlanTask {
        id: crate::wire::task_id(fe, seq),
        deadline: Time(ms(dl).0),
        input: 0,
        cap: seq,
    };
    let plan = PlanMsg {
        id: PlanId(1),
        model: ModelId(0),
        gpu: GpuId(3),
        exec_at: ms(0),
        span: ms(9) - ms(0),
        tasks: vec![t(1, 1, 20), t(2, 2, 9), t(1, 3, 12), t(2, 4, 30)],
    };
    // Task 3 (index 3) missing; starting at 3 ms, l(3) = 8 ms: the deadline 9
    // is missed, then l(2) = 7: 3 + 7 <= 12 keeps the rest.
    let cut = cut_batch(&plan.tasks, &[true, true, true, false], ms(3), Some(&p));
    assert_eq!(cut.too_late, vec![1]);
    assert_eq!(cut.run, vec![2, 0]);
    assert_eq!(cut.missing, vec![3]);
    let s = settle(
        &plan,
        &cut,
        ms(3),
        ms(10),
        Ok(vec![Some(vec![1]), Some(vec![2])]),
    );
    assert_eq!(s.status, PlanStatus::Ran);
    assert_eq!(s.ran, 2);
    let all: Vec<&TaskResult> = s.results.iter().flat_map(|r| &r.1).collect();
    assert_eq!(all.len(), 4);
    for (fe, items) in &s.results {
        assert!(items.iter().all(|r| task_owner(r.id) == *fe));
    }
    let by_id = |id| all.iter().find(|r| r.id == id).unwrap();
    assert_eq!(
        by_id(plan.tasks[1].id).status,
        TaskStatus::Dropped(DropReason::TooLate)
    );
    assert_eq!(by_id(plan.tasks[3].id).status, TaskStatus::InputMissing);
    assert_eq!(by_id(plan.tasks[2].id).output, vec![1]);
    assert_eq!(by_id(plan.tasks[0].id).batch_size, 2);
    assert!(matches!(
        s.done,
        Msg::PlanDone {
            missing: 1,
            status: PlanStatus::Ran,
            ..
        }
    ));
    // The wrong number of outputs fails the batch.
    let s = settle(&plan, &cut, ms(3), ms(10), Ok(vec![Some(vec![1])]));
    assert_eq!(s.status, PlanStatus::Failed);
    // A task that failed alone fails; the rest of the batch ran.
    let s = settle(&plan, &cut, ms(3), ms(10), Ok(vec![None, Some(vec![2])]));
    assert_eq!(s.status, PlanStatus::Ran);
    assert_eq!(s.ran, 1);
    let all: Vec<&TaskResult> = s.results.iter().flat_map(|r| &r.1).collect();
    let by_id = |id| all.iter().find(|r| r.id == id).unwrap();
    assert_eq!(by_id(plan.tasks[2].id).status, TaskStatus::Failed);
    assert_eq!(by_id(plan.tasks[0].id).status, TaskStatus::Ok);
    assert_eq!(by_id(plan.tasks[0].id).output, vec![2]);
    // Every task failed alone: the plan failed.
    let s = settle(&plan, &cut, ms(3), ms(10), Ok(vec![None, None]));
    assert_eq!(s.status, PlanStatus::Failed);
    // Every task too late: not run.
    let cut = cut_batch(&plan.tasks, &[true; 4], ms(40), Some(&p));
    let s = settle(&plan, &cut, ms(40), ms(50), Err(()));
    assert_eq!(s.status, PlanStatus::TooLate);
    assert!(matches!(s.done, Msg::PlanDone { finished, .. } if finished == ms(40)));
}
