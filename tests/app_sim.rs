//! The simulator serving applications: requests end exactly once, modules run only
//! on the GPU type and lanes they were planned on, fan-out counts drive the tasks.

use fermata::app::{Budgets, DeadlineRule, EdgeSpec, Graph, Step};
use fermata::core::{Dur, LatencyProfile, Policy, Time};
use fermata::sim::apps::{
    check_placements, simulate_app, AppSim, AppSimOptions, FanoutDist, Placement, Runtime,
    SubCluster,
};
use std::sync::Arc;

/// det (type a100, 1 machine) --fanout--> cls (type t4, 2 machines x 2 lanes).
fn det_cls(fanout: FanoutDist, rate: f64) -> AppSim {
    let graph = Arc::new(
        Graph::new(
            vec![Step::new("det", "ssd"), Step::new("cls", "resnet")],
            &[EdgeSpec::fanout("det", "cls")],
            &["det", "cls"],
        )
        .unwrap(),
    );
    let budgets = Budgets::new(
        &graph,
        vec![Dur::from_ms(30), Dur::from_ms(40)],
        Dur::from_ms(100),
    )
    .unwrap();
    let sc = |module, gpu_type, machines, lanes, alpha, beta| SubCluster {
        module,
        gpu_type,
        machines,
        lanes,
        profile: LatencyProfile::linear_ms(alpha, beta, 16).unwrap(),
        weight: 1.0,
        tc_batch: 4,
        tc_ratio: 1.0,
    };
    let mean = fermata::sim::apps::fanout_mean(&fanout);
    AppSim {
        graph,
        budgets,
        rule: DeadlineRule::SlackForwarding,
        rate_rps: rate,
        fanout: vec![Some(fanout)],
        gpu_types: vec!["a100".into(), "t4".into()],
        subclusters: vec![sc(0, 0, 1, 1, 0.5, 3.0), sc(1, 1, 2, 2, 1.0, 6.0)],
        module_rates: vec![rate, rate * mean],
    }
}

fn opts(runtime: Runtime) -> AppSimOptions {
    AppSimOptions {
        runtime,
        seed: 7,
        warmup: Dur::from_ms(500),
        duration: Dur::from_secs_f64(3.0),
        check: true,
        fanout_jump: None,
        slowdown: None,
    }
}

#[test]
fn every_runtime_serves_a_fanned_out_app_on_its_planned_types_and_lanes() {
    for runtime in [
        Runtime::Core(Policy::Deferred),
        Runtime::Nexus,
        Runtime::ThroughputCost,
    ] {
        let sim = det_cls(FanoutDist::Poisson(3.0), 100.0);
        let r = simulate_app(&sim, &opts(runtime));
        let name = runtime.name();
        // The run's own checks passed (it panics otherwise); what they saw:
        assert_eq!(r.ended, r.requests, "{name}");
        assert!(r.offered > 200, "{name}: {}", r.offered);
        assert_eq!(r.good + r.late + r.failed, r.offered, "{name}");
        assert!(r.good_fraction() > 0.9, "{name}: {}", r.good_fraction());
        assert!(r.tasks[1] > 2 * r.tasks[0], "{name}: {:?}", r.tasks);
        for p in &r.placements {
            assert_eq!(p.gpu_type, p.module, "{name}: {p:?}");
        }
        assert!(check_placements(&sim, &r.placements).is_ok());
    }
}

#[test]
fn lanes_run_batches_at_once_on_one_machine_but_never_two_on_one_lane() {
    let sim = det_cls(FanoutDist::Const(6), 150.0);
    let r = simulate_app(&sim, &opts(Runtime::Core(Policy::Deferred)));
    let cls: Vec<&Placement> = r.placements.iter().filter(|p| p.module == 1).collect();
    // Both lanes of a machine were used, and at some moment both at once.
    let overlap = cls.iter().any(|a| {
        cls.iter().any(|b| {
            a.machine == b.machine && a.lane != b.lane && a.start < b.finish && b.start < a.finish
        })
    });
    assert!(overlap, "no two lanes of one machine ever overlapped");
    assert!(check_placements(&sim, &r.placements).is_ok());
}

