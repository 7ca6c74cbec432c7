//! Property tests over random workloads: the core's invariants hold after every
//! event, every request ends exactly once, no GPU is booked twice, and with exact
//! profiles and no jitter, deferred scheduling never finishes a request late.

use fermata::core::{
    Dispatcher, DispatcherConfig, Dur, Gather, GpuId, ModelId, NetBudget, Output, Policy, Task,
    TaskId, Time,
};
use fermata::sim::{simulate, RunOptions};
use fermata::workload::{Arrival, Workload};
use proptest::prelude::*;

fn workload_toml(
    gpus: u32,
    models: &[(f64, f64, f64)],
    arrival: &str,
    net: (f64, f64, f64),
    gather: &str,
) -> String {
    let mut s = format!(
        "name = \"prop\"\ngpus = {gpus}\narrival = \"{arrival}\"\npopularity = \"zipf:0.9\"\n\
         warmup_s = 0.2\nduration_s = 1.0\ngather = \"{gather}\"\nfrontends = 2\n\
         [network]\nctrl_us = {}\ndata_us = {}\nresp_us = {}\n",
        net.0, net.1, net.2
    );
    for (i, (a, b, slo)) in models.iter().enumerate() {
        s += &format!(
            "[[models]]\nname = \"m{i}\"\nalpha_ms = {a}\nbeta_ms = {b}\nslo_ms = {slo}\n"
        );
    }
    s
}

fn arb_models() -> impl Strategy<Value = Vec<(f64, f64, f64)>> {
    prop::collection::vec(
        (0.1f64..3.0, 0.5f64..12.0, 1.5f64..6.0).prop_map(|(a, b, k)| (a, b, (a + b) * k + 1.0)),
        1..4,
    )
}

fn policies() -> Vec<Policy> {
    Policy::all_baselines()
}

/// Per GPU, the plans the simulator started never overlap.
fn assert_no_double_booking(w: &Workload, r: &fermata::sim::RunResult) {
    let mut per_gpu: Vec<Vec<(Time, Time)>> = vec![Vec::new(); w.gpus as usize];
    for p in r.plans.iter().filter(|p| !p.preempted) {
        let l = w.models[p.model.idx()]
            .spec
            .profile
            .latency(p.tasks.len() as u32);
        per_gpu[p.gpu.idx()].push((p.exec_at, p.exec_at + l));
    }
    for (g, v) in per_gpu.iter_mut().enumerate() {
        v.sort();
        for pair in v.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "GPU {g} runs two batches at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn simulated_runs_keep_the_invariants(
        gpus in 1u32..6,
        models in arb_models(),
        load in 0.2f64..2.5,
        arrival in prop::sample::select(vec!["constant", "poisson", "gamma:0.3"]),
        gather in prop::sample::select(vec!["lazy", "early", "adaptive"]),
        net in (0.0f64..300.0, 0.0f64..30.0, 0.0f64..300.0),
        policy_idx in 0usize..6,
        seed in 0u64..1000,
    ) {
        let text = workload_toml(gpus, &models, arrival, net, gather);
        let w = match Workload::from_toml(&text, None) {
            Ok(w) => w,
            // SLO below l(1) + network: rejected, which is its own test.
            Err(_) => return Ok(()),
        };
        let policy = policies()[policy_idx];
        let mut o = RunOptions::from_workload(&w);
        o.policy = policy;
        o.seed = seed;
        o.rate_rps = load * fermata::bench::throughput_upper_bound(&w);
        o.check = true;
        o.record_plans = true;
        // simulate() asserts that every request ends exactly once and the core checks
        // its counters after every event.
        let r = simulate(&w, &o);
        assert_no_double_booking(&w, &r);
        for m in &r.models {
            prop_assert_eq!(m.offered, m.good + m.late + m.dropped);
        }
        if matches!(policy, Policy::Deferred | Policy::Symphony) {
            for m in &r.models {
                prop_assert_eq!(m.late, 0, "deferred finished a request late: {:?}", m.name);
            }
        }
    }
}

