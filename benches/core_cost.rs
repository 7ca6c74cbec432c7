//! Scheduling-core cost: wall-clock time the central [`Dispatcher`] spends per
//! request, per dispatched batch, and per idle timer call, so that regressions in
//! `src/core` show up as numbers.
//!
//! ```text
//! cargo bench --bench core_cost                     # full run, well under a minute
//! cargo bench --bench core_cost -- per_request      # one benchmark family
//! ```
//!
//! Under `cargo test --all-targets` cargo runs this binary without `--bench`, and
//! criterion then runs every benchmark once (a smoke test that it still builds and
//! runs).
//!
//! # Setup
//! One dispatcher per cluster size `{M}m_{G}g` (64 models on 1024 GPUs, 100 models on
//! 4096 GPUs): deferred policy with its default (adaptive) gathering, invariant
//! checks off, every model `l(b) = 0.1 ms * b + 1 ms` (max batch 32) with a 5 ms SLO.
//! Requests arrive at a fixed aggregate rate of 1 M/s of virtual time (one every
//! 1 µs), each for a model drawn uniformly at random (so each model sees a thinned,
//! Poisson-like stream of 10-16 k req/s). A plan is taken to finish exactly at its
//! `finish_at`, which the dispatcher already assumes, so no GPU reports are sent.
//! Each dispatcher is driven for 0.3 s of virtual time before measuring (three
//! rate-estimator ticks), which puts it in steady state: batches of about 18-23, no
//! drops, about 150 busy GPUs. The setup prints these figures once per dispatcher.
//!
//! One driver *step* is what a real-time driver does per arrival: run every timer due
//! up to the arrival (`handle_timeout` at each `next_timeout()`), then
//! `handle_request`, draining `poll_output` after every call (plans are dropped,
//! which frees their task vectors).
//!
//! # Benchmarks (group `core`)
//! * `per_request/{M}m_{G}g`: time per step, so per request including the timer work
//!   (gathering, GPU matching, dispatch) that it causes; throughput = requests.
//! * `per_dispatch/{M}m_{G}g`: the same driving, divided by the number of
//!   `Output::Dispatch` produced: the cost of the core per batch; throughput = plans.
//! * `timeout_idle/{M}m_{G}g`: one `handle_timeout(now)` in steady state when no
//!   timer is due (`next_timeout() > now`): the floor of a spurious wake-up.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fermata::core::{
    Dispatcher, DispatcherConfig, Dur, LatencyProfile, ModelId, ModelSpec, Output, Policy, Task,
    TaskId, Time,
};
use std::time::{Duration, Instant};

// The same allocator as the `fermata` binary, so the numbers match the CLI's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// (models, GPUs) of each measured cluster.
const SIZES: [(u32, u32); 2] = [(64, 1024), (100, 4096)];
/// Virtual gap between two requests (aggregate rate 1 M req/s).
const GAP: Dur = Dur(1_000);
/// Virtual time driven before measuring.
const WARMUP: Dur = Dur(300_000_000);
const ALPHA_MS: f64 = 0.1;
const BETA_MS: f64 = 1.0;
const MAX_BATCH: u32 = 32;
const SLO: Dur = Dur(5_000_000);

/// Drives one dispatcher in virtual time, as a real-time driver would.
struct Driver {
    d: Dispatcher,
    models: u64,
    /// Time of the next arrival.
    next_arrival: Time,
    /// Time of the last input (inputs must never go back in time).
    clock: Time,
    next_id: u64,
    rng: u64,
    plans: u64,
    tasks_dispatched: u64,
    drops: u64,
}

impl Driver {
    fn new(models: u32, gpus: u32) -> Driver {
        let policy = Policy::Deferred;
        let mut cfg = DispatcherConfig::new(policy, gpus);
        cfg.gather = policy.default_gather();
        cfg.check_invariants = false;
        let profile = LatencyProfile::linear_ms(ALPHA_MS, BETA_MS, MAX_BATCH).expect("valid");
        let specs = (0..models)
            .map(|i| ModelSpec {
                name: format!("m{i}"),
                profile: profile.clone(),
                slo: SLO,
            })
            .collect();
        Driver {
            d: Dispatcher::new(cfg, specs),
            models: models as u64,
            next_arrival: Time::ZERO,
            clock: Time::ZERO,
            next_id: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
            plans: 0,
            tasks_dispatched: 0,
            drops: 0,
        }
    }