#[test]
fn the_placement_check_catches_a_wrong_type_module_lane_or_overlap() {
    let sim = det_cls(FanoutDist::Const(1), 10.0);
    let ok = Placement {
        module: 1,
        subcluster: 1,
        gpu_type: 1,
        machine: 1,
        lane: 1,
        start: Time(0),
        finish: Time(10),
    };
    assert!(check_placements(&sim, &[ok]).is_ok());
    let e = check_placements(&sim, &[Placement { gpu_type: 0, ..ok }]).unwrap_err();
    assert!(
        e.contains("GPU type a100") && e.contains("planned on t4"),
        "{e}"
    );
    let e = check_placements(&sim, &[Placement { module: 0, ..ok }]).unwrap_err();
    assert!(
        e.contains("'det'") && e.contains("planned for 'cls'"),
        "{e}"
    );
    let e = check_placements(&sim, &[Placement { lane: 2, ..ok }]).unwrap_err();
    assert!(e.contains("outside"), "{e}");
    let later = Placement {
        start: Time(5),
        finish: Time(15),
        ..ok
    };
    let e = check_placements(&sim, &[ok, later]).unwrap_err();
    assert!(e.contains("two batches at once"), "{e}");
    // The other lane of the same machine may overlap.
    assert!(check_placements(&sim, &[ok, Placement { lane: 0, ..later }]).is_ok());
}

#[test]
fn fanout_zero_runs_only_the_first_module() {
    let sim = det_cls(FanoutDist::Const(0), 50.0);
    let r = simulate_app(&sim, &opts(Runtime::Core(Policy::Deferred)));
    assert_eq!(r.tasks[1], 0);
    assert!(r.tasks[0] > 0);
    assert_eq!(r.good, r.offered);
}

#[test]
fn overload_ends_every_request_once_with_late_or_expired_ones() {
    // Far more items than the classifiers serve: tasks expire, requests end late.
    let sim = det_cls(FanoutDist::Trace(vec![20, 0, 40]), 200.0);
    for runtime in [Runtime::Core(Policy::Deferred), Runtime::ThroughputCost] {
        let r = simulate_app(&sim, &opts(runtime));
        assert_eq!(r.ended, r.requests);
        assert!(r.late > 0, "{}: {r:?}", runtime.name());
        assert!(r.good_fraction() < 0.9);
    }
}

#[test]
fn a_fanout_jump_multiplies_the_tasks_after_it() {
    let sim = det_cls(FanoutDist::Const(1), 50.0);
    let mut o = opts(Runtime::Core(Policy::Deferred));
    let base = simulate_app(&sim, &o);
    o.fanout_jump = Some((Time::ZERO, 0, 3.0));
    let jumped = simulate_app(&sim, &o);
    let ratio = jumped.tasks[1] as f64 / base.tasks[1] as f64;
    assert!((2.5..3.5).contains(&ratio), "{ratio}");
}

/// `o` simulated with the plan fixed and with re-planning: the jump's epoch,
/// both results, and each one's bad fraction per epoch.
fn fixed_and_replanned(
    o: &fermata::bench::adapt::Options,
) -> (
    usize,
    fermata::sim::apps::AppSimResult,
    fermata::sim::apps::AppSimResult,
    Vec<f64>,
    Vec<f64>,
) {
    use fermata::bench::adapt::simulate;
    let jump_epoch = (o.jump_at_s / o.epoch_s).floor() as usize;
    let fixed = simulate(o, false).unwrap();
    let replan = simulate(o, true).unwrap();
    let bad = |r: &fermata::sim::apps::AppSimResult| -> Vec<f64> {
        r.epochs.iter().map(|e| e.bad_fraction()).collect()
    };
    let (bf, br) = (bad(&fixed), bad(&replan));
    (jump_epoch, fixed, replan, bf, br)
}

#[test]
fn replanning_on_a_tripled_fanout_recovers_within_two_epochs_and_a_fixed_plan_does_not() {
    use fermata::bench::adapt::{recovered, Options, BAD_LIMIT};
    let o = Options {
        check: true,
        ..Options::default()
    };
    let (jump_epoch, fixed, replan, bf, br) = fixed_and_replanned(&o);
    assert_eq!(bf.len(), o.epochs);
    assert_eq!(br.len(), o.epochs);
    // Before the jump both serve the plan's load.
    for e in 0..jump_epoch {
        assert!(bf[e] < BAD_LIMIT && br[e] < BAD_LIMIT, "{bf:?} {br:?}");
        assert!(
            !replan.epochs[e].replanned,
            "epoch {e} re-planned before the jump"
        );
    }
    // With re-planning: a re-plan at the end of the jump's epoch or the next,
    // more classifier machines, and under 1% bad to the end within two epochs.
    let first = replan
        .epochs
        .iter()
        .position(|e| e.replanned)
        .expect("a re-plan");
    assert!(first == jump_epoch || first == jump_epoch + 1, "{first}");
    let m0 = &replan.epochs[0].machines;
    let m1 = &replan.epochs.last().unwrap().machines;
    assert!(m1[1] > m0[1], "classify machines {m0:?} -> {m1:?}");
    let r = recovered(&br, jump_epoch);
    assert!(matches!(r, Some(k) if k <= 2), "{r:?}: {br:?}");
    // With the plan fixed the classifiers stay overloaded to the end.
    assert_eq!(recovered(&bf, jump_epoch), None, "{bf:?}");
    assert!(fixed.epochs.iter().all(|e| !e.replanned));
}

