//! The Symphony paper's Section 3.3 example (Figures 4 and 5), replayed on the
//! production `Dispatcher` with a hand-written event loop.
//!
//! Setup (1 time unit = 1 ms): 3 GPUs, one model with l(b) = b + 5, SLO 12, request
//! R_i (task id i - 1) arriving at t = 0.75 * (i - 1), zero network delay, deferred
//! scheduling with lazy batch gathering. The emulated GPUs take exactly l(b), so the
//! dispatcher's predicted free times are exact and no GPU reports are needed.

use fermata::core::{
    Dispatcher, DispatcherConfig, Dur, Gather, GpuId, LatencyProfile, ModelId, ModelSpec, Output,
    Plan, Policy, Task, TaskId, Time,
};

const GPUS: u32 = 3;
const SLO_MS: i64 = 12;
/// Arrival gap: 0.75 ms.
const GAP: Dur = Dur(750_000);

fn spec() -> ModelSpec {
    ModelSpec {
        name: "paper".into(),
        profile: LatencyProfile::linear_ms(1.0, 5.0, 16).expect("valid profile"),
        slo: Dur::from_ms(SLO_MS),
    }
}

fn dispatcher(policy: Policy) -> Dispatcher {
    let mut cfg = DispatcherConfig::new(policy, GPUS);
    cfg.gather = Gather::Lazy;
    cfg.check_invariants = true;
    Dispatcher::new(cfg, vec![spec()])
}

/// R_i for i in 1..=n, without the skipped ones; task id i - 1.
fn arrivals(n: u64, skip: &[u64]) -> Vec<Task> {
    (1..=n)
        .filter(|i| !skip.contains(i))
        .map(|i| {
            let arrival = Time::ZERO + GAP * (i as i64 - 1);
            Task {
                id: TaskId(i - 1),
                arrival,
                deadline: arrival + Dur::from_ms(SLO_MS),
                tag: 0,
                cap: 0,
            }
        })
        .collect()
}

struct Trace {
    plans: Vec<Plan>,
    dropped: Vec<(Time, TaskId)>,
}

/// Feeds the requests at their arrival times; runs the timers when they come before
/// the next arrival. On a tie the request goes first: as in the paper's narrative, a
/// request that arrives the moment a GPU becomes free joins the batch that GPU takes
/// (Figure 5a: R20 arrives at 14.25 as GPU 2 finishes, and it runs a batch of 4).
fn drive(d: &mut Dispatcher, tasks: &[Task]) -> Trace {
    drive_from(d, tasks, [Time::EPOCH_MIN; GPUS as usize])
}

/// `drive` on a dispatcher whose GPUs are already booked until `free`.
fn drive_from(d: &mut Dispatcher, tasks: &[Task], free: [Time; GPUS as usize]) -> Trace {
    let received0 = d.counters().received;
    let mut plans = Vec::new();
    let mut dropped = Vec::new();
    let mut next = 0;
    let mut now = Time::ZERO;
    for _ in 0..100_000 {
        let ta = tasks.get(next).map_or(Time::NEVER, |t| t.arrival);
        let tt = d.next_timeout().unwrap_or(Time::NEVER);
        if ta == Time::NEVER && tt == Time::NEVER {
            break;
        }
        if tt < ta {
            now = now.max(tt);
            d.handle_timeout(now);
        } else {
            now = ta;
            d.handle_request(now, ModelId(0), tasks[next]);
            next += 1;
        }
        d.check_deep();
        while let Some(out) = d.poll_output() {
            match out {
                Output::Dispatch(p) => plans.push(p),
                Output::Drop { task, .. } => dropped.push((now, task.id)),
                Output::Preempt { .. } => panic!("no preemption under {:?}", d.config().policy),
            }
        }
    }
    assert_eq!(next, tasks.len(), "event loop did not finish");
    assert_eq!(d.next_timeout(), None, "work left at the end");
    let c = d.counters();
    assert_eq!(c.received - received0, tasks.len() as u64);
    assert_eq!(c.queued, 0);
    assert_eq!(c.dispatched + c.dropped, c.received);
    check_plans(&plans, free);
    Trace { plans, dropped }
}