    /// The model of the next request: uniform over models (xorshift64*).
    #[inline]
    fn pick_model(&mut self) -> ModelId {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ModelId((((r >> 32) * self.models) >> 32) as u32)
    }

    #[inline]
    fn drain(&mut self) {
        while let Some(out) = self.d.poll_output() {
            match out {
                Output::Dispatch(p) => {
                    self.plans += 1;
                    self.tasks_dispatched += p.tasks.len() as u64;
                }
                Output::Drop { .. } => self.drops += 1,
                Output::Preempt { .. } => {}
            }
        }
    }

    /// Runs the timers due up to the next arrival, then hands it the request.
    #[inline]
    fn step(&mut self) {
        let t = self.next_arrival;
        self.next_arrival = t + GAP;
        while let Some(due) = self.d.next_timeout() {
            if due > t {
                break;
            }
            // A timer may be due in the past (a GPU that has long been free).
            self.clock = due.max(self.clock);
            self.d.handle_timeout(self.clock);
            self.drain();
        }
        self.clock = t;
        let model = self.pick_model();
        let task = Task {
            id: TaskId(self.next_id),
            arrival: t,
            deadline: t + SLO,
            tag: 0,
            cap: 0,
        };
        self.next_id += 1;
        self.d.handle_request(t, model, task);
        self.drain();
    }

    /// A dispatcher of `models` x `gpus` driven into steady state.
    fn warmed(models: u32, gpus: u32) -> Driver {
        let mut drv = Driver::new(models, gpus);
        // The last third of the warm-up is already steady: report its batches.
        while drv.next_arrival < Time::ZERO + Dur(WARMUP.0 * 2 / 3) {
            drv.step();
        }
        let (plans0, tasks0) = (drv.plans, drv.tasks_dispatched);
        while drv.next_arrival < Time::ZERO + WARMUP {
            drv.step();
        }
        let busy = (0..gpus)
            .filter(|&g| drv.d.gpu_free_at(fermata::core::GpuId(g)) > drv.clock)
            .count();
        let c = drv.d.counters();
        eprintln!(
            "core_cost setup {models}m_{gpus}g: {} requests in {:.1} ms virtual, {} plans, \
             mean batch {:.1} in the last third, {} dropped, {} queued, {busy} GPUs busy \
             at the end",
            c.received,
            (drv.clock - Time::ZERO).as_ms_f64(),
            drv.plans,
            (drv.tasks_dispatched - tasks0) as f64 / (drv.plans - plans0).max(1) as f64,
            drv.drops,
            c.queued,
        );
        drv
    }
}

fn core_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("core");
    for (models, gpus) in SIZES {
        let name = format!("{models}m_{gpus}g");

        g.throughput(Throughput::Elements(1));
        let mut drv = Driver::warmed(models, gpus);
        g.bench_function(format!("per_request/{name}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    drv.step();
                }
                start.elapsed()
            })
        });

        // Keeps driving the same (already warm) dispatcher.
        g.bench_function(format!("per_dispatch/{name}"), |b| {
            b.iter_custom(|iters| {
                let plans0 = drv.plans;
                let start = Instant::now();
                while drv.plans - plans0 < iters {
                    drv.step();
                }
                let elapsed = start.elapsed();
                // The last step may have produced more than one plan.
                let plans = drv.plans - plans0;
                Duration::from_secs_f64(elapsed.as_secs_f64() * iters as f64 / plans as f64)
            })
        });

        // Bring every timer up to date at the next arrival's time; nothing is due
        // after that until a later instant.
        let now = drv.next_arrival;
        while drv.d.next_timeout().is_some_and(|t| t <= now) {
            drv.clock = drv.d.next_timeout().expect("checked").max(drv.clock);
            drv.d.handle_timeout(drv.clock);
            drv.drain();
        }
        drv.d.handle_timeout(now);
        drv.drain();
        assert!(
            drv.d.next_timeout().is_some_and(|t| t > now),
            "steady state has a future timer"
        );
        let plans = drv.plans;
        g.bench_function(format!("timeout_idle/{name}"), |b| {
            b.iter(|| drv.d.handle_timeout(black_box(now)))
        });
        drv.drain();
        assert_eq!(drv.plans, plans, "an idle handle_timeout dispatched a plan");
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = core_cost
}
criterion_main!(benches);