#[test]
fn replanning_on_a_slower_module_recovers_within_two_epochs_and_a_fixed_plan_does_not() {
    use fermata::bench::adapt::{recovered, Options, BAD_LIMIT};
    // classify's batches take 1.5x its profile from 7 s on; the fan-out stays.
    let o = Options {
        jump: 1.0,
        slowdown: 1.5,
        check: true,
        ..Options::default()
    };
    let (jump_epoch, fixed, replan, bf, br) = fixed_and_replanned(&o);
    assert_eq!((bf.len(), br.len()), (o.epochs, o.epochs));
    for e in 0..jump_epoch {
        assert!(bf[e] < BAD_LIMIT && br[e] < BAD_LIMIT, "{bf:?} {br:?}");
        assert!(!replan.epochs[e].replanned, "epoch {e} re-planned early");
        // Every batch ran at its profile so far.
        let k = replan.epochs[e].measured_latency_ratio[1].expect("measured");
        assert!((k - 1.0).abs() < 1e-6, "epoch {e}: ratio {k}");
    }
    // A re-plan at the end of the slowdown's epoch or the next, triggered by
    // classify's ratio alone (the fan-out did not move); under the new plan
    // (the window restarts with it) classify measures 1.5 and detect 1, and
    // nothing re-plans again.
    let first = replan
        .epochs
        .iter()
        .position(|e| e.replanned)
        .expect("a re-plan");
    assert!(first == jump_epoch || first == jump_epoch + 1, "{first}");
    for e in &replan.epochs[first + 1..] {
        let k = e.measured_latency_ratio[1].expect("measured");
        assert!((k - 1.5).abs() < 1e-6, "ratio {k}");
        let k = e.measured_latency_ratio[0].expect("measured");
        assert!((k - 1.0).abs() < 1e-6, "ratio {k}");
        assert!(!e.replanned);
    }
    for e in &replan.epochs {
        let f = e.measured_fanout[0].expect("measured");
        assert!((f - 2.0).abs() < 0.2, "fan-out {f}");
    }
    // More classifier machines, under 1% bad to the end within two epochs.
    let m0 = &replan.epochs[0].machines;
    let m1 = &replan.epochs.last().unwrap().machines;
    assert!(m1[1] > m0[1], "classify machines {m0:?} -> {m1:?}");
    assert_eq!(m1[0], m0[0], "detect machines {m0:?} -> {m1:?}");
    let r = recovered(&br, jump_epoch);
    assert!(matches!(r, Some(k) if k <= 2), "{r:?}: {br:?}");
    // With the plan fixed the dispatchers keep planning with the old profile
    // and classify's batches keep ending late.
    assert_eq!(recovered(&bf, jump_epoch), None, "{bf:?}");
    assert!(fixed.epochs.iter().all(|e| !e.replanned));
}