/// Sanity of any trace: no GPU runs two batches at once, every batch meets its
/// deadline (the GPUs take exactly l(b)), finish_at = exec_at + l(b).
fn check_plans(plans: &[Plan], mut free: [Time; GPUS as usize]) {
    let prof = spec().profile;
    for p in plans {
        let b = p.tasks.len() as u32;
        assert!(b >= 1);
        assert_eq!(p.finish_at, p.exec_at + prof.latency(b));
        let g = p.gpu.idx();
        assert!(
            p.exec_at >= free[g],
            "GPU {g} double-booked: {p:?} before {:?}",
            free[g]
        );
        free[g] = p.finish_at;
        for t in &p.tasks {
            assert!(p.finish_at <= t.deadline, "late task in {p:?}");
            assert!(p.exec_at >= t.arrival);
        }
    }
}

fn ms(x: f64) -> Time {
    Time::ZERO + Dur::from_ms_f64(x)
}

fn ids(p: &Plan) -> Vec<u64> {
    p.tasks.iter().map(|t| t.id.0).collect()
}

fn assert_plan(p: &Plan, gpu: u32, exec_ms: f64, tasks: std::ops::RangeInclusive<u64>) {
    let want: Vec<u64> = tasks.collect();
    assert_eq!(p.gpu, GpuId(gpu), "gpu of {p:?}");
    assert!(
        (p.exec_at - ms(exec_ms)).0.abs() <= 1_000,
        "exec_at of {p:?}: want {exec_ms} ms"
    );
    assert_eq!(ids(p), want, "tasks of {p:?}");
}

fn show(plans: &[Plan]) -> String {
    plans
        .iter()
        .map(|p| format!("gpu {} @ {} {:?}\n", p.gpu, p.exec_at, ids(p)))
        .collect()
}