/// Random event sequences straight into the dispatcher, with the deep consistency
/// check after every event and an independent record of GPU bookings.
#[test]
fn dispatcher_random_events_deep_check() {
    let mut x: u64 = 0x1234_5678;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for case in 0..40 {
        let policy = policies()[case % 5];
        let gpus = 1 + rnd(5) as u32;
        let mut cfg = DispatcherConfig::new(policy, gpus);
        cfg.check_invariants = true;
        cfg.gather = [
            Gather::Lazy,
            Gather::EarlyDrop { window: None },
            Gather::Adaptive,
        ][case % 3];
        cfg.net = NetBudget {
            ctrl: Dur::from_us(rnd(200) as i64),
            data_fixed: Dur::from_us(rnd(500) as i64),
            data_per_req: Dur::from_us(rnd(20) as i64),
            resp: Dur::from_us(rnd(200) as i64),
            slack: Dur::from_us(rnd(300) as i64),
            hold_fixed: Dur::from_us(rnd(500) as i64),
            hold_per_req: Dur::from_us(rnd(40) as i64),
        };
        let nm = 1 + rnd(3) as usize;
        let specs: Vec<_> = (0..nm)
            .map(|i| {
                let a = 0.2 + rnd(20) as f64 / 10.0;
                let b = 1.0 + rnd(100) as f64 / 10.0;
                fermata::core::ModelSpec {
                    name: format!("m{i}"),
                    profile: fermata::core::LatencyProfile::linear_ms(a, b, 32).unwrap(),
                    slo: Dur::from_ms_f64((a + b) * (2.0 + rnd(4) as f64) + 1.0),
                }
            })
            .collect();
        let mut d = Dispatcher::new(cfg, specs.clone());
        let mut now = Time::ZERO;
        let mut last = Time::ZERO;
        let mut busy_until = vec![Time::EPOCH_MIN; gpus as usize];
        let mut ended = 0u64;
        let n = 3000;
        for id in 0..n {
            now += Dur::from_us(rnd(900) as i64);
            while let Some(t) = d.next_timeout() {
                if t > now {
                    break;
                }
                last = t.max(last);
                d.handle_timeout(last);
                drain(&mut d, &specs, &mut busy_until, &mut ended);
                d.check_deep();
            }
            let m = rnd(nm as u64) as usize;
            let task = Task {
                id: TaskId(id),
                arrival: now,
                deadline: now + specs[m].slo,
                tag: 0,
                cap: 0,
            };
            last = now;
            d.handle_request(now, ModelId(m as u32), task);
            drain(&mut d, &specs, &mut busy_until, &mut ended);
            d.check_deep();
        }
        while let Some(t) = d.next_timeout() {
            d.handle_timeout(t.max(now));
            now = now.max(t);
            drain(&mut d, &specs, &mut busy_until, &mut ended);
            d.check_deep();
        }
        let c = d.counters();
        assert_eq!(c.received, n);
        assert_eq!(c.queued, 0, "everything left the queues");
        assert_eq!(c.dispatched + c.dropped, n);
        let _ = GpuId(0);
    }
}

fn drain(
    d: &mut Dispatcher,
    specs: &[fermata::core::ModelSpec],
    busy_until: &mut [Time],
    ended: &mut u64,
) {
    while let Some(o) = d.poll_output() {
        match o {
            Output::Dispatch(p) => {
                let g = p.gpu.idx();
                assert!(
                    p.exec_at >= busy_until[g],
                    "GPU {g} booked twice: {:?} < {:?}",
                    p.exec_at,
                    busy_until[g]
                );
                let l = specs[p.model.idx()].profile.latency(p.tasks.len() as u32);
                assert_eq!(p.finish_at, p.exec_at + l);
                busy_until[g] = p.finish_at;
                *ended += p.tasks.len() as u64;
            }
            Output::Drop { .. } => *ended += 1,
            Output::Preempt { gpu, .. } => {
                // The GPU is free again from now; its batch went back to the queue.
                busy_until[gpu.idx()] = Time::EPOCH_MIN;
            }
        }
    }
}

#[test]
fn arrival_processes_parse() {
    assert_eq!("gamma:0.5".parse::<Arrival>(), Ok(Arrival::Gamma(0.5)));
    assert!("gamma:0".parse::<Arrival>().is_err());
}