#[test]
fn epochs_without_a_detector_change_nothing_and_a_replanner_error_ends_the_run() {
    use fermata::app::{DriftConfig, DriftDetector};
    use fermata::sim::apps::{simulate_app_adaptive, Adapt};
    let sim = det_cls(FanoutDist::Poisson(3.0), 100.0);
    let o = opts(Runtime::Core(Policy::Deferred));
    let plain = simulate_app(&sim, &o);
    let mut never = |_: &fermata::app::Replan| -> Result<_, String> { panic!("no detector") };
    let mut a = Adapt {
        epoch: Dur::from_ms(500),
        detector: None,
        replan: &mut never,
    };
    let r = simulate_app_adaptive(&sim, &o, &mut a).unwrap();
    assert_eq!(
        (r.good, r.late, r.failed, &r.tasks, &r.expired),
        (
            plain.good,
            plain.late,
            plain.failed,
            &plain.tasks,
            &plain.expired
        )
    );
    // Epochs cover the run; every request that arrived is counted in one.
    assert_eq!(r.epochs.len(), 7);
    assert_eq!(r.epochs.iter().map(|e| e.offered).sum::<u64>(), r.requests);
    assert!(r
        .epochs
        .iter()
        .all(|e| e.machines == vec![1, 2] && !e.replanned));
    // A tripled fan-out drifts; the re-planner's error ends the run with it.
    let mut o3 = o.clone();
    o3.fanout_jump = Some((Time::ZERO, 0, 3.0));
    let det = DriftDetector::new(DriftConfig::default(), vec![Some(3.0)], 2).unwrap();
    let mut fail = |_: &fermata::app::Replan| -> Result<_, String> { Err("no plan".into()) };
    let mut a = Adapt {
        epoch: Dur::from_ms(500),
        detector: Some(det.clone()),
        replan: &mut fail,
    };
    assert_eq!(
        simulate_app_adaptive(&sim, &o3, &mut a).unwrap_err(),
        "no plan"
    );
    // Re-planning needs the production dispatcher.
    let mut a = Adapt {
        epoch: Dur::from_ms(500),
        detector: Some(det),
        replan: &mut fail,
    };
    assert!(simulate_app_adaptive(&sim, &opts(Runtime::Nexus), &mut a)
        .unwrap_err()
        .contains("production dispatcher"));
}

/// a → b under a 100 ms SLO, a budgeted 10 ms (one machine whose batch of one
/// takes 9 ms, so a task that finds it busy misses), b 90 ms (4 ms alone).
fn tight_first_module(rule: DeadlineRule) -> AppSim {
    let graph = Arc::new(
        Graph::new(
            vec![Step::new("a", "m1"), Step::new("b", "m2")],
            &[EdgeSpec::whole("a", "b")],
            &["b"],
        )
        .unwrap(),
    );
    let sc = |module, alpha, beta| SubCluster {
        module,
        gpu_type: 0,
        machines: 1,
        lanes: 1,
        profile: LatencyProfile::linear_ms(alpha, beta, 16).unwrap(),
        weight: 1.0,
        tc_batch: 4,
        tc_ratio: 1.0,
    };
    let subclusters = vec![sc(0, 1.0, 8.0), sc(1, 1.0, 3.0)];
    let least = subclusters.iter().map(|s| s.profile.latency(1)).collect();
    let budgets = Budgets::new(
        &graph,
        vec![Dur::from_ms(10), Dur::from_ms(90)],
        Dur::from_ms(100),
    )
    .unwrap()
    .with_least(&graph, least)
    .unwrap();
    AppSim {
        graph,
        budgets,
        rule,
        rate_rps: 60.0,
        fanout: vec![None],
        gpu_types: vec!["a100".into()],
        subclusters,
        module_rates: vec![60.0, 60.0],
    }
}

#[test]
fn a_last_deadline_keeps_the_requests_a_module_deadline_would_drop() {
    let o = opts(Runtime::Core(Policy::Deferred));
    let slack = simulate_app(&tight_first_module(DeadlineRule::SlackForwarding), &o);
    let latest = simulate_app(&tight_first_module(DeadlineRule::LatestUseful), &o);
    for r in [&slack, &latest] {
        assert_eq!(r.ended, r.requests);
        assert_eq!(r.offered, slack.offered, "the same arrivals");
    }
    // Under slack forwarding a's misses end their requests; with the last
    // deadline they are served late at a, and b still ends them in time.
    assert!(slack.expired[0] > 0, "{slack:?}");
    assert!(slack.good_fraction() < 0.95, "{}", slack.good_fraction());
    assert!(latest.expired[0] > 0, "a still misses its planned deadline");
    assert_eq!(latest.late, 0, "{latest:?}");
    assert_eq!(latest.good, latest.offered);
}

#[test]
fn under_overload_last_deadlines_still_end_every_request_once() {
    let mut sim = tight_first_module(DeadlineRule::LatestUseful);
    sim.rate_rps = 2000.0;
    sim.module_rates = vec![2000.0, 2000.0];
    for runtime in [Runtime::Core(Policy::Deferred), Runtime::Nexus] {
        let r = simulate_app(&sim, &opts(runtime));
        assert_eq!(r.ended, r.requests);
        assert!(r.late > 0 && r.good_fraction() < 0.9, "{}", runtime.name());
    }
}