// Derivation of Figure 4 with Algorithm 1 (lazy gathering, times in ms, d = head's
// deadline; bs = largest b <= |Q| with now + l(b) <= d; exec = max(now, d - l(bs+1));
// latest = d - l(bs); the model timer fires at exec and takes the lowest-id GPU with
// free <= exec):
//
// t=0     R1 (d=12):  bs 1, exec max(0, 12-l(2)=5)=5, latest 6       -> timer 5
// t=0.75  R2:         bs 2, exec max(0.75, 12-l(3)=4)=4, latest 5    -> timer 4
// t=1.5   R3:         bs 3, exec max(1.5, 12-l(4)=3)=3, latest 4     -> timer 3
// t=2.25  R4:         bs min(4, floor(12-2.25-5)=4)=4,
//                     exec max(2.25, 12-l(5)=2)=2.25, latest 12-l(4)=3
//                     -> exec <= now: GPU 0 (free) runs A = R1..R4 at 2.25, free 11.25
//                     (the paper: frontrun 2, latest 3, R4 arrives at 2.25).
// t=3     R5 (d=15):  bs 1, exec max(3, 15-7=8)=8               -> timer 8
// t=3.75  R6:         bs 2, exec max(3.75, 15-8=7)=7            -> timer 7
// t=4.5   R7:         bs 3, exec max(4.5, 15-9=6)=6             -> timer 6
// t=5.25  R8:         bs min(4, floor(15-5.25-5)=4)=4, exec max(5.25, 15-10=5)=5.25
//                     -> GPU 0 busy until 11.25, GPU 1 free: B = R5..R8 at 5.25 on
//                     GPU 1, free 14.25.
// t=8.25  R12:        likewise C = R9..R12 at 8.25 on GPU 2 (GPUs 0, 1 busy), free 17.25.
// t=11.25 R16 (R13's d=21): bs min(4, floor(21-11.25-5)=4)=4, exec max(11.25, 21-10=11)
//                     = 11.25; GPU 0 is free at exactly 11.25 -> D = R13..R16 on GPU 0.
//                     (Algorithm 1 writes G.free < c.exec and c.exec < G.free < latest;
//                     read literally, this tie would match neither the model timer nor
//                     the GPU timer. The dispatcher uses free <= exec, which is what
//                     Figure 4's back-to-back batches need.)
//
// In general R_{4k+1}'s deadline is 3k + 12 and R_{4k+4} arrives at 3k + 2.25 with
// 9.75 ms to go: bs = 4 (l(4) = 9 <= 9.75 < l(5) = 10) and the frontrun moment
// 3k + 12 - l(5) = 3k + 2 has passed, so batch k = R_{4k+1}..R_{4k+4} (task ids
// 4k..4k+3) starts at 2.25 + 3k. GPU k mod 3 became free at 2.25 + 3(k-3) + l(4) =
// 2.25 + 3k exactly, and the two other GPUs are still busy, so it runs on GPU k mod 3:
// a staggered pattern with period 9 = l(4) and steady batch 4, which is the staggered
// optimum (1 + 1/N) l(b) <= SLO -> l(b) <= 9 -> b = 4, and 3 * 4 / 9 = 1/0.75 keeps up
// with the arrivals exactly. No timer ever fires before the next arrival (the timers
// sit at 3k+8, 3k+7, 3k+6 while R_{4k+6..4k+8} arrive at 3k+3.75..3k+5.25).
#[test]
fn figure4_staggered_trace() {
    let mut d = dispatcher(Policy::Symphony);
    let tr = drive(&mut d, &arrivals(80, &[]));
    let plans = &tr.plans;
    assert!(tr.dropped.is_empty(), "drops: {:?}", tr.dropped);
    assert_eq!(plans.len(), 20, "{}", show(plans));

    // The paper's first batch.
    let a = &plans[0];
    assert_plan(a, 0, 2.25, 0..=3);
    assert_eq!(a.finish_at, ms(11.25));
    // Spelled out up to ~40 ms.
    let expect: [(u32, f64, u64); 13] = [
        (0, 2.25, 0),
        (1, 5.25, 4),
        (2, 8.25, 8),
        (0, 11.25, 12),
        (1, 14.25, 16),
        (2, 17.25, 20),
        (0, 20.25, 24),
        (1, 23.25, 28),
        (2, 26.25, 32),
        (0, 29.25, 36),
        (1, 32.25, 40),
        (2, 35.25, 44),
        (0, 38.25, 48),
    ];
    for (p, &(g, t, first)) in plans.iter().zip(&expect) {
        assert_plan(p, g, t, first..=first + 3);
    }
    // And the rule holds for the whole run.
    for (k, p) in plans.iter().enumerate() {
        let k64 = k as u64;
        assert_plan(
            p,
            k as u32 % 3,
            2.25 + 3.0 * k as f64,
            4 * k64..=4 * k64 + 3,
        );
    }
    // Each GPU starts its next batch exactly when it becomes free (no idle gap after
    // the start), i.e. the pattern is kept.
    for w in plans.windows(4) {
        assert_eq!(w[3].gpu, w[0].gpu);
        assert_eq!(w[3].exec_at, w[0].finish_at);
    }
}

// Figure 5b: R13, R14, R15 are skipped. A, B, C as above (GPU 0 free 11.25, GPU 1
// 14.25, GPU 2 17.25). Then:
// t=11.25 R16 (d=23.25): bs 1, exec max(11.25, 23.25-7=16.25)      -> timer 16.25
// t=12    R17:  bs 2, exec max(12, 23.25-8=15.25)=15.25             -> timer 15.25
// t=12.75 R18:  bs 3, exec max(12.75, 23.25-9=14.25)=14.25          -> timer 14.25
// t=13.5  R19:  bs min(4, floor(23.25-13.5-5)=4)=4, exec max(13.5, 23.25-10=13.25)
//               = 13.5 -> GPU 0 (idle since 11.25) runs R16..R19 at 13.5, free 22.5.
// t=16.5  R23 (R20's d=26.25): bs 4, exec max(16.5, 16.25)=16.5 -> GPU 1 (free 14.25).
// t=19.5  R27: bs 4 at 19.5 -> GPU 2 (free 17.25).
// t=22.5  R31 (R28's d=32.25): bs 4 at max(22.5, 22.25)=22.5 -> GPU 0, free at 22.5.
// So batch j >= 0 after the gap is R_{16+4j}..R_{19+4j} (ids 15+4j..18+4j) at
// 13.5 + 3j on GPU j mod 3: the GPUs idle briefly (GPU 0 for 2.25, GPU 1 for 2.25,
// GPU 2 for 2.25) and the staggered pattern with batch 4 is back at once, shifted by
// the three missing requests. R80 is left alone at the end: bs 1, exec
// max(59.25, 71.25-7=64.25) = 64.25, on the lowest-id free GPU: GPU 1 (free 61.5).
#[test]
fn figure5_skip_three_deferred_recovers_eager_degrades() {
    let skip = [13, 14, 15];
    let tasks = arrivals(80, &skip);

    let mut d = dispatcher(Policy::Symphony);
    let def = drive(&mut d, &tasks);
    let plans = &def.plans;
    assert!(def.dropped.is_empty(), "deferred drops: {:?}", def.dropped);
    assert_eq!(plans.len(), 3 + 16 + 1, "{}", show(plans));
    assert_plan(&plans[0], 0, 2.25, 0..=3);
    assert_plan(&plans[1], 1, 5.25, 4..=7);
    assert_plan(&plans[2], 2, 8.25, 8..=11);
    for j in 0..16u64 {
        let p = &plans[3 + j as usize];
        assert_plan(
            p,
            j as u32 % 3,
            13.5 + 3.0 * j as f64,
            15 + 4 * j..=18 + 4 * j,
        );
    }
    assert_plan(&plans[19], 1, 64.25, 79..=79);

    // Compared with the run without the gap: from t >= 25 ms on (and before the final
    // leftover) batches are back at the same steady size.
    let mut full = dispatcher(Policy::Symphony);
    let base = drive(&mut full, &arrivals(80, &[]));
    let steady = base.plans[5].tasks.len();
    assert_eq!(steady, 4);
    let recovered: Vec<usize> = plans
        .iter()
        .filter(|p| p.exec_at >= ms(25.0) && p.exec_at < ms(59.0))
        .map(|p| p.tasks.len())
        .collect();
    assert!(recovered.len() >= 10, "{}", show(plans));
    assert!(recovered.iter().all(|&b| b == steady), "{}", show(plans));

    // Eager on the same arrivals (Figure 5a): dispatching as soon as a GPU is free
    // breaks the pattern into small batches and drops.
    let mut e = dispatcher(Policy::Eager);
    let eager = drive(&mut e, &tasks);
    let in_window = |p: &&Plan| p.exec_at >= ms(11.0) && p.exec_at <= ms(60.0);
    let median = |plans: &[Plan]| {
        let mut b: Vec<usize> = plans
            .iter()
            .filter(in_window)
            .map(|p| p.tasks.len())
            .collect();
        b.sort_unstable();
        b[b.len() / 2]
    };
    let eager_drops = eager
        .dropped
        .iter()
        .filter(|(t, _)| *t >= ms(11.0) && *t <= ms(60.0))
        .count();
    let (med_def, med_eager) = (median(plans), median(&eager.plans));
    eprintln!(
        "eager: {eager_drops} drops in [11, 60] ms, median batch {med_eager}; \
         deferred: 0 drops, median {med_def}"
    );
    assert_eq!(med_def, 4);
    assert!(eager_drops > 0, "eager dropped nothing");
    assert!(med_eager < med_def, "eager median batch {med_eager}");
    assert!(
        eager.plans.len() > plans.len(),
        "eager should run more, smaller batches"
    );
}

// Figure 5a: eager scheduling "starting from R16", i.e. from the GPU state deferred
// scheduling left (GPU 0 free at 11.25, GPU 1 at 14.25, GPU 2 at 17.25; the paper's
// GPUs 1, 2, 3). The eager dispatcher is brought into that state with three
// placeholder requests whose plans the backends report to end at those times.
// Eager, lazy gathering: exec = now; a free GPU takes the batch at once, otherwise
// the earliest-free GPU takes the top-ranked candidate when it becomes free, with the
// largest batch that still fits the head's deadline d (bs = floor(d - t - 5)).
//
// t=11.25 R16 arrives, GPU 0 just became free: R16 alone on GPU 0 -> free 17.25.
// t=14.25 R20 arrives as GPU 1 frees: R17..R20 (R17's d=24, bs 4) on GPU 1 -> 23.25.
// t=17.25 R24 arrives as GPUs 0 and 2 free: R21..R24 (d=27, bs 4) on the lowest id,
//         GPU 0 -> 26.25 (the paper draws it on GPU 3; both are free, Algorithm 1
//         line 19 picks the smallest id).
// t=18    R25 arrives, GPU 2 idle: R25 alone on GPU 2 -> 24.
// t=23.25 GPU 1 frees with R26..R32 queued, but R26's d=30.75 allows bs
//         floor(30.75-23.25-5) = 2: R26, R27 on GPU 1 -> 30.25.
// t=24    GPU 2: R28's d=32.25, bs floor(3.25) = 3: R28..R30 -> 32.
// t=26.25 GPU 0 (R36 arrives at the same moment): R31's d=34.5, bs 3: R31..R33 -> 34.25.
// t=30.25 GPU 1: R34's d=36.75, bs floor(1.5) = 1: R34 alone -> 36.25.
// t=31.5  R35 (d=37.5) can no longer finish even alone before GPU 2 frees at 32: dropped.
// t=32    GPU 2: R36 (d=38.25) alone -> 38.
// t=33, 33.75  R37, R38 dropped (GPU 0 frees only at 34.25).
// t=34.25 GPU 0: R39 (d=40.5) alone -> 40.25.
// From then on every GPU runs single requests and two of every three are dropped:
// "drop R35, R37, R38, and so on".
#[test]
fn figure5a_eager_from_r16_deteriorates() {
    let mut d = dispatcher(Policy::Eager);
    let free = [ms(11.25), ms(14.25), ms(17.25)];
    for (g, &f) in free.iter().enumerate() {
        let t = Task {
            id: TaskId(1000 + g as u64),
            arrival: Time::ZERO,
            deadline: ms(12.0),
            tag: 0,
            cap: 0,
        };
        d.handle_request(Time::ZERO, ModelId(0), t);
        let Some(Output::Dispatch(p)) = d.poll_output() else {
            panic!("eager runs a lone request at once");
        };
        assert_eq!(p.gpu, GpuId(g as u32));
        assert_eq!(d.poll_output(), None);
        d.handle_gpu_report(Time::ZERO, p.gpu, p.id, f);
        assert_eq!(d.gpu_free_at(p.gpu), f);
    }
    let tasks: Vec<Task> = arrivals(80, &[])
        .into_iter()
        .filter(|t| t.id.0 >= 15)
        .collect();
    let tr = drive_from(&mut d, &tasks, free);
    let p = &tr.plans;
    assert!(p.len() >= 11, "{}", show(p));
    assert_plan(&p[0], 0, 11.25, 15..=15);
    assert_plan(&p[1], 1, 14.25, 16..=19);
    assert_plan(&p[2], 0, 17.25, 20..=23);
    assert_plan(&p[3], 2, 18.0, 24..=24);
    assert_plan(&p[4], 1, 23.25, 25..=26);
    assert_plan(&p[5], 2, 24.0, 27..=29);
    assert_plan(&p[6], 0, 26.25, 30..=32);
    assert_plan(&p[7], 1, 30.25, 33..=33);
    assert_plan(&p[8], 2, 32.0, 35..=35);
    assert_plan(&p[9], 0, 34.25, 38..=38);
    assert_plan(&p[10], 1, 36.25, 41..=41);
    // The first drops are R35, R37, R38 (ids 34, 36, 37), then R40, R41.
    let drops: Vec<u64> = tr.dropped.iter().map(|(_, id)| id.0).collect();
    assert_eq!(drops[..5], [34, 36, 37, 39, 40], "drops {:?}", tr.dropped);
    assert!(tr.dropped[0].0 > ms(31.5) && tr.dropped[0].0 < ms(32.0));
    // The pattern never recovers: only single-request batches after t = 30.
    assert!(
        p.iter()
            .filter(|x| x.exec_at >= ms(30.0))
            .all(|x| x.tasks.len() == 1),
        "{}",
        show(p)
    );
    // More than a third of R16..R80 is lost (deferred loses none, see above).
    assert!(
        3 * tr.dropped.len() > tasks.len(),
        "{} drops of {}",
        tr.dropped.len(),
        tasks.len()
    );
}
